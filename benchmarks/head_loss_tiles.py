"""The fused head loss on its own: maxpost's tiled `_fused` (maxpost.head_loss) against the same function of an older
tree, on random float32 data of Gemma 3 270M's head shape (d 640, V 262 144). The older tree may be from before the
tiles (`sft._fused`, logits [chunk, V] per chunk of positions; `--baseline-chunk 256`) or a tiled one
(`--baseline-chunk 1024`). Prints seconds per call (median of 3 after a compile) and the largest differences of the
loss and gradients to the older tree's.

    git archive feec7e9 maxpost | tar -x -C /tmp/base       # before the tiles
    python benchmarks/head_loss_tiles.py --baseline /tmp/base [--n 512] [--vocab 262144] [--cap 30] [--dw]
    git archive 8909f11 maxpost | tar -x -C /tmp/base       # tiled, the ∂W pass recomputing the logits
    python benchmarks/head_loss_tiles.py --baseline /tmp/base --baseline-chunk 1024 --dw
"""
import argparse, importlib, sys, time
from pathlib import Path
import numpy as np

ROOT = Path(__file__).resolve().parents[1]

def load_fused(tree: Path):
    "`_fused` of the maxpost package under `tree` (head_loss if it has one, else sft), imported fresh."
    for k in [k for k in sys.modules if k == "maxpost" or k.startswith("maxpost.")]: sys.modules.pop(k)
    sys.path.insert(0, str(tree))
    try:
        mod = "maxpost.head_loss" if (tree / "maxpost" / "head_loss.py").exists() else "maxpost.sft"
        return importlib.import_module(mod)._fused
    finally: sys.path.pop(0)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, help="a tree with an older maxpost/ (git archive <commit> maxpost)")
    ap.add_argument("--n", type=int, default=512, help="positions (batch × length)")
    ap.add_argument("--vocab", type=int, default=262_144)
    ap.add_argument("--cap", type=float, default=None, help="final logit soft-cap")
    ap.add_argument("--dw", action="store_true", help="the head is trained (full fine-tuning): also ∂/∂W")
    ap.add_argument("--baseline-chunk", type=int, default=256, help="positions per chunk for the baseline tree")
    a = ap.parse_args()
    import jax, jax.numpy as jnp
    d = 640
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.standard_normal((a.n, d), np.float32))
    w = jnp.asarray(rng.standard_normal((a.vocab, d), np.float32) * 0.03)
    y = jnp.asarray(rng.integers(0, a.vocab, a.n).astype(np.int32))
    m = jnp.asarray(rng.random(a.n).astype(np.float32))
    old, new = load_fused(Path(a.baseline)), load_fused(ROOT)
    def total(f, chunk):       # (Σ m·NLL, ∂h, ∂W): the older `_fused` returns the sum, the newer the per-token NLL
        def g(*x):
            r = f(*x, a.cap, chunk, True, a.dw)
            return (r[0] if r[0].ndim == 0 else jnp.sum(r[0] * x[3]), r[1], r[2])
        return jax.jit(g)
    runs = {f"baseline tree ({a.baseline_chunk} positions per chunk)": total(old, a.baseline_chunk),
            "this tree ([1024, 8192] tiles)": total(new, 1024)}
    out = {}
    for name, f in runs.items():
        out[name] = jax.block_until_ready(f(h, w, y, m)); ts = []
        for _ in range(3):
            t = time.perf_counter(); jax.block_until_ready(f(h, w, y, m)); ts.append(time.perf_counter() - t)
        print(f"{name}: {np.median(ts):.3f} s (min {min(ts):.3f})", flush=True)
    (lo, *go), (ln, *gn) = out.values()
    print(f"N {a.n}, V {a.vocab}, cap {a.cap}, dW {a.dw}; this tree's head matmuls "
          f"{(6 if a.dw else 4) * a.n * a.vocab * d / 1e9:.0f} GFLOP; |Δloss|/loss {abs(float(ln - lo)) / abs(float(lo)):.1e}; "
          + ", ".join(f"max|Δ{k}| {float(jnp.abs(x - z).max()):.1e}" for k, x, z in zip(("dh", "dW"), gn, go) if x is not None))

if __name__ == "__main__": main()
