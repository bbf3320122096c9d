"""Each notebook in nbs/ runs as one pytest test (slow cells included, gpu cells skipped), as `nbdev-test` would,
each in its own process so that no JAX state leaks from one notebook into the next.

The tutorials (nbs/tutorials/) are not run here: tests/test_docs.py builds the site with every tutorial executed
(`tools/build_docs.py --execute 'tutorials/*'`), which fails naming the notebook and the cell, so running them here
too would pay for each tutorial twice.

The notebooks' processes are pipelined: while the test of one notebook waits for its process, the processes of the
next `MAXPOST_NB_JOBS - 1` selected notebooks (default 1) already run. Each notebook still gets its own process and
its own pass/fail; only the waiting overlaps. Since the processes overlap, a notebook's wall time says little of
its cost; the terminal summary lists each one's CPU seconds too (its own and its subprocesses'). Much of a notebook's time is spent in one thread (XLA's compiles,
Python between small programs), so two at a time use a 2-core machine's second core. `MAXPOST_NB_JOBS=1` runs them
one after another, as before. No notebook's test asserts a wall time, apart from 07c's one-second bound on a regex
that must not backtrack (its normal time is milliseconds).

The notebooks' processes compile with XLA's CPU backend at optimization level 0 (LLVM's, `MAXPOST_NB_XLA_OPT`,
default "0"; empty: the compiler's default, level 2). Most of a notebook's CPU time is compiling small programs that
then run for milliseconds; at level 0 the 64 notebooks took 1,561 CPU seconds, against 1,887 in session 21's
clean-clone run at level 2 (not side by side; benchmarks/RESULTS.md, session 22). Only the backend's code generation
is less optimized; float32 results can differ in the last bits, so the two notebook checks that compare two programs
in float32 (06c, 09b) state bounds that hold at both levels.

The notebooks also fill the cores the other tests leave idle (about a fifth of the session's core-seconds in session
22's clean clone: vLLM's start, single-threaded subprocesses, waits on two-process runs). conftest moves the notebooks'
tests to the end of the session and, once the docs build it starts in the background has ended, calls
`start_feeder`: a thread that keeps `MAXPOST_NB_BACKGROUND` notebook processes (default 1; 0: none) running beside the
other tests, in the notebooks' test order. Each notebook's test then only waits for its process, or starts it; the
ones the feeder did not reach run `MAXPOST_NB_JOBS` at a time as above. A process's CPU seconds are its own report
(resource usage of itself and its children, printed to stderr as it exits), since several now end while pytest waits
for something else."""
import atexit, os, re, shutil, subprocess, sys, tempfile, threading, time
from pathlib import Path
import pytest
from conftest import private_tmp

NBS = sorted(p for p in (Path(__file__).resolve().parents[1] / "nbs").rglob("*.ipynb")
             if not any(part.startswith((".", "_")) for part in p.relative_to(p.parents[1]).parts)
             and p.parent.name != "tutorials")

RUN = ("import resource, sys; from nbdev.test import test_nb; "
       "ok, _ = test_nb(sys.argv[1], skip_flags=['slow', 'gpu'], force_flags=['slow'], cell_timeout=1800); "
       "r = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]; "
       "print('\\nMAXPOST_NB_CPU', sum(x.ru_utime + x.ru_stime for x in r), file=sys.stderr); "
       "sys.exit(0 if ok else 1)")
JOBS = max(1, int(os.environ.get("MAXPOST_NB_JOBS", "2")))
BACKGROUND = max(0, int(os.environ.get("MAXPOST_NB_BACKGROUND", "1")))
OPT = os.environ.get("MAXPOST_NB_XLA_OPT", "0")
TIMEOUT = 3600
_procs: dict = {}          # notebook path → (Popen, stderr file, start time, its TMPDIR, removed when it ends)
_started: set = set()      # every notebook whose process was started (it is started once)
_ended: dict = {}          # notebook path → perf_counter() when the feeder saw its process end
_lock, _stop = threading.Lock(), threading.Event()
REAPED: dict = {}          # notebook stem → perf_counter() when its process was reaped (its CPU then joins pytest's
                           # children's: conftest takes it out of the test that was running)
