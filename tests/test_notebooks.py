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
in float32 (06c, 09b) state bounds that hold at both levels."""
import atexit, os, resource, shutil, subprocess, sys, tempfile, time
from pathlib import Path
import pytest
from conftest import private_tmp

NBS = sorted(p for p in (Path(__file__).resolve().parents[1] / "nbs").rglob("*.ipynb")
             if not any(part.startswith((".", "_")) for part in p.relative_to(p.parents[1]).parts)
             and p.parent.name != "tutorials")

RUN = ("import sys; from nbdev.test import test_nb; "
       "ok, _ = test_nb(sys.argv[1], skip_flags=['slow', 'gpu'], force_flags=['slow'], cell_timeout=1800); "
       "sys.exit(0 if ok else 1)")
JOBS = max(1, int(os.environ.get("MAXPOST_NB_JOBS", "2")))
OPT = os.environ.get("MAXPOST_NB_XLA_OPT", "0")
TIMEOUT = 3600
_procs: dict = {}          # notebook path → (Popen, stderr file, start time, its TMPDIR, removed when it ends)
SECONDS: dict = {}         # notebook stem → its process's wall time (conftest's terminal summary lists them)
CPU: dict = {}             # notebook stem → its process's CPU seconds (user + system, its waited-for children included)

def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def _start(nb: Path):
    if nb not in _procs:
        err, tmp = tempfile.TemporaryFile(), private_tmp(nb.stem)
        env = dict(os.environ, TMPDIR=str(tmp))
        if OPT: env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_backend_optimization_level={OPT}".strip()
        _procs[nb] = (subprocess.Popen([sys.executable, "-c", RUN, str(nb)], stdout=subprocess.DEVNULL, stderr=err,
                                       env=env), err, time.perf_counter(), tmp)

@atexit.register
def _stop_prefetched():
    "An interrupted session leaves no notebook process behind."
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
    p, err, t0, tmp = _procs.pop(nb)
    c0 = _child_cpu()                    # only this process is reaped in between: the difference is its CPU time
    try: rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired: p.kill(); p.wait(); rc = f"killed after {TIMEOUT} s"
    SECONDS[nb.stem], CPU[nb.stem] = time.perf_counter() - t0, _child_cpu() - c0
    shutil.rmtree(tmp, ignore_errors=True)   # what the notebook left in its temporary folder (checkpoints, HF folders)
    err.seek(0); tail = err.read()[-6000:].decode(errors="replace"); err.close()
    assert rc == 0, f"{nb.name} failed ({rc}):\n{tail}"
