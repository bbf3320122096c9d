#!/usr/bin/env python3
"""The `TPU-FIGURE {json}` lines of `tests/test_tpu.py` as markdown tables, for benchmarks/RESULTS_tpu.md.

    python tools/tpu_figures.py figures.jsonl            # MAXPOST_TPU_FIGURES's file
    python tools/tpu_figures.py pytest.log               # or any log that holds `TPU-FIGURE {...}` lines

One table per test (logits, trainer_step, sampler): a row per case (model, trainer, precision), a column per figure,
"value (bound)" where the test has a bound.
"""
import json, sys
from collections import OrderedDict


def read(path: str) -> list[dict]:
    out = []
    for line in open(path):
        line = line.strip()
        if line.startswith("TPU-FIGURE "): line = line[len("TPU-FIGURE "):]
        if line.startswith("{"):
            try: out.append(json.loads(line))
            except json.JSONDecodeError: pass
    return out


def fmt(r: dict) -> str:
    v = r["value"]
    s = f"{v:.3g}" if isinstance(v, float) and v != int(v) or abs(v) >= 1e4 else f"{v:g}"
    if r.get("reference") is not None: s += f" (CPU {r['reference']:.5g})"
    if r.get("bound") is not None: s += f" ≤ {r['bound']:.3g}"
    return s


def tables(recs: list[dict]) -> str:
    out = []
    backends = sorted({r.get("backend", "?") for r in recs})
    out.append(f"Backend: {', '.join(backends)}; jax {', '.join(sorted({r.get('jax', '?') for r in recs}))}\n")
    for test in OrderedDict.fromkeys(r["test"] for r in recs):
        rows, cols = OrderedDict(), OrderedDict()
        for r in recs:
            if r["test"] != test: continue
            key = tuple(r.get(k) for k in ("model", "trainer", "precision") if r.get(k) is not None)
            rows.setdefault(key, {})[r["figure"]] = fmt(r)
            cols[r["figure"]] = None
        out.append(f"### {test}\n")
        out.append("| case | " + " | ".join(cols) + " |")
        out.append("|---|" + "---|" * len(cols))
        for key, figs in rows.items():
            out.append(f"| {' / '.join(map(str, key))} | " + " | ".join(figs.get(c, "") for c in cols) + " |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) != 2: sys.exit(__doc__)
    print(tables(read(sys.argv[1])))
