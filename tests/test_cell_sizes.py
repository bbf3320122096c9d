"""No `#| export` cell of a notebook in nbs/ is longer than LIMIT lines (tools/cell_sizes.py counts them), so that
each exported definition reads next to its prose and its test. A long class is split the fastcore way: its methods
in later cells with `fastcore.basics.patch`, or helpers in their own cells."""
import json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from cell_sizes import export_cells, oversized

LIMIT = 60
# (notebook, first name the cell defines): cells allowed over the limit. RLConfig's cell is its ~75 key
# declarations, which stay in the class (its checks are _check_keys). An entry that is no longer over the limit fails
# the test: remove it.
ALLOWED = {("10a_rl_config", "RLConfig")}

def test_export_cells_at_most_limit():
    rows = oversized(limit=LIMIT)
    over = [f"{nb} cell {i}: {n} lines ({name})" for nb, i, n, name in rows if (nb, name) not in ALLOWED]
    assert not over, f"export cells over {LIMIT} lines (split them; see tools/cell_sizes.py):\n" + "\n".join(over)
    stale = ALLOWED - {(nb, name) for nb, _, _, name in rows}
    assert not stale, f"allowed long cells that are no longer over {LIMIT} lines, drop them from ALLOWED: {sorted(stale)}"

def _nb(path, *sources):
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": s.splitlines(keepends=True)} for i, s in enumerate(sources)]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path

def test_counter(tmp_path):
    body = lambda n: "".join(f"    x{i} = {i}\n" for i in range(n))
    nb = _nb(tmp_path / "x.ipynb", "#| export\ndef f():\n" + body(58),      # 60 lines: at the limit
             "#| export\nclass C:\n" + body(59),                           # 61 lines: over
             "#|export\nY = 1\n" + body(70),                               # a directive without its space
             "#| hide\ndef g():\n" + body(80))                             # not exported
    test_rows = export_cells(nb)
    assert [(i, n, name) for i, n, name in test_rows] == [(0, 60, "f"), (1, 61, "C"), (2, 72, "Y")]
    assert [(i, name) for _, i, _, name in oversized([nb], LIMIT)] == [(2, "Y"), (1, "C")]
