"""Wall time of each code cell of a notebook, run the way `make test` runs it (tests/test_notebooks.py: nbdev's
`test_nb` with `slow` cells forced, `gpu` cells skipped, `#| eval: false` and export-only cells left out).

    PYTHONPATH=$PWD .venv/bin/python tools/cell_times.py nbs/08b_evaluate.ipynb [more.ipynb …] [--top 10]

Prints, per notebook, each executed cell (index in the notebook, seconds, share of the notebook, first code line),
then the total; `--top N` lists only the N slowest cells. Cells run in one process, in order, as in `test_nb`
(nbdev's own cell filter and execnb's shell), so the times are those `make test` pays, give or take the machine's
noise: compare cells with each other, or one cell before/after a change measured back to back.
"""
import argparse, os, sys, time
from pathlib import Path

def _label(cell) -> str:
    lines = [l for l in cell.source.splitlines() if l.strip() and not l.lstrip().startswith('#|')]
    return (lines[0] if lines else '').strip()[:90]

def cell_times(fn, skip_flags=('gpu',), force_flags=('slow',)) -> tuple[bool, list[tuple[int, float, str]]]:
    "Run notebook `fn` as test_nb does; (ok, [(cell index, seconds, first code line)] for each executed cell)."
    from fastcore.xtras import working_directory
    from execnb.shell import CaptureShell
    from nbdev.process import NBProcessor
    from nbdev.test import _skip_cell
    fn = Path(fn).resolve()
    os.environ['IN_TEST'] = '1'
    nb = NBProcessor(fn, rm_directives=False, process=True).nb
    skip = _skip_cell(nb, list(skip_flags), list(force_flags))
    index = {id(c): i for i, c in enumerate(nb.cells)}
    rows, t0 = [], [0.0]
    def pre(cell):
        if skip(cell): return True
        t0[0] = time.perf_counter(); return False
    def post(cell): rows.append((index[id(cell)], time.perf_counter() - t0[0], _label(cell)))
    k = CaptureShell(fn)
    ok = True
    with working_directory(fn.parent):
        try: k.run_all(nb, exc_stop=True, preproc=pre, postproc=post)
        except Exception:
            ok = False
            sys.stderr.write((k.prettytb(fname=fn) or '') + '\n')
    return ok, rows

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('notebooks', nargs='+')
    ap.add_argument('--top', type=int, default=0, help='show only the N slowest cells')
    a = ap.parse_args(argv)
    if len(a.notebooks) > 1:              # one process per notebook, as tests/test_notebooks.py: no shared jit cache
        import subprocess
        top = ['--top', str(a.top)] if a.top else []
        return max(subprocess.run([sys.executable, __file__, nb, *top]).returncode for nb in a.notebooks)
    bad = 0
    for nb in a.notebooks:
        t = time.perf_counter()
        ok, rows = cell_times(nb)
        total = time.perf_counter() - t
        shown = sorted(rows, key=lambda r: -r[1])[:a.top] if a.top else rows
        print(f'== {nb}: {total:.1f} s total (shell start-up and imports included){"" if ok else "  FAILED"}')
        for i, s, label in shown: print(f'  [{i:3d}] {s:7.1f} s {100 * s / total:5.1f}%  {label}')
        bad += not ok
    return 1 if bad else 0

if __name__ == '__main__': sys.exit(main())
