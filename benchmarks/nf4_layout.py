"""What the storage order of QLoRA's nf4 codes does to the decode + matmul on a TPU, compiled (not run) for v5e-1.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/nf4_layout.py            # deviceless: libtpu's compiler, no chip
    PYTHONPATH=$PWD python benchmarks/nf4_layout.py --device              # on a TPU host: also times each program

Gemma 3 1B's MLP shapes (hidden 1152, MLP 6912), x [2048, in] bf16. Every nf4 variant decodes the same values (blocks
of 64 consecutive weights along `out` with one float32 absmax each, the NF4 table, `maxpost.quant.nf4_values`); only
where the two codes of a byte and the block scales sit differs:
  flat    the old `quantize`: the weight flattened into [blocks, 64] blocks, codes [blocks, 32] with the nibbles of a
          byte two neighbouring weights (unpack: stack on a new minor axis of 2), absmax [blocks]
  pair128 codes [in, out/2]: byte (i, 64 g + k) holds columns 128 g + k (low) and 128 g + 64 + k (high); absmax
          [in, out/64]
  half    codes [in, out/2]: byte (i, j) holds columns j (low) and j + out/2 (high), unpack = concatenate on the lanes;
          absmax [in, out/64]
  rows    codes [in/2, out]: byte (r, j) holds rows r (low) and r + in/2 (high), unpack = concatenate on the sublanes;
          absmax [in, out/64]
and `bf16` is the plain matmul. Per program: temporaries (memory_analysis), flops and bytes accessed (cost_analysis),
and the copy / transpose / fusion instructions of the optimized HLO. `scan` runs 26 layers of x @ w_gate @ w_down
with the codes as scanned arrays (forward + the gradient with respect to x, the frozen base's backward).
"""
import os, re, sys, time
if "--device" not in sys.argv:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import maxpost.aot as aot                   # puts libtpu on the path before jax is imported
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from maxpost.quant import nf4_values

B, HID, MLP, LAYERS, BLK = 2048, 1152, 6912, 26, 64
DT = jnp.bfloat16

def _scale(absmax, cols):            # [.., in, out/64] → [.., in, out]: each block scale over its 64 lanes
    return jnp.repeat(absmax, BLK, axis=-1)[..., :cols]

def dec_flat(q, shape):
    codes, absmax = q
    idx = jnp.stack([codes & 15, codes >> 4], -1).reshape(*codes.shape[:-1], BLK)
    return (nf4_values(idx) * absmax[..., None]).reshape(shape).astype(DT)

