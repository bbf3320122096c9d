#!/usr/bin/env python3
"""Run the notebooks' own tests on whatever JAX backend is present (a TPU, a GPU, or the CPU), one process per notebook.

    python tools/tpu_notebooks.py OUT [NOTEBOOK ...] [--timeout S] [--archive FILE.tar.gz] [--list]

NOTEBOOK: a name (`01_model`), a file name or a path; none: every notebook in nbs/ (the tutorials excepted). The cells
that run are those `nbdev-test` runs by default: code cells without a `#| slow` or `#| gpu` flag and without
`#| eval: false`, in order, in one namespace, with the notebook's folder as the working directory and IN_TEST=1. No
network and no embedded model is needed (those are in `#| slow` cells), and neither is nbdev: the notebooks are read as
JSON. The repository root goes first on sys.path, so the package under test is this checkout's.

Writes, under OUT:
- `<notebook>.log`: every cell's output, a `@@cell <notebook> <index>` line before each cell, the traceback at the end;
- `summary.json`: the backend and versions, then per notebook: status (`passed`, `failed`, `missing-module`,
  `timeout`), seconds, cells run, the first failure (cell index, line, the failing source line, exception type and
  message), and which of torch / transformers / datasets / ... the run imported (directly or through maxpost), next
  to those that the run's cells import by name;
- with --archive, the same files in one .tar.gz (the device machine hands back at most 8 files).

Exit status 0 when every notebook passed, 1 otherwise. On a TPU, JAX's default matmul precision applies, which is the
point: a notebook's tolerance must hold there (see DEVELOPERS.md, "Precision").
"""
from __future__ import annotations
import argparse, json, os, re, subprocess, sys, time, traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
WATCH = ("torch", "transformers", "datasets", "tunix", "qwix", "vllm", "math_verify", "matplotlib", "pandas", "gguf",
         "tokenizers", "orbax")                     # optional or heavy imports worth knowing about on a bare machine
SKIP_FLAGS = ("slow", "gpu")
_DIRECTIVE = re.compile(r"^\s*#\s*\|\s*(.*?)\s*$")
_IMPORT = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_][\w\.]*)", re.M)


def directives(source: str) -> dict:
    "The `#| name [value]` lines at the top of a cell, as name -> value ('' when none); names keep a trailing ':'."
    out = {}
    for line in source.splitlines():
        if not line.strip(): continue
        m = _DIRECTIVE.match(line)
        if not m: break
        name, _, value = m.group(1).partition(" ")
        out[name] = value.strip()
    return out


def test_cells(nb_path: Path, skip_flags=SKIP_FLAGS) -> list[tuple[int, str]]:
    """(cell index, source) of the code cells that `nbdev-test` would run: not flagged with one of `skip_flags`, not
    `#| eval: false`, no `nbdev_export(` call, no `skip-execution` tag."""
    nb = json.loads(nb_path.read_text())
    out = []
    for i, c in enumerate(nb["cells"]):
        if c.get("cell_type") != "code": continue
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        d = directives(src)
        if any(f in d for f in skip_flags): continue
        if d.get("eval:", "").lower() == "false": continue
        if "nbdev_export" + "(" in src: continue                                   # as nbdev-test: no export
        if "skip-execution" in c.get("metadata", {}).get("tags", []): continue
        out.append((i, src))
    return out


def resolve(names: list[str]) -> list[Path]:
    "Notebook paths for names such as `01_model`, `01_model.ipynb` or a path; none: every notebook in nbs/."
    if not names:
        return sorted(NBS.glob("*.ipynb"))
    out = []
    for n in names:
        p = Path(n)
        if not p.suffix: p = p.with_suffix(".ipynb")
        if not p.exists(): p = NBS / p.name
        if not p.exists(): raise SystemExit(f"no notebook {n!r} (looked for {p})")
        out.append(p.resolve())
    return out


