"""Shared fixtures: the two embedded real models as HF folders (fetched once into $MAXPOST_CACHE and reused)."""
import json, os, sys, time
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]

# Every temporary file of the session goes under one fresh folder, removed at the end: the notebooks, the tutorials and
# the CLI runs write checkpoints and HF folders with `tempfile` and leave them (a tutorial keeps its work folder for
# its reader): several GB a run (the demo notebook's alone is 1.8 GB), and a CI run on a disk with less free failed. TMPDIR is what this process's
# `tempfile` and every subprocess's use; `private_tmp` gives a subprocess a folder of its own, removed when it ends.
import atexit, shutil, tempfile
_SESSION_TMP = tempfile.mkdtemp(prefix="maxpost-test-")
atexit.register(shutil.rmtree, _SESSION_TMP, ignore_errors=True)
os.environ["TMPDIR"] = tempfile.tempdir = _SESSION_TMP

_FREE: list = [shutil.disk_usage(_SESSION_TMP).free]     # free bytes on the temporary folder's disk: start, then lowest

def _mem_available() -> int:
    "MemAvailable of /proc/meminfo, bytes (0 where there is none)."
    try: return 1024 * int(next(l for l in open("/proc/meminfo") if l.startswith("MemAvailable")).split()[1])
    except (OSError, StopIteration, ValueError): return 0

_MEM: list = [_mem_available()]                          # the machine's available memory: start, then lowest

def _watch_free():
    while True:
        time.sleep(5)
        try: _FREE.append(min(_FREE[-1], shutil.disk_usage(_SESSION_TMP).free))
        except OSError: return                 # the folder is gone: the session is ending
        del _FREE[1:-1]
        _MEM.append(min(_MEM[-1], _mem_available())); del _MEM[1:-1]

import threading; threading.Thread(target=_watch_free, daemon=True).start()

def private_tmp(name: str) -> Path:
    "A fresh folder under the session's temporary folder, for one subprocess's TMPDIR; the caller removes it."
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_SESSION_TMP))

# One persistent XLA compilation cache for the session, in a fresh folder removed at the end: the notebooks, the docs
# build and the CLI runs are separate processes that compile many of the same programs (the same tiny models, and
# every eager jnp op). Entries are keyed by the program's HLO, the compile options and flags (XLA_FLAGS included), the
# backend and the jax/jaxlib versions, so a hit is the executable the compiler would have built. Every program is
# kept (min compile time 0: most of these compile in under the default 1 s). A cache dir set outside wins.
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _XLA_CACHE = tempfile.mkdtemp(prefix="maxpost-xla-cache-")
    atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

def xla_cache(tmp: Path) -> str:
    "The compilation cache for a test's subprocesses: the session's, else one under the test's `tmp`."
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp / "xla_cache")

def cli_env(tmp: Path, devices: int | None = None, xla_flags: str = "", **extra) -> dict:
    """The environment of a test's CLI subprocess: this process's, the compilation cache (`xla_cache`: later runs of the
    same program skip the CPU compile), `devices` host CPU devices when given (XLA_FLAGS replaced), `xla_flags`
    appended to XLA_FLAGS, then `extra`."""
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=xla_cache(tmp), **extra)
    if devices: env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    if xla_flags: env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    return env

# A command on a tiny preset (`model_name=tiny-…`) compiles far more than it computes: its programs run for
# milliseconds. Its subprocess gets LLVM at -O0 (as the notebooks' processes, tests/test_notebooks.py), which only
# makes the CPU backend's generated code less optimized. Measured on the 2-core EPYC (session 28, four tiny-llama RL
# CLI tests of test_rl.py, each with a fresh compilation cache): 168 → 127 CPU s. Real models keep the default: their
# decode loops run long enough that -O0 costs more than it saves (test_convert's KV-cache checks: 58 → 70 CPU s).
# MAXPOST_TINY_XLA_OPT sets the level ("": the compiler's default, as before).
_TINY_OPT = os.environ.get("MAXPOST_TINY_XLA_OPT", "0")
O0 = f"--xla_backend_optimization_level={_TINY_OPT}"

