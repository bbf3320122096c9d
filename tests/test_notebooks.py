"""Each notebook in nbs/ runs as one pytest test (slow cells included, gpu cells skipped), as `nbdev-test` would,
each in its own process so that no JAX state leaks from one notebook into the next.

The tutorials (nbs/tutorials/) are not run here: tests/test_docs.py builds the site with every tutorial executed
(`tools/build_docs.py --execute 'tutorials/*'`), which fails naming the notebook and the cell, so running them here
too would pay for each tutorial twice."""
import subprocess, sys
from pathlib import Path
import pytest

NBS = sorted(p for p in (Path(__file__).resolve().parents[1] / "nbs").rglob("*.ipynb")
             if not any(part.startswith((".", "_")) for part in p.relative_to(p.parents[1]).parts)
             and p.parent.name != "tutorials")

RUN = ("import sys; from nbdev.test import test_nb; "
       "ok, _ = test_nb(sys.argv[1], skip_flags=['slow', 'gpu'], force_flags=['slow'], cell_timeout=1800); "
       "sys.exit(0 if ok else 1)")

@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_notebook(nb):
    r = subprocess.run([sys.executable, "-c", RUN, str(nb)], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, f"{nb.name} failed:\n{r.stderr[-6000:]}"
