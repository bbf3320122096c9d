"""The native sampler's program (`maxpost.generate._generate_batch`, as `maxpost.aot sample` lowers it) compiled for a
TPU v5e-1 by libtpu's compiler on this machine, no chip: prints its HBM (arguments, outputs, temporaries) and writes
the compiled HLO text, for `benchmarks/hlo_traffic.py OUT.hlo --loop` (the bytes of one decode step).

    python benchmarks/sampler_hlo.py PRESET ROWS PROMPT NEW OUT.hlo [SAMPLES [ATTENTION]]   # e.g. gemma3-1b 64 128 256 /tmp/g1b.hlo

bfloat16 weights and compute, SAMPLES samples per prompt (default 1: ROWS prompts; else ROWS / SAMPLES prompts), the
scanned step's attention ATTENTION (`NativeEngine(decode_attention=…)`: auto is the Pallas kernel of
`maxpost.decode_attention` for a TPU; xla its XLA ops); the record counts the program's Mosaic kernels
(`tpu_custom_call`). `maxpost.aot` sets MAXPOST_TPU_LOWERING=1, so
the program is the one a TPU runs: the scanned decode (`maxpost.scan_decode`), not the CPU's unrolled one.
"""
import sys
import maxpost.aot as aot        # prepares libtpu before jax
import jax, jax.numpy as jnp, json, time
from flax import nnx
from maxpost.model import Decoder, get_preset
from maxpost.generate import _generate_batch
preset, B, T, new, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
R, attention = (int(sys.argv[6]) if len(sys.argv) > 6 else 1), (sys.argv[7] if len(sys.argv) > 7 else "auto")
P = B // R
dev = aot.topology_devices("v5e-1")[0]
mcfg = get_preset(preset)
graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(mcfg, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)))
s = jax.sharding.SingleDeviceSharding(dev)
SDS = jax.ShapeDtypeStruct
st = jax.tree.map(lambda x: SDS(x.shape, x.dtype, sharding=s), state)
a = lambda shape, dt: SDS(shape, dt, sharding=s)
t0 = time.perf_counter()
low = _generate_batch.lower(st, a((P, T), jnp.int32), a((P, T), jnp.int32), a((B,), jnp.bool_), a((B, 2), jnp.int32),
                            a((), jnp.uint32), a((8,), jnp.int32), a((), jnp.int32), a((), jnp.float32), a((), jnp.int32),
                            a((), jnp.float32), graphdef=graphdef, max_new=new, with_sampling_logprobs=False,
                            attention=attention)
c = low.compile()
open(out, "w").write(c.as_text())
text = c.as_text()
print(json.dumps({"preset": preset, "rows": B, "samples": R, "attention": attention, "T": T, "new": new,
                  "hbm_gib": aot.memory(c), "mosaic_kernels": text.count('custom_call_target="tpu_custom_call"'),
                  "compile_s": round(time.perf_counter() - t0, 1)}))
