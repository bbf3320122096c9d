"""Where a native decode step's time goes: SmolLM2-135M (default) or Gemma 3 270M, 8 prompts x 8 samples = 64 rows,
float32, on this machine.

    python benchmarks/decode_profile.py [smollm2-135m|gemma3-270m]

Prints, in one run:
- the time per decode step of `maxpost.generate._generate_batch` (the engine's compiled prefill + while_loop), from
  two calls that differ only in max_tokens (32 and 256 steps of a 256-slot row cache after 192 prompt slots), so
  prefill and fixed costs cancel; the average covers a row cache from empty to full, as in a 256-token generation;
- the time of the same step's dense work alone (the fused q/k/v, o, gate/up and down matmuls of every layer, as
  `decode_weights` lays them out, plus the LM head), without attention, cache writes or sampling;
- the time of sampling alone (`sample_tokens` at temperature 1 on [64, V] logits, log-probs included);
- the rest: attention over both caches, cache writes, norms and rotary embeddings;
- the bytes of cache an average step reads (the prompts' cache once per prompt, the filled blocks of the rows' own
  cache), and the time to read them at this machine's measured bandwidth (a jnp.sum over a buffer of that size).
"""
import sys, time
import numpy as np
import jax, jax.numpy as jnp
from flax import nnx
from maxpost.convert.from_gguf import embedded_hf
from maxpost.engine import make_engine
from maxpost.generate import _generate_batch, decode_blocks, decode_weights
from maxpost.sampling import sample_tokens


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
    L, K, H, hd, V = cfg.num_layers, cfg.num_kv_heads, cfg.num_heads, cfg.head_dim, cfg.vocab_size
    B, U, T, N, plen = 64, 8, 192, 256, 137
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 1000, (U, T)).astype(np.int32); seg = np.zeros((U, T), np.int32); seg[:, T - plen:] = 1
    row_ids = np.stack([np.repeat(np.arange(U), B // U), np.tile(np.arange(B // U), U)], 1).astype(np.int32)
    gen = lambda steps: _generate_batch(st, tokens, seg, np.ones((B,), bool), row_ids, np.uint32(0),
                                        np.full(8, -1, np.int32), np.int32(steps), np.float32(1.0), np.int32(0),
                                        np.float32(1.0), graphdef=gd, max_new=N, with_sampling_logprobs=False)
    jax.block_until_ready(gen(1))                     # compiles (max_tokens is traced: one program for all calls)
    def once(steps):
        t0 = time.perf_counter(); jax.block_until_ready(gen(steps)); return time.perf_counter() - t0
    t_short, t_long = min(once(32) for _ in range(2)), once(N)
    step = (t_long - t_short) / (N - 32)

    # dense work only: the fused projections of every layer and the LM head, one token per row
    w = jax.jit(lambda st: decode_weights(nnx.merge(gd, st)))(st)        # built once, as the engine does per call
    @jax.jit
    def dense(w, st, tok):
        m = nnx.merge(gd, st)
        x = m.embed_tokens(tok)
        for p in w:
            h = x @ p["wqkv"]
            x = x + h[:, :H * hd] @ p["wo"]
            gu = x @ p["wgu"]
            F = gu.shape[-1] // 2
            x = x + (jax.nn.silu(gu[:, :F]) * gu[:, F:]) @ p["w_down"]
        return m.logits(x)
    t_dense = best(dense, w, st, jnp.zeros((B,), jnp.int32))

    # sampling only: temperature 1, no truncation, as in the engine's throughput benchmark
    logits = jnp.asarray(rng.standard_normal((B, V), np.float32) * 3)
    keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(0), r))(jnp.arange(B))
    samp = jax.jit(lambda lg: sample_tokens(lg, keys, 1, jnp.float32(1.0), jnp.int32(0), jnp.float32(1.0)))
    t_samp = best(samp, logits)

    # bytes of cache read by an average step, and the time to read that many bytes once
    blocks = decode_blocks(N)
    starts = np.cumsum([0] + blocks[:-1])
    avg_filled = np.mean([sum(n for s0, n in zip(starts, blocks) if j >= s0) for j in range(N)])
    nbytes = 2 * L * K * hd * 4 * (U * T + B * avg_filled)
    buf = jnp.ones((int(nbytes // 4),), jnp.float32)
    t_read = best(jax.jit(jnp.sum), buf)
    print(f"{name}: {L} layers, {B} rows ({U} prompts x {B // U} samples), {T} prompt slots, {N} own slots, "
          f"float32, backend {jax.default_backend()}")
    print(f"  engine decode step          {step * 1e3:7.1f} ms  ({B / step:.0f} tok/s)")
    print(f"  dense matmuls + LM head     {t_dense * 1e3:7.1f} ms  ({t_dense / step:.0%} of the step)")
    print(f"  sampling (V = {V})     {t_samp * 1e3:7.1f} ms  ({t_samp / step:.0%} of the step)")
    rest = step - t_dense - t_samp
    print(f"  rest: attention, cache writes, norms, rotary {rest * 1e3:.1f} ms  ({rest / step:.0%} of the step)")
    print(f"  cache read per step, average {nbytes / 1e9:.3f} GB: {t_read * 1e3:.1f} ms at {nbytes / 1e9 / t_read:.0f} GB/s")


if __name__ == "__main__":
    main(*sys.argv[1:])
