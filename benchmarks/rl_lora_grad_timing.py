"Time the RL-style LoRA update's forward+backward (Decoder with lora= on all seven projections, token log-probs times an advantage, Gemma 3 270M shapes, random weights) in the tree on PYTHONPATH. Usage: python benchmarks/rl_lora_grad_timing.py B T REPS"
import sys, time, json, statistics
import numpy as np, jax, jax.numpy as jnp
from flax import nnx
from maxpost.head_loss import token_nll
from maxpost.model import model_config, random_params
from maxpost.model import Decoder
from maxpost.lora import init_lora, lora_terms
B, T, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
mcfg = model_config("gemma3-270m")
m = Decoder(mcfg, rngs=nnx.Rngs(0)); g, st = nnx.split(m)
names = ["wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"]
lora = init_lora(mcfg, 16, names, jax.random.key(0))
lora = {k: {"a": v["a"], "b": jnp.full(v["b"].shape, 1e-3, jnp.float32)} for k, v in lora.items()}
rng = np.random.default_rng(0)
tok = jnp.asarray(rng.integers(10, mcfg.vocab_size, (B, T)), jnp.int32)
pos = jnp.tile(jnp.arange(T), (B, 1)); seg = jnp.ones((B, T), jnp.int32)
adv = jnp.asarray(rng.standard_normal((B, 1)), jnp.float32)
def loss(lo, st):
    model = nnx.merge(g, st)
    h, _ = model(tok, pos, seg, return_hidden=True, lora=lora_terms(lo, 2.0))
    logp = -token_nll(model.logits, h, tok, 256)
    return -jnp.mean(logp * adv)
f = jax.jit(jax.value_and_grad(loss))
v, gr = f(lora, st); jax.block_until_ready(gr)
ts = []
for _ in range(reps):
    t = time.perf_counter(); v, gr = f(lora, st); jax.block_until_ready(gr); ts.append(time.perf_counter() - t)
gn = float(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(gr))))
print("@@" + json.dumps({"s": ts, "loss": float(v), "grad_norm": gn}))
