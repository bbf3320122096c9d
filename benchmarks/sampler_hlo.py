"""The native sampler's program (`maxpost.generate._generate_batch`, as `maxpost.aot sample` lowers it) compiled for a
TPU v5e-1 by libtpu's compiler on this machine, no chip: prints its HBM (arguments, outputs, temporaries) and writes
the compiled HLO text, for `benchmarks/hlo_traffic.py OUT.hlo --loop` (the bytes of one decode step).

    python benchmarks/sampler_hlo.py PRESET ROWS PROMPT NEW OUT.hlo      # e.g. gemma3-1b 64 128 256 /tmp/g1b.hlo

bfloat16 weights and compute, one sample per prompt (ROWS prompts). `maxpost.aot` sets MAXPOST_TPU_LOWERING=1, so
the program is the one a TPU runs: the scanned decode (`maxpost.scan_decode`), not the CPU's unrolled one.
"""
import sys
import maxpost.aot as aot        # prepares libtpu before jax
import jax, jax.numpy as jnp, json, time
from flax import nnx
from maxpost.model import Decoder, get_preset
from maxpost.generate import _generate_batch
preset, P, T, new, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dev = aot.topology_devices("v5e-1")[0]
mcfg = get_preset(preset)
graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(mcfg, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)))
s = jax.sharding.SingleDeviceSharding(dev)
SDS = jax.ShapeDtypeStruct
st = jax.tree.map(lambda x: SDS(x.shape, x.dtype, sharding=s), state)
a = lambda shape, dt: SDS(shape, dt, sharding=s)
t0 = time.perf_counter()
low = _generate_batch.lower(st, a((P, T), jnp.int32), a((P, T), jnp.int32), a((P,), jnp.bool_), a((P, 2), jnp.int32),
                            a((), jnp.uint32), a((8,), jnp.int32), a((), jnp.int32), a((), jnp.float32), a((), jnp.int32),
                            a((), jnp.float32), graphdef=graphdef, max_new=new, with_sampling_logprobs=False)
c = low.compile()
open(out, "w").write(c.as_text())
print(json.dumps({"preset": preset, "rows": P, "T": T, "new": new, "hbm_gib": aot.memory(c), "compile_s": round(time.perf_counter() - t0, 1)}))