def compile_cheaply(cmd, env: dict | None) -> dict | None:
    "`env` with O0 added to XLA_FLAGS when `cmd` names a tiny preset (`model_name=tiny-…`); else `env` unchanged."
    if not _TINY_OPT or not any(str(a).startswith("model_name=tiny-") for a in cmd): return env
    env = dict(os.environ if env is None else env)
    if O0 not in env.get("XLA_FLAGS", ""): env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {O0}".strip()
    return env

def last_json(stdout: str) -> dict:
    "The last line of a command's stdout (the CLIs' summary), parsed as JSON."
    return json.loads(stdout.strip().splitlines()[-1])

def run_json(cmd, env, timeout=600) -> dict:
    "Run `cmd` in the repo root, assert it exited 0 (else show the tails of its output) and return `last_json`."
    import subprocess
    r = subprocess.run([str(a) for a in cmd], capture_output=True, text=True, env=compile_cheaply(cmd, env), cwd=ROOT,
                       timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return last_json(r.stdout)

def read_metrics(run_dir) -> list[dict]:
    "The records of a run's metrics.jsonl."
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]

def run_module(module, *args, timeout=900, check=True, env=None):
    "Run `python -m module key=value…` in a subprocess; returns CompletedProcess (stdout+stderr captured)."
    import subprocess
    e = compile_cheaply(args, dict(os.environ, **(env or {})))
    r = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=e, cwd=ROOT)
    if check and r.returncode != 0:
        raise AssertionError(f"{module} exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}")
    return r

def _cpu_jiffies() -> tuple[int, int]:
    "(idle, total) jiffies of the machine's CPUs since boot, from /proc/stat ((0, 0) where there is none)."
    try: f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError): return 0, 0
    return f[3] + f[4], sum(f[:8])                         # idle + iowait; user … steal

IDLE: dict = {}            # test id → (idle core-seconds, wall seconds) while it ran (setup, call and teardown)
CPU_BY_TEST: dict = {}     # test id → (CPU seconds of pytest's process and its reaped subprocesses, start, end)

