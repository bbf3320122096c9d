"""Lines of each `#| export` (`exports`, `exporti`) cell of the notebooks in nbs/ (the project keeps them at ~60 or fewer).

    python tools/cell_sizes.py [--limit 60] [nbs/X.ipynb …]

Prints every export cell longer than `--limit` lines (notebook, cell index, lines, first definition), longest first,
and exits 1 if there is any. Lines are the cell's source lines, blank lines and the `#|` directives included, the
way the cell reads in the notebook. `tests/test_cell_sizes.py` runs `oversized` over nbs/.
"""
import argparse, json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_EXPORT = re.compile(r'^\s*#\|\s*export[si]?(\s|$)')       # export, exports, exporti, with or without a module
_DEF = re.compile(r'^(?:async\s+def|def|class)\s+(\w+)|^(\w+)\s*(?::[^=]*)?=')

def export_cells(nb_path) -> list[tuple[int, int, str]]:
    "[(cell index, lines, first top-level name defined)] for each export cell of the notebook at `nb_path`."
    cells = json.loads(Path(nb_path).read_text())['cells']
    out = []
    for i, c in enumerate(cells):
        if c['cell_type'] != 'code': continue
        src = ''.join(c['source']).splitlines()
        if not any(_EXPORT.match(l) for l in src if l.lstrip().startswith('#|')): continue
        names = [m.group(1) or m.group(2) for l in src if (m := _DEF.match(l))]
        out.append((i, len(src), names[0] if names else ''))
    return out

def oversized(paths=None, limit: int = 60) -> list[tuple[str, int, int, str]]:
    "[(notebook, cell index, lines, name)] for export cells over `limit` lines, longest first."
    paths = paths or sorted(p for p in (ROOT / 'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)
    rows = [(Path(p).stem, i, n, name) for p in paths for i, n, name in export_cells(p) if n > limit]
    return sorted(rows, key=lambda r: -r[2])

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('nbs', nargs='*')
    ap.add_argument('--limit', type=int, default=60)
    a = ap.parse_args()
    rows = oversized(a.nbs, a.limit)
    for nb, i, n, name in rows: print(f'{nb:24s} cell {i:3d}  {n:4d} lines  {name}')
    print(f'{len(rows)} export cell(s) over {a.limit} lines')
    sys.exit(1 if rows else 0)