OTHER_REAPED: list = []    # (what, perf_counter(), its CPU seconds) of the `after` processes the feeder reaped

def _children_cpu() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

SECONDS: dict = {}         # notebook stem → its process's wall time (conftest's terminal summary lists them)
CPU: dict = {}             # notebook stem → its process's CPU seconds (user + system, its waited-for children included)

def _start(nb: Path):
    with _lock:
        if nb in _started or _stop.is_set(): return
        err, tmp = tempfile.TemporaryFile(), private_tmp(nb.stem)
        env = dict(os.environ, TMPDIR=str(tmp))
        if OPT: env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_backend_optimization_level={OPT}".strip()
        _procs[nb] = (subprocess.Popen([sys.executable, "-c", RUN, str(nb)], stdout=subprocess.DEVNULL, stderr=err,
                                       env=env), err, time.perf_counter(), tmp)
        _started.add(nb)

def _running() -> list:
    "The started notebook processes that have not ended; records when each ended one did (for its wall time)."
    with _lock:
        live = []
        for nb, (p, *_) in list(_procs.items()):
            if p.poll() is None: live.append(nb)
            else: REAPED.setdefault(nb.stem, _ended.setdefault(nb, time.perf_counter()))
        return live

def _feed(order: list, after: list):
    "The feeder's thread: once every process of `after` has ended, keep BACKGROUND notebooks of `order` running."
    live = list(after)
    while live and not _stop.is_set():
        for p in list(live):
            c0 = _children_cpu()
            if p.poll() is None: continue
            live.remove(p)
            if (c := _children_cpu() - c0) > 0: OTHER_REAPED.append(("the docs build", time.perf_counter(), c))
        time.sleep(1)
    todo = list(order)
    while not _stop.is_set() and (todo or _running()):
        todo = [nb for nb in todo if nb not in _started]
        if todo and len(_running()) < BACKGROUND: _start(todo.pop(0))
        else: time.sleep(0.5)

def start_feeder(session, after: list = ()):
    "Start the feeder (conftest calls this when the tests are collected), after the processes `after` (the docs build)."
    order = _selected(session)
    if BACKGROUND and order: threading.Thread(target=_feed, args=(order, list(after)), daemon=True).start()

@atexit.register
def _stop_prefetched():
    "An interrupted session leaves no notebook process behind."
    _stop.set()
    with _lock:
        for p, *_ in _procs.values(): p.kill()

def _selected(session) -> list:
    "The notebooks of this session's selected test_notebook items, in the order pytest runs them."
    return [it.callspec.params["nb"] for it in session.items
            if getattr(it, "originalname", "") == "test_notebook" and hasattr(it, "callspec")]

@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_notebook(nb, request):
    order = _selected(request.session)
    i = order.index(nb) if nb in order else 0
    for nxt in [nb, *order[i + 1:i + JOBS]]: _start(nxt)
    p, err, t0, tmp = _procs[nb]
    try: rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired: p.kill(); p.wait(); rc = f"killed after {TIMEOUT} s"
    with _lock: _procs.pop(nb); t1 = _ended.pop(nb, time.perf_counter())
    shutil.rmtree(tmp, ignore_errors=True)   # what the notebook left in its temporary folder (checkpoints, HF folders)
    err.seek(0); text = err.read().decode(errors="replace"); err.close()
    cpu = re.findall(r"^MAXPOST_NB_CPU (\S+)$", text, re.M)
    SECONDS[nb.stem] = t1 - t0
    if cpu: CPU[nb.stem] = float(cpu[-1])
    assert rc == 0, f"{nb.name} failed ({rc}):\n{text[-6000:]}"