# ---------------------------------------------------------------------------------------------------------- child
def _watch_tolerances(stem: str) -> list:
    """Wrap fastcore's `test_close` and numpy's `assert_allclose` so that each call records how much of its tolerance
    it used (max |a - b| / tolerance; over 1: the check fails), with the cell and line that made it."""
    import numpy as np
    records = []
    def where():
        f = sys._getframe(2)
        while f is not None and not f.f_code.co_filename.startswith(f"<{stem} cell "): f = f.f_back
        return (int(f.f_code.co_filename.rsplit(" ", 1)[1].rstrip(">")), f.f_lineno) if f else (None, None)
    def note(used, kind, tol):
        cell, line = where()
        try: used = float(used)
        except Exception: return
        records.append(dict(cell=cell, line=line, check=kind, tol=tol, used=round(used, 4)))
    try:
        import fastcore.test as ft
        orig_close = ft.test_close
        def test_close(a, b, eps=1e-5):
            try:
                d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
                note(d.max() / eps if d.size else 0.0, "test_close", eps)
            except Exception: pass
            return orig_close(a, b, eps)
        ft.test_close = test_close
    except ImportError: pass
    orig_allclose = np.testing.assert_allclose
    def assert_allclose(actual, desired, rtol=1e-7, atol=0, *args, **kw):
        try:
            a, d = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
            bound = atol + rtol * np.abs(d)
            r = np.abs(a - d) / np.where(bound > 0, bound, np.inf)
            note(np.nanmax(r) if r.size else 0.0, "assert_allclose", f"rtol={rtol} atol={atol}")
        except Exception: pass
        return orig_allclose(actual, desired, rtol, atol, *args, **kw)
    np.testing.assert_allclose = assert_allclose
    return records


def _child(nb_path: Path, result_path: Path) -> int:
    "Run `nb_path`'s test cells in this process; write the result JSON to `result_path`."
    import linecache, types
    sys.path.insert(0, str(ROOT))
    os.environ["IN_TEST"] = "1"
    os.chdir(nb_path.parent)
    main = types.ModuleType("__main__"); main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    try: from IPython.display import display
    except ImportError: display = print
    main.__dict__["display"] = display
    emu = os.environ.get("MAXPOST_EMULATE_TPU")   # a CPU dry run (tools/emulate_tpu.py): "dots" and/or an eps
    if emu:
        sys.path.insert(1, str(ROOT / "tools"))
        import emulate_tpu
        parts = emu.split(",")
        print("emulating a TPU on this CPU:", emulate_tpu.install(dots="dots" in parts, transcendental=float(
            next((x for x in parts if x not in ("dots", "")), 0))), flush=True)
    cells = test_cells(nb_path)
    margins = _watch_tolerances(nb_path.stem) if os.environ.get("MAXPOST_NB_MARGINS") else None
    res = dict(notebook=nb_path.stem, cells=len(cells), cells_run=0, status="passed", failure=None,
               imports_named=sorted({m.group(1).split(".")[0] for _, s in cells for m in _IMPORT.finditer(s)}
                                    & set(WATCH)))
    t0 = time.time()
    try:
        for i, src in cells:
            print(f"@@cell {nb_path.stem} {i}", flush=True)
            fname = f"<{nb_path.stem} cell {i}>"
            linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)   # tracebacks show the source
            exec(compile(src, fname, "exec"), main.__dict__)
            res["cells_run"] += 1
            sys.stdout.flush()
    except BaseException as e:                     # SystemExit and KeyboardInterrupt too: report, then stop
        traceback.print_exc()
        tb = traceback.extract_tb(e.__traceback__)
        frames = [f for f in tb if f.filename.startswith(f"<{nb_path.stem} cell ")]
        f = frames[-1] if frames else (tb[-1] if tb else None)
        cell = int(f.filename.rsplit(" ", 1)[1].rstrip(">")) if frames else None
        missing = isinstance(e, ModuleNotFoundError)
        res["status"] = "missing-module" if missing else "failed"
        res["failure"] = dict(cell=cell, line=f.lineno if f else None, source=(f.line or "").strip() if f else "",
                              where=f"{f.filename}:{f.lineno}" if f else "", type=type(e).__name__,
                              message=str(e)[:1500], module=getattr(e, "name", None) if missing else None)
    res["seconds"] = round(time.time() - t0, 1)
    if margins is not None:                        # the checks closest to their tolerance first
        res["margins"] = sorted(margins, key=lambda m: -m["used"])[:40]
    res["imported"] = sorted(m for m in WATCH if m in sys.modules)
    try:
        import jax
        res["backend"] = jax.default_backend()
    except Exception: pass
    result_path.write_text(json.dumps(res, indent=1))
    sys.stdout.flush(); sys.stderr.flush()
    return 0 if res["status"] == "passed" else 1


