"""Imports of maxpost's own modules inside functions of maxpost/, each without a comment that gives its reason.

    python tools/check_imports.py [maxpost/X.py …]

maxpost imports its own modules at the top of each module, so that the import graph reads from the tops. An import
stays inside a function only with its reason in a comment on its line or on a comment line just above it, a
comment that starts with `circle`, `heavy` or `optional`: `# circle: maxpost.X imports this module`, `# heavy: pulls in flax`. Prints `path:line: import` for every
function-level import of maxpost (`from .x import …`, `from maxpost.x import …`, `import maxpost.x`) without one and
exits 1 if there is any. Standard library only (`ast`, `tokenize`). `tests/test_cell_sizes.py` runs `uncommented`
over maxpost/.
"""
import ast, io, sys, tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def _is_maxpost(node) -> bool:
    "Does this Import / ImportFrom import maxpost or one of its modules?"
    own = lambda name: name == "maxpost" or name.startswith("maxpost.")
    if isinstance(node, ast.ImportFrom): return node.level > 0 or own(node.module or "")
    return any(own(a.name) for a in node.names)

REASONS = ("circle", "heavy", "optional")    # the kinds of reason a comment may give: `# heavy: pulls in flax`

def _comments(src: str) -> dict[int, bool]:
    """line → whether the line is a comment only (True) or code with a trailing comment (False), for lines whose comment
    gives a reason (it starts with one of REASONS)."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT and tok.string.lstrip("# ").startswith(REASONS):
            row, col = tok.start
            out[row] = not tok.line[:col].strip()
    return out

def function_imports(src: str) -> list[ast.stmt]:
    "Imports of maxpost inside a function body (at any depth) of the module source `src`, in line order."
    found = {}
    for fn in ast.walk(ast.parse(src)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)): continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and _is_maxpost(node): found[node.lineno] = node
    return [found[k] for k in sorted(found)]

def uncommented(paths=None) -> list[tuple[str, int, str]]:
    """[(path, line, import)] for the function-level imports of maxpost in `paths` (default: maxpost/**/*.py) with no
    comment on any of their lines nor a comment-only line just above."""
    paths = paths or sorted((ROOT / "maxpost").rglob("*.py"))
    rows = []
    for p in paths:
        src = Path(p).read_text()
        notes, lines = _comments(src), src.splitlines()
        for node in function_imports(src):
            span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            if any(l in notes for l in span) or notes.get(node.lineno - 1) is True: continue
            name = Path(p).resolve().relative_to(ROOT) if Path(p).resolve().is_relative_to(ROOT) else Path(p)
            rows.append((str(name), node.lineno, lines[node.lineno - 1].strip()))
    return rows

if __name__ == "__main__":
    rows = uncommented([Path(a) for a in sys.argv[1:]] or None)
    for path, line, text in rows: print(f"{path}:{line}: {text}")
    if rows: print(f"{len(rows)} function-level import(s) of maxpost without a reason: move them to the module's top "
                   "or say why not in a comment (see tools/check_imports.py)", file=sys.stderr)
    sys.exit(1 if rows else 0)