def dec_pair128(q, shape):
    codes, absmax = q; i, o = shape
    lo, hi = (codes & 15).reshape(i, o // 128, 64), (codes >> 4).reshape(i, o // 128, 64)
    idx = jnp.concatenate([lo, hi], -1).reshape(i, o)
    return (nf4_values(idx) * _scale(absmax, o)).astype(DT)

def dec_half(q, shape):
    codes, absmax = q
    idx = jnp.concatenate([codes & 15, codes >> 4], -1)
    return (nf4_values(idx) * _scale(absmax, shape[1])).astype(DT)

def dec_rows(q, shape):
    codes, absmax = q
    idx = jnp.concatenate([codes & 15, codes >> 4], -2)
    return (nf4_values(idx) * _scale(absmax, shape[1])).astype(DT)

def abstract(layout, i, o, lead=()):
    "Abstract (codes, absmax) of one [i, o] weight (with stacked leading axes `lead`) in `layout`."
    u8, f32 = jnp.uint8, jnp.float32
    if layout == "flat": return (jax.ShapeDtypeStruct((*lead, i * o // BLK, BLK // 2), u8),
                                 jax.ShapeDtypeStruct((*lead, i * o // BLK), f32))
    c = (*lead, i // 2, o) if layout == "rows" else (*lead, i, o // 2)
    return jax.ShapeDtypeStruct(c, u8), jax.ShapeDtypeStruct((*lead, i, o // BLK), f32)

DECODE = {"flat": dec_flat, "pair128": dec_pair128, "half": dec_half, "rows": dec_rows}

def make_mm(layout, shape):
    "x @ w with w decoded from `layout` (bf16: w itself); the custom backward decodes again (qmatmul's residual)."
    if layout == "bf16":
        return lambda x, w: jnp.matmul(x, w, preferred_element_type=jnp.float32).astype(x.dtype)
    dec = DECODE[layout]
    @jax.custom_vjp
    def mm(x, q): return jnp.matmul(x, dec(q, shape), preferred_element_type=jnp.float32).astype(x.dtype)
    def fwd(x, q): return mm(x, q), q
    def bwd(q, g): return jnp.matmul(g, dec(q, shape).T, preferred_element_type=jnp.float32).astype(g.dtype), None
    mm.defvjp(fwd, bwd)
    return mm

def weight(layout, i, o, lead=()):
    return jax.ShapeDtypeStruct((*lead, i, o), DT) if layout == "bf16" else abstract(layout, i, o, lead)

def programs(layout):
    "name → (fn, abstract args) for `layout`."
    out = {}
    for name, (i, o) in (("w_gate", (HID, MLP)), ("w_down", (MLP, HID))):
        mm = make_mm(layout, (i, o)); x = jax.ShapeDtypeStruct((B, i), DT); g = jax.ShapeDtypeStruct((B, o), DT)
        out[f"{name} fwd"] = (mm, (x, weight(layout, i, o)))
        out[f"{name} fwd+bwd"] = (lambda x, w, g, mm=mm: jax.vjp(lambda x: mm(x, w), x)[1](g)[0],
                                  (x, weight(layout, i, o), g))
    up, down = make_mm(layout, (HID, MLP)), make_mm(layout, (MLP, HID))
    def loss(x, wg, wd):
        def layer(h, ws): return down(up(h, ws[0]), ws[1]), None
        return jax.lax.scan(layer, x, (wg, wd))[0].astype(jnp.float32).sum()
    out[f"scan {LAYERS} fwd+bwd"] = (jax.grad(loss), (jax.ShapeDtypeStruct((B, HID), DT),
                                                       weight(layout, HID, MLP, (LAYERS,)), weight(layout, MLP, HID, (LAYERS,))))
    return out

def hlo_counts(text: str) -> dict:
    ops = re.findall(r"=\s*\S+\s+([a-z][a-z0-9-]*)\(", text)
    return {k: sum(o == k or o.startswith(k + "-start") for o in ops) for k in ("copy", "transpose", "fusion", "gather")}

def measure(fn, args, dev, run: bool) -> dict:
    sh = NamedSharding(Mesh(np.array([dev]), ("x",)), P())
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), args)
    comp = jax.jit(fn).lower(*args).compile()
    m, c = comp.memory_analysis(), comp.cost_analysis()
    c = c[0] if isinstance(c, list) else c
    rec = {"temp_MiB": m.temp_size_in_bytes / 2 ** 20, "args_MiB": m.argument_size_in_bytes / 2 ** 20,
           "GB": c.get("bytes accessed", 0) / 1e9, "GFLOP": c.get("flops", 0) / 1e9, **hlo_counts(comp.as_text())}
    if run:       # on a chip: median of 10 calls after a warm-up, random codes (the values do not change the time)
        key = iter(jax.random.split(jax.random.key(0), 16))
        real = [jax.random.randint(next(key), a.shape, 0, 255).astype(a.dtype) if a.dtype == jnp.uint8 else
                jax.random.normal(next(key), a.shape, a.dtype) for a in jax.tree.leaves(args)]
        real = jax.tree.unflatten(jax.tree.structure(args), [jax.device_put(r, sh) for r in real])
        jax.block_until_ready(comp(*real)); ts = []
        for _ in range(10):
            t = time.perf_counter(); jax.block_until_ready(comp(*real)); ts.append(time.perf_counter() - t)
        rec["ms"] = 1e3 * sorted(ts)[5]
    return rec

def main():
    run = "--device" in sys.argv
    dev = jax.devices()[0] if run else aot.topology_devices("v5e-1")[0]
    print(f"# {'run on' if run else 'compiled (not run) for'} {dev.device_kind if run else 'v5e-1, deviceless'}; "
          f"B={B}, hidden {HID}, MLP {MLP}; bf16 compute")
    cols = ["temp_MiB", "args_MiB", "GB", "GFLOP", "copy", "transpose", "fusion", "gather"] + (["ms"] if run else [])
    print("| program | layout | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 2))
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    for layout in only or ["bf16", "flat", "pair128", "half", "rows"]:
        for name, (fn, args) in programs(layout).items():
            r = measure(fn, args, dev, run)
            print(f"| {name} | {layout} | " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])
                                                       for k in cols) + " |", flush=True)

if __name__ == "__main__": main()