# --------------------------------------------------------------------------------------------------------- parent
def _environment() -> dict:
    "Backend, devices and versions, from a separate process (this one never imports JAX)."
    code = ("import json, sys, jax, numpy; d = dict(python=sys.version.split()[0], jax=jax.__version__, "
            "numpy=numpy.__version__, backend=jax.default_backend(), devices=[str(x) for x in jax.devices()])\n"
            "for m in ('flax', 'optax', 'orbax.checkpoint', 'transformers', 'torch', 'datasets'):\n"
            "    try: d[m] = __import__(m, fromlist=['_']).__version__\n"
            "    except Exception as e: d[m] = None\n"
            "print(json.dumps(d))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env=_child_env())
    try: return json.loads(r.stdout.strip().splitlines()[-1])
    except Exception: return dict(error=(r.stderr or r.stdout)[-2000:])


def _child_env() -> dict:
    "The environment of a notebook's process: this checkout first on PYTHONPATH (for the processes it starts too)."
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", IN_TEST="1")
    # one process per notebook: a single TPU VM looks like a pod slice to JAX's cluster detection, and
    # maxpost.distributed.initialize would then wait for a coordinator (issue 26, item 1)
    env.setdefault("MAXPOST_NUM_PROCESSES", "1")
    return env


def run_notebook(nb: Path, out: Path, timeout: float) -> dict:
    "One notebook in its own process; its log in out/<stem>.log; returns its summary entry."
    log, result = out / f"{nb.stem}.log", out / f".{nb.stem}.result.json"
    result.unlink(missing_ok=True)
    t0 = time.time()
    with open(log, "w") as f:
        try:
            p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(nb), str(result)],
                               stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=nb.parent,
                               env=_child_env())
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = None
    secs = round(time.time() - t0, 1)
    if result.exists():
        res = json.loads(result.read_text()); result.unlink()
    else:                                          # killed (timeout, out of memory, a crash in native code)
        text = log.read_text(errors="replace")
        cells = re.findall(rf"^@@cell {re.escape(nb.stem)} (\d+)$", text, re.M)
        res = dict(notebook=nb.stem, status="timeout" if rc is None else "failed", cells=len(test_cells(nb)),
                   cells_run=max(len(cells) - 1, 0),
                   failure=dict(cell=int(cells[-1]) if cells else None, type="Timeout" if rc is None else "Crash",
                                message=f"no result after {secs} s" if rc is None else f"exit status {rc}",
                                tail=text[-1500:]))
    res["wall_seconds"] = secs
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="folder for the logs and summary.json")
    ap.add_argument("notebooks", nargs="*", help="names or paths; none: every notebook in nbs/")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per notebook (default 900)")
    ap.add_argument("--archive", help="also pack the logs and summary.json into this .tar.gz")
    ap.add_argument("--list", action="store_true", help="print the cells that would run, and exit")
    ap.add_argument("--margins", action="store_true",
                    help="record how much of its tolerance each test_close / assert_allclose call used (summary.json)")
    ap.add_argument("--emulate-tpu", action="store_true",
                    help="on a CPU: round default-precision matmul inputs to bfloat16, as a TPU does (tools/emulate_tpu.py)")
    ap.add_argument("--emulate-transcendental", type=float, default=0.0, metavar="EPS",
                    help="on a CPU: perturb float32 exp/log/log1p/logistic/pow by a relative EPS (e.g. 5e-5)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child: return _child(Path(a.child[0]), Path(a.child[1]))
    if a.list:
        for nb in resolve(([a.out] if a.out else []) + a.notebooks):
            print(nb.stem, [i for i, _ in test_cells(nb)])
        return 0
    if not a.out: ap.error("OUT is required")
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    if a.margins: os.environ["MAXPOST_NB_MARGINS"] = "1"
    if a.emulate_tpu or a.emulate_transcendental:
        os.environ["MAXPOST_EMULATE_TPU"] = ",".join((["dots"] if a.emulate_tpu else []) +
                                                     ([str(a.emulate_transcendental)] if a.emulate_transcendental else []))
    nbs = resolve(a.notebooks)
    summary = dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), environment=_environment(),
                   emulated=os.environ.get("MAXPOST_EMULATE_TPU") or None, notebooks={})
    print(json.dumps(summary["environment"]), flush=True)
    t0 = time.time()
    for nb in nbs:
        res = run_notebook(nb, out, a.timeout)
        summary["notebooks"][nb.stem] = res
        f = res.get("failure") or {}
        why = f" cell {f.get('cell')}: {f.get('type')}: {str(f.get('message', '')).splitlines()[0][:150] if f.get('message') else ''}" if f else ""
        print(f"{nb.stem:24s} {res['status']:15s} {res['wall_seconds']:7.1f} s{why}", flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))   # after each notebook: a kill keeps the rest
    st = [r["status"] for r in summary["notebooks"].values()]
    summary["totals"] = {s: st.count(s) for s in sorted(set(st))} | dict(seconds=round(time.time() - t0, 1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["totals"]), flush=True)
    if a.archive:
        import tarfile
        with tarfile.open(a.archive, "w:gz") as t:
            for p in sorted(out.iterdir()):
                if p.is_file() and (p.suffix in (".log", ".json")): t.add(p, arcname=f"{out.name}/{p.name}")
    return 0 if all(s == "passed" for s in st) else 1


if __name__ == "__main__":
    sys.exit(main())