def _cpu_seconds() -> float:
    "User + system seconds of this process and of its children that were waited for."
    import resource
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Where the machine's cores sat idle: each test's idle core-seconds (the terminal summary lists the largest; a
    test that leaves a core idle for long is where work could overlap). And what each test cost: its CPU seconds,
    subprocesses included (the test budget is CPU-bound: cuts are chosen by this list, not by wall times)."""
    (i0, t0), w0, c0 = _cpu_jiffies(), time.perf_counter(), _cpu_seconds()
    yield
    (i1, t1), w1, c1 = _cpu_jiffies(), time.perf_counter(), _cpu_seconds()
    if t1 > t0: IDLE[item.nodeid] = ((i1 - i0) / (t1 - t0) * (os.cpu_count() or 1) * (w1 - w0), w1 - w0)
    CPU_BY_TEST[item.nodeid] = (c1 - c0, w0, w1)

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call": item._maxpost_passed = outcome.get_result().passed

@pytest.fixture(autouse=True)
def _drop_passed_tmp_path(request):
    "A passed test's `tmp_path` is removed when it ends (a CLI test's run folders reach 1 GB); a failed one's stays."
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp is not None and getattr(request.node, "_maxpost_passed", False): shutil.rmtree(tmp, ignore_errors=True)

def _module(item) -> str:
    return item.module.__name__.rpartition(".")[2]

FIRST, LAST = ("test_vllm",), ("test_notebooks",)

def pytest_collection_modifyitems(session, config, items):
    """The vLLM tests run first and the notebooks' tests last. The vLLM tests leave a core idle for about two minutes
    in all (an engine's start-up is mostly one thread). Run first, they overlap the docs build that starts with the
    session; at the end, where they ran until session 24, nothing was left to fill those cores. Until the notebooks'
    tests come, the notebooks' processes fill idle cores beside the other tests (test_notebooks)."""
    rank = lambda it: 0 if _module(it) in FIRST else 2 if _module(it) in LAST else 1
    items[:] = sorted(items, key=rank)             # stable: pytest's order within each group

def pytest_collection_finish(session):
    """When a selected test reads the full docs site, its build starts now, in the background (test_docs.start_site_build);
    when notebooks are selected, their feeder starts too, and waits for the build to end (test_notebooks.start_feeder)."""
    if session.config.option.collectonly: return
    build = []
    for it in session.items:
        if "site" in getattr(it, "fixturenames", ()) and _module(it) == "test_docs":
            build.append(it.module.start_site_build()["p"]); break
    nb = next((it.module for it in session.items if _module(it) == "test_notebooks"), None)
    if nb is not None: nb.start_feeder(session, after=build)

_ON_TPU: list = []

def tpu_tests_run() -> bool:
    "Whether `tpu`-marked tests run here: JAX's backend is a TPU, or MAXPOST_TPU_TESTS_ON_CPU=1 asks for a CPU dry run."
    if os.environ.get("MAXPOST_TPU_TESTS_ON_CPU") == "1": return True
    if not _ON_TPU:                       # JAX starts its backend only when a `tpu` test is about to run, once
        import jax
        _ON_TPU.append(jax.default_backend() == "tpu")
    return _ON_TPU[0]

def pytest_runtest_setup(item):
    if item.get_closest_marker("tpu") is not None and not tpu_tests_run():
        pytest.skip("needs a TPU (JAX's backend here is not one); MAXPOST_TPU_TESTS_ON_CPU=1 runs it on the CPU")

@pytest.fixture(scope="session")
def hf_smol():
    from maxpost.convert.from_gguf import embedded_hf
    return embedded_hf("smollm2-135m")

@pytest.fixture(scope="session")
def hf_gemma():
    from maxpost.convert.from_gguf import embedded_hf
    return embedded_hf("gemma3-270m")

def kill_at(cmd, env, ckpt: Path, timeout: float, cheap: bool = True):
    """Start `cmd`, SIGKILL it the moment `ckpt` (a checkpoint folder) exists; asserts that the kill ended it.
    cheap: `compile_cheaply`, the flags of the CLI runs it is compared with (`run_json`); False when it is compared with
    runs in this process, which compile with the default flags (bitwise comparisons need the same code)."""
    import signal, subprocess, time
    p = subprocess.Popen(cmd, env=compile_cheaply(cmd, env) if cheap else env, cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not ckpt.exists() and p.poll() is None and time.time() - t0 < timeout: time.sleep(0.01)
    p.send_signal(signal.SIGKILL); p.wait()
    assert p.returncode == -signal.SIGKILL, f"run ended by itself before the kill: {p.stderr.read()[-2000:]}"

def pytest_terminal_summary(terminalreporter):
    """The notebooks' own wall and CPU times (their tests overlap, so --durations shows only each one's wait, and a wall
    time includes the overlap), by CPU time, and the session's total CPU time against its wall time."""
    mod = sys.modules.get("test_notebooks") or sys.modules.get("tests.test_notebooks")
    secs, cpu = getattr(mod, "SECONDS", None), getattr(mod, "CPU", {})
    if secs:
        terminalreporter.section("notebook processes, by CPU time (all; seconds)")
        for stem, c in sorted(cpu.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"cpu {c:7.1f}s  wall {secs[stem]:7.1f}s  {stem}")
        terminalreporter.write_line(f"notebooks: cpu {sum(cpu.values()):.0f}s")
    import resource
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    terminalreporter.write_line(f"session: cpu {me.ru_utime + me.ru_stime:.0f}s in pytest's process, "
                                f"{ch.ru_utime + ch.ru_stime:.0f}s in its subprocesses")
    if CPU_BY_TEST:
        # a notebook process the feeder reaped while another test ran joined that test's children: take its CPU out
        reaped, nb_cpu = getattr(mod, "REAPED", {}), cpu or {}
        own = {}
        for k, (c, a, b) in CPU_BY_TEST.items():
            if "test_notebooks.py" in k: continue
            own[k] = c - sum(nb_cpu.get(stem, 0.0) for stem, t in reaped.items() if a <= t < b)
            own[k] -= sum(x for _, t, x in getattr(mod, "OTHER_REAPED", []) if a <= t < b)
        terminalreporter.section("CPU seconds by test, subprocesses included (largest 40; notebooks above)")
        for what, _, x in getattr(mod, "OTHER_REAPED", []):
            terminalreporter.write_line(f"cpu {x:7.1f}s  {what} (reaped by the notebooks' feeder; not in a test's line)")
        for k, c in sorted(own.items(), key=lambda kv: -kv[1])[:40]:
            terminalreporter.write_line(f"cpu {c:7.1f}s  wall {CPU_BY_TEST[k][2] - CPU_BY_TEST[k][1]:7.1f}s  {k}")
        by_file = {}
        for k, c in own.items(): by_file[k.split("::")[0]] = by_file.get(k.split("::")[0], 0.0) + c
        terminalreporter.write_line("by file: " + ", ".join(f"{f.rpartition('/')[2]} {c:.0f}s"
                                                             for f, c in sorted(by_file.items(), key=lambda kv: -kv[1])))
    if IDLE:
        idle, wall = sum(v[0] for v in IDLE.values()), sum(v[1] for v in IDLE.values())
        terminalreporter.section("idle cores while each test ran (largest 25; core-seconds)")
        for k, (i, w) in sorted(IDLE.items(), key=lambda kv: -kv[1][0])[:25]:
            terminalreporter.write_line(f"idle {i:7.1f}  wall {w:7.1f}s  {k}")
        terminalreporter.write_line(f"tests: {idle:.0f} idle core-seconds of {wall * (os.cpu_count() or 1):.0f} "
                                    f"({os.cpu_count()} cores × {wall:.0f} s)")
    used = sum(f.stat().st_size for f in Path(_SESSION_TMP).rglob("*") if f.is_file())
    terminalreporter.write_line(f"disk: {_FREE[0] / 2**30:.1f} GiB free at the start, {min(_FREE) / 2**30:.1f} GiB at "
                                f"the lowest (5 s samples); {used / 2**30:.2f} GiB left in the session's temporary "
                                f"folder at its end (removed on exit)")
    terminalreporter.write_line(f"memory: {_MEM[0] / 2**30:.1f} GiB available at the start, {min(_MEM) / 2**30:.1f} GiB "
                                f"at the lowest (5 s samples)")

TOOL_DIGITS = """
def digits(prompts, completions, **kw):
    "A graded reward that a barely trained model already earns sometimes: the share of digits in the final turn (of 4)."
    return [min(sum(ch.isdigit() for ch in c), 4) / 4 for c in completions]
"""

@pytest.fixture(scope="session")
def tool_ckpt(tmp_path_factory):
    """(checkpoint, reward file) for multi-turn tool RL on `dataset_type=multiplication`: the tiny llama after 20 SFT steps
    on calculator episodes (maxpost.rl.tool_task.warm_start), enough that about 2 in 3 of its sampled episodes call the
    calculator (a second turn), mostly with a malformed call; `digits`, a graded reward it earns sometimes."""
    from maxpost.checkpoint import save_checkpoint
    from maxpost.model import model_config
    from maxpost.rl.tool_task import multiplication_split, warm_start
    d = tmp_path_factory.mktemp("tool_sft")
    params = warm_start(multiplication_split(2000, 300, 2, 0)[0], steps=0, call_steps=20, batch=16, T=64)
    (d / "digits.py").write_text(TOOL_DIGITS)
    return save_checkpoint(d / "tiny", params, model_config("tiny-llama"), model_name="tiny-llama"), d / "digits.py"

def run_together(*jobs, timeout: float = 600) -> list:
    """Start every `(cmd, env)` of `jobs` at once in the repo root and wait for all: their `CompletedProcess`es (text
    output), in order. For a test's independent runs (a reference and a variant writing different run folders, and
    different programs, so neither would hit the other's compilation cache): much of each is single-threaded (XLA's
    compiles, Python), so together they use a 2-core machine's second core. Any failure to finish kills them all."""
    import subprocess, tempfile
    procs = []
    try:
        for cmd, env in jobs:
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            procs.append((cmd, subprocess.Popen([str(a) for a in cmd], stdout=out, stderr=err, env=compile_cheaply(cmd, env),
                                                cwd=ROOT), out, err))
        t_end, res = time.time() + timeout, []
        for cmd, p, out, err in procs:
            p.wait(timeout=max(1.0, t_end - time.time()))
            text = [(f.seek(0), f.read().decode(errors="replace"))[1] for f in (out, err)]
            res.append(subprocess.CompletedProcess(cmd, p.returncode, *text))
        return res
    finally:
        for _, p, out, err in procs:
            if p.poll() is None: p.kill(); p.wait()
            out.close(); err.close()
