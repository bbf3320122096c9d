"""Where a native decode step's time goes: SmolLM2-135M (default) or Gemma 3 270M, 64 rows, float32, on this machine.

    python benchmarks/decode_profile.py [smollm2-135m|gemma3-270m]

Prints, in one run:
- the time per decode step of `maxpost.generate._generate_batch` (the engine's compiled prefill + while_loop), from
  two calls that differ only in max_tokens (32 and 128 steps, in a 512-slot cache), so prefill and fixed costs cancel;
- the time of the same step's dense work alone (q/k/v/o and MLP matmuls of every layer, plus the LM head), without
  attention, cache writes or sampling;
- the time of decode attention alone over a [layers, 64, kv_heads, 512, head_dim] float32 cache, the way the decode
  step computes it (scores einsum, mask, softmax, values einsum, one layer per scan step);
- the time to read one such cache once (a jnp.sum), i.e. the memory-bandwidth floor of that attention.
"""
import sys, time
import numpy as np
import jax, jax.numpy as jnp
from flax import nnx
from maxpost.convert.from_gguf import embedded_hf
from maxpost.generate import _generate_batch, make_engine


def best(f, *a, reps=5):
    jax.block_until_ready(f(*a))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t0)
    return min(ts)


def main(name="smollm2-135m"):
    eng = make_engine("native", str(embedded_hf(name)), dtype=jnp.float32, max_batch=64)
    gd, st = eng.graphdef, eng._state
    cfg = eng.cfg
    L, K, G, hd = cfg.num_layers, cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
    B, U, T, N, S = 64, 8, 256, 256, 512
    # 1. the engine's own program: 8 prompts x 8 samples, T = 256 prompt slots, N = 256 new-token slots
    tokens = np.ones((U, T), np.int32); seg = np.ones((U, T), np.int32)
    row_src = np.repeat(np.arange(U), B // U).astype(np.int32)
    row_ids = np.stack([row_src, np.tile(np.arange(B // U), U)], 1).astype(np.int32)
    gen = lambda steps: _generate_batch(st, tokens, seg, row_src, np.ones((B,), bool), row_ids, np.uint32(0),
                                        np.full(8, -1, np.int32), np.int32(steps), np.float32(1.0), np.int32(0),
                                        np.float32(1.0), graphdef=gd, max_new=N, with_sampling_logprobs=False)
    jax.block_until_ready(gen(1))                     # compiles (max_tokens is traced: one program for all three)
    def once(steps):
        t0 = time.perf_counter(); jax.block_until_ready(gen(steps)); return time.perf_counter() - t0
    t_short, t_long = once(32), once(128)
    step = (t_long - t_short) / 96

    # 2. dense work only: every projection and the LM head for one token per row
    @jax.jit
    def dense(st, tok):
        m = nnx.merge(gd, st)
        x = m.embed_tokens(tok[:, None])
        ps = {k: getattr(m, k)[...] for k in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")}
        def layer(x, p):
            q = jnp.einsum("btd,dnh->btnh", x, p["wq"])
            kv = jnp.einsum("btd,dnh->btnh", x, p["wk"]).sum() + jnp.einsum("btd,dnh->btnh", x, p["wv"]).sum()
            x = x + jnp.einsum("btnh,nhd->btd", q, p["wo"]) + 0 * kv
            g = jax.nn.silu(jnp.einsum("btd,df->btf", x, p["w_gate"])) * jnp.einsum("btd,df->btf", x, p["w_up"])
            return x + jnp.einsum("btf,fd->btd", g, p["w_down"]), None
        x, _ = jax.lax.scan(layer, x, ps)
        return m.logits(x[:, 0])
    t_dense = best(dense, st, jnp.zeros((B,), jnp.int32))

    # 3. decode attention alone, as decode_step computes it
    rng = np.random.default_rng(0)
    kc = jnp.asarray(rng.standard_normal((L, B, K, S, hd), np.float32)); vc = kc * 0.5
    q = jnp.asarray(rng.standard_normal((B, K, G, hd), np.float32))
    mask = jnp.ones((B, 1, 1, S), bool)
    @jax.jit
    def attention(kc, vc, q):
        def layer(c, l):
            s = jnp.einsum("bkgh,bksh->bkgs", q, kc[l]) * hd ** -0.5
            w = jax.nn.softmax(jnp.where(mask, s, -1e30), -1)
            return c + jnp.einsum("bkgs,bksh->bkgh", w, vc[l]).sum(), None
        return jax.lax.scan(layer, 0.0, jnp.arange(L))[0]
    t_attn = best(attention, kc, vc, q)
    t_read = best(jax.jit(jnp.sum), kc)
    gb = kc.nbytes / 1e9
    print(f"{name}: {L} layers, {B} rows, cache {S} slots, float32, backend {jax.default_backend()}")
    print(f"  engine decode step        {step * 1e3:7.1f} ms  ({B / step:.0f} tok/s)")
    print(f"  dense matmuls + LM head   {t_dense * 1e3:7.1f} ms  ({t_dense / step:.0%} of the step)")
    print(f"  decode attention, {L} layers {t_attn * 1e3:5.1f} ms  ({t_attn / step:.0%} of the step)")
    print(f"  read one cache ({gb:.2f} GB)  {t_read * 1e3:7.1f} ms  ({gb / t_read:.0f} GB/s; attention reads two)")
    print(f"  rest (cache writes, slicing, sampling) {(step - t_dense - t_attn) * 1e3:.1f} ms")


if __name__ == "__main__":
    main(*sys.argv[1:])
