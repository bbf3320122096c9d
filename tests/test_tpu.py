"""The `tpu` subset: maxpost on the accelerator against the same computation on the same machine's CPU.

    python -m pytest tests/test_tpu.py -v -s                                    # on a TPU machine
    MAXPOST_TPU_FIGURES=figures.jsonl python -m pytest tests/test_tpu.py -s     # the figures into a file as well
    MAXPOST_TPU_TESTS_ON_CPU=1 python -m pytest tests/test_tpu.py -v -s         # a dry run on a CPU (run it alone)
    python tests/test_tpu.py [substring]                                        # the same without pytest installed

Anywhere else these tests are skipped (`tests/conftest.py`). The dry run computes the accelerator's side on the CPU
as well, with `tools/emulate_tpu.py` rounding the inputs of default-precision matmuls to bfloat16 as a TPU's MXU does,
so that its default-precision figures resemble a TPU's (a TPU's approximate exp/log are not emulated there).

Each test prints one `TPU-FIGURE {json}` line per measured figure: test, model, precision, figure, value, bound (for
benchmarks/RESULTS_tpu.md). Weights are random (`maxpost.model.random_params`, numpy, the same on both sides), dtypes
float32 and passed explicitly. The bounds come from two facts (DEVELOPERS.md, "Precision"):

- at JAX's default precision a TPU rounds each float32 matmul input to bfloat16 (8 significant bits, relative error
  2^-9), so each product is off by up to u = 2^-8 relatively; the error of a dot product is of order u times the
  scale of its terms, and the L layers' (and the head's) errors add up in the residual stream like a random walk:
  logits off by about u·sqrt(L + 1) of their scale in RMS. Bounds: RMS |Δ logit| / RMS |logit| ≤ 4·u·sqrt(L + 1),
  max |Δ logit| / max |logit| ≤ 8·u·sqrt(L + 1). (A CPU run with the TPU's rounding emulated measured 1.2 and 0.73
  times u·sqrt(L + 1) in RMS for tiny-gemma3 and a random Gemma 3 270M, and 2.3 and 0.8 times it at the max.)
  A log-softmax moves by at most twice the largest logit change.
- at "highest" (six bfloat16 passes) a TPU's matmuls are float32-accurate; what remains is its approximate float32
  exp/log/... (up to TPU_TRANSCENDENTAL_RTOL = 2e-4, JAX's own tolerance there), at most once per layer on the path to a
  logit: (L + 1) · 2e-4 of the logits' scale, for the RMS and the max alike.
- one trainer step: the loss within the logits' max bound (relative), the gradient norm within twice it (the
  backward pass has twice the matmuls). A random tiny Llama is no model for this: its LoRA gradients move by 78%
  when its weights move by 2^-9 (float32 throughout), against 1.3% for tiny Gemma 3, so every step uses tiny-gemma3.

The lead records the measured figures; a bound that fails says which assumption was wrong.
"""
import json, math, os, sys, time
from pathlib import Path

import numpy as np
try:
    import pytest
except ImportError:                # a bare device machine: `python tests/test_tpu.py` runs these tests without pytest
    class _NoOp:
        def __getattr__(self, name): return lambda *a, **kw: (lambda f: f)
    class pytest: mark = _NoOp(); fixture = staticmethod(lambda *a, **kw: (lambda f: f))

pytestmark = pytest.mark.tpu

ROOT = Path(__file__).resolve().parents[1]
DRY = os.environ.get("MAXPOST_TPU_TESTS_ON_CPU") == "1"
U = 2.0 ** -8                 # relative error of a product of two bfloat16-rounded float32 inputs (2 × 2^-9)
TRANSCENDENTAL = 2e-4         # maxpost.testing.TPU_TRANSCENDENTAL_RTOL
PRECISIONS = ("highest", "default")


def logits_bound(precision: str, n_layers: int, rms: bool = False) -> float:
    "Bound on max |Δ logit| / max |logit| (rms: RMS over RMS) against the CPU; the module's docstring says why."
    if precision == "highest": return (n_layers + 1) * TRANSCENDENTAL
    return (4 if rms else 8) * U * math.sqrt(n_layers + 1)


def _dev():
    "(accelerator device, CPU device); in a dry run both are the CPU, with a TPU's default-precision matmuls emulated."
    import jax
    cpu = jax.devices("cpu")[0]
    if not DRY:
        yield jax.devices()[0], cpu
        return
    sys.path.insert(0, str(ROOT / "tools"))
    import emulate_tpu
    emulate_tpu.install(dots=True)
    try: yield cpu, cpu
    finally: emulate_tpu.uninstall()

dev = pytest.fixture(scope="module")(_dev)


def figure(test: str, name: str, value, bound=None, **kw):
    "Print one measured figure as `TPU-FIGURE {json}` (and append it to $MAXPOST_TPU_FIGURES when set)."
    import jax
    rec = dict(test=test, figure=name, value=float(value), bound=None if bound is None else float(bound), **kw,
               backend="cpu (dry run, TPU matmuls emulated)" if DRY else jax.default_backend(),
               device=str(jax.devices()[0]) if not DRY else "cpu", jax=jax.__version__)
    line = json.dumps(rec)
    print("TPU-FIGURE " + line, flush=True)
    if os.environ.get("MAXPOST_TPU_FIGURES"):
        with open(os.environ["MAXPOST_TPU_FIGURES"], "a") as f: f.write(line + "\n")
    return rec


def precision_ctx(precision: str):
    "`jax.default_matmul_precision(precision)`, or no context for JAX's default."
    import contextlib, jax
    return contextlib.nullcontext() if precision == "default" else jax.default_matmul_precision(precision)


# ------------------------------------------------------------------------------------------------------ models
_PARAMS: dict = {}

def model_and_params(name: str):
    "(ModelConfig, numpy float32 params) of a preset or tiny model, random, seed 0; cached."
    from maxpost.model import model_config, random_params
    if name not in _PARAMS:
        mcfg = model_config(name)
        _PARAMS[name] = (mcfg, random_params(mcfg, 0))
    return _PARAMS[name]


def decoder_on(mcfg, params: dict, device):
    "A float32 Decoder whose params live on `device`."
    import jax, jax.numpy as jnp
    from maxpost.checkpoint import empty_decoder
    with jax.default_device(device):
        model = empty_decoder(mcfg, jnp.float32, jnp.float32)
        for k, v in params.items(): getattr(model, k)[...] = jax.device_put(np.asarray(v, np.float32), device)
    return model


def forward_logits(mcfg, params, tokens, device, precision: str) -> np.ndarray:
    "Logits [B, T, V] of `tokens` (all real, positions 0..T-1) on `device` at `precision`."
    import jax
    from flax import nnx
    model = decoder_on(mcfg, params, device)
    gdef, state = nnx.split(model)
    B, T = tokens.shape
    put = lambda x: jax.device_put(np.asarray(x, np.int32), device)
    pos, seg = put(np.tile(np.arange(T), (B, 1))), put(np.ones((B, T)))
    f = jax.jit(lambda st, t, p, s: nnx.merge(gdef, st)(t, p, s)[0])
    with precision_ctx(precision): out = f(state, put(tokens), pos, seg)
    return np.asarray(out, np.float32)


def log_softmax64(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


# -------------------------------------------------------------------------------------------------------- logits
LOGIT_CASES = {"tiny-gemma3": (2, 32), "gemma3-270m": (2, 128)}    # model -> (B, T)
_REF: dict = {}

@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("model_name", list(LOGIT_CASES))
def test_logits_against_cpu(dev, model_name, precision):
    "Logits of a random model on the accelerator against the CPU's at 'highest': within `logits_bound`."
    acc, cpu = dev
    mcfg, params = model_and_params(model_name)
    B, T = LOGIT_CASES[model_name]
    tokens = np.random.default_rng(1).integers(0, mcfg.vocab_size, (B, T))
    t0 = time.time()
    if model_name not in _REF: _REF[model_name] = forward_logits(mcfg, params, tokens, cpu, "highest")
    ref = _REF[model_name]
    got = forward_logits(mcfg, params, tokens, acc, precision)
    assert np.all(np.isfinite(got))
    d = np.abs(got.astype(np.float64) - ref)
    scale = float(np.abs(ref).max())
    rel = float(d.max()) / scale
    rms = float(np.sqrt((d ** 2).mean() / (ref.astype(np.float64) ** 2).mean()))
    dlsm = float(np.abs(log_softmax64(got) - log_softmax64(ref)).max())
    agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
    bound, bound_rms = logits_bound(precision, mcfg.num_layers), logits_bound(precision, mcfg.num_layers, rms=True)
    kw = dict(test="logits", model=model_name, precision=precision, B=B, T=T, layers=mcfg.num_layers)
    figure(name="max_abs_dlogit_over_max_abs_logit", value=rel, bound=bound, **kw)
    figure(name="rms_dlogit_over_rms_logit", value=rms, bound=bound_rms, **kw)
    figure(name="max_abs_dlog_softmax", value=dlsm, bound=2 * bound * scale, **kw)
    figure(name="argmax_agreement", value=agree, **kw)
    figure(name="logit_scale", value=scale, **kw)
    figure(name="seconds", value=time.time() - t0, **kw)
    assert rel <= bound, (rel, bound)
    assert rms <= bound_rms, (rms, bound_rms)
    assert dlsm <= 2 * bound * scale, (dlsm, 2 * bound * scale)


# ------------------------------------------------------------------------------------------------ trainer steps
def _mesh(device):
    from maxpost.sharding import make_mesh
    return make_mesh(1, 1, [device])


def _sft_step(kind: str, device, precision: str):
    "Loss and grad norm of one SFT step (full or LoRA) of tiny-gemma3 on `device`."
    import jax
    from maxpost.sft import SFTConfig, SFTTrainer, synthetic_examples
    from maxpost.data import SFTDataIterator
    mcfg, params = model_and_params("tiny-gemma3")
    cfg = SFTConfig(model_name="tiny-gemma3", per_device_batch_size=4, loss_chunk_size=16, learning_rate=1e-2,
                    warmup_steps_fraction=0.0, use_lora=kind == "lora", lora_rank=4, dtype="float32",
                    weight_dtype="float32", max_target_length=32)
    batch = next(SFTDataIterator(synthetic_examples(8, mcfg.vocab_size, seed=0), 4, 32, seed=0))
    with jax.default_device(device), precision_ctx(precision):
        tr = SFTTrainer(cfg, mcfg, params, _mesh(device))
        _, m = tr.step(tr.init_state(), batch)
        return {k: float(m[k]) for k in ("loss", "grad_norm")}


def _dpo_step(device, precision: str, ref_logps=None):
    "Loss, grad norm and reward margin of one DPO step (LoRA) of tiny-gemma3 on `device`, with given reference log-probs."
    import jax
    from maxpost.dpo import DPOConfig, DPOTrainer
    from maxpost.dpo_data import PreferenceIterator, synthetic_pairs
    mcfg, params = model_and_params("tiny-gemma3")
    cfg = DPOConfig(model_name="tiny-gemma3", max_target_length=32, per_device_batch_size=4, loss_chunk_size=64,
                    learning_rate=1e-3, use_lora=True, lora_rank=4, dataset_type="synthetic", dtype="float32",
                    weight_dtype="float32")
    pairs = synthetic_pairs(8, mcfg.vocab_size, seed=0)
    with jax.default_device(device), precision_ctx(precision):
        tr = DPOTrainer(cfg, mcfg, params, _mesh(device))
        ref = tr.reference_logps(pairs, 4) if ref_logps is None else ref_logps
        b = next(PreferenceIterator(pairs, 4, 32, ref_logps=ref))
        _, m = tr.step(tr.init_state(), b)
        return {k: float(m[k]) for k in ("loss", "grad_norm", "rewards/margins")}, ref


def _grpo_results():
    "A fixed rollout of the addition task: 2 prompts × 4 samples, fixed completions and engine log-probs."
    from maxpost.engine import GenerationResult
    from maxpost.testing import DIGIT0, EOS, addition_rows
    rows = addition_rows([(2, 3), (4, 4)])
    res = []
    for p, row in enumerate(rows):
        for s in range(4):
            toks = [DIGIT0 + (p * 4 + s) % 10, EOS] if s % 2 else [DIGIT0 + (5 + s) % 10, DIGIT0 + s, EOS]
            res.append(GenerationResult(p, s, list(row["prompt_ids"]), toks, "", np.full(len(toks), -2.0, np.float32),
                                        "stop"))
    return res


def _grpo_step(device, precision: str, fixed=None):
    """Metrics of one GRPO update (LoRA, beta 0.04) of tiny-gemma3 on `device` on a fixed rollout; old and reference
    log-probs from `fixed` (the CPU's, moved by +0.05 / -0.1 so that ratios and KL depend on this device's log-probs)."""
    import jax
    from maxpost.rl.config import check_config
    from maxpost.rl.trainer import RLTrainer, training_batch
    from maxpost.testing import addition_config
    mcfg, params = model_and_params("tiny-gemma3")
    cfg = addition_config("grpo", 1, model_name="tiny-gemma3", batch_size=2, num_generations=4, num_iterations=1,
                          use_lora=True, lora_rank=4, dtype="float32", weight_dtype="float32")
    with jax.default_device(device), precision_ctx(precision):
        tr = RLTrainer(cfg, check_config(cfg), mcfg, params, _mesh(device))
        st = tr.init_state()
        bt = training_batch(tr, _grpo_results())
        bt["advantages"] = np.linspace(-1.0, 1.5, bt["completion_mask"].shape[0]).astype(np.float32)
        if fixed is None:
            dev_bt = tr.put(bt)
            fixed = (np.asarray(tr.policy_logps(st, dev_bt)) + 0.05, np.asarray(tr.ref_logps(dev_bt)) - 0.1)
        bt["old_logps"], bt["ref_logps"] = fixed
        _, m = tr.update(st, tr.put(bt))
        return {k: float(m[k]) for k in ("loss", "grad_norm", "kl", "entropy", "ratio_mean")}, fixed


def _rel(a, b): return abs(a - b) / max(abs(b), 1e-30)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind", ["sft-full", "sft-lora", "dpo", "grpo"])
def test_trainer_step_against_cpu(dev, kind, precision):
    """One step of each trainer on the accelerator (at `precision`) against the same step on the CPU ('highest'):
    finite, and loss and grad norm within the bounds (loss: the logits' bound; grad norm: twice that, as the backward
    pass doubles the matmuls on the path)."""
    acc, cpu = dev
    t0 = time.time()
    if kind.startswith("sft"):
        ref, got = _sft_step(kind[4:], cpu, "highest"), _sft_step(kind[4:], acc, precision)
    elif kind == "dpo":
        ref, ref_logps = _dpo_step(cpu, "highest")
        got, _ = _dpo_step(acc, precision, ref_logps)               # the CPU's reference log-probs on both sides
    else:
        ref, fixed = _grpo_step(cpu, "highest")
        got, _ = _grpo_step(acc, precision, fixed)                  # the CPU's old and reference log-probs too
    b = logits_bound(precision, model_and_params("tiny-gemma3")[0].num_layers)
    kw = dict(test="trainer_step", model="tiny-gemma3", trainer=kind, precision=precision)
    for k, v in got.items():
        figure(name=k, value=v, reference=ref[k], **kw)
    figure(name="loss_rel_diff", value=_rel(got["loss"], ref["loss"]), bound=b, **kw)
    figure(name="grad_norm_rel_diff", value=_rel(got["grad_norm"], ref["grad_norm"]), bound=2 * b, **kw)
    figure(name="seconds", value=time.time() - t0, **kw)
    assert all(math.isfinite(v) for v in got.values()), got
    assert _rel(got["loss"], ref["loss"]) <= b, (got, ref, b)
    assert _rel(got["grad_norm"], ref["grad_norm"]) <= 2 * b, (got, ref, 2 * b)


# ---------------------------------------------------------------------------------------------- the native sampler
SAMPLER_CASES = {"tiny-gemma3": 24, "gemma3-270m": 8}     # model -> greedy tokens per prompt

@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("model_name", list(SAMPLER_CASES))
def test_sampler_against_forward(dev, model_name, precision):
    """Greedy decoding with the native engine (prefill, then the cached decode step) on the accelerator against the
    full forward pass on the accelerator, both at `precision`: each decoded token is the argmax of the forward pass's
    logits at its position, or within `tie` of it (a near-tie that the two computations' rounding may order either
    way), and the engine's log-prob of it is the forward pass's log-softmax there, within `2·tie`. `tie` is the
    logits' bound times their scale, twice (each side may be off by one bound)."""
    import jax
    from maxpost.engine import SamplingParams
    from maxpost.generate import NativeEngine
    acc, _ = dev
    mcfg, params = model_and_params(model_name)
    n_new = SAMPLER_CASES[model_name]
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, mcfg.vocab_size, n).tolist() for n in (5, 11, 17)]
    t0 = time.time()
    model = decoder_on(mcfg, params, acc)
    eng = NativeEngine(model, None, max_batch=4, max_len=64, stop_token_ids=())
    with jax.default_device(acc), precision_ctx(precision):
        res = eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n_new, stop_token_ids=()))
    seqs = [r.prompt_token_ids + r.token_ids for r in res]
    W = max(map(len, seqs))
    toks = np.array([s + [0] * (W - len(s)) for s in seqs])     # right padding: causal, so it changes nothing
    logits = forward_logits(mcfg, params, toks, acc, precision)
    scale = float(np.abs(logits).max())
    tie = 2 * logits_bound(precision, mcfg.num_layers) * scale
    lsm = log_softmax64(logits)
    gaps, dlp, exact, n = [], [], 0, 0
    for i, r in enumerate(res):
        L = len(r.prompt_token_ids)
        for j, t in enumerate(r.token_ids):
            row = logits[i, L - 1 + j]
            gaps.append(float(row.max() - row[t])); exact += int(row.argmax() == t); n += 1
            dlp.append(abs(float(r.logprobs[j]) - float(lsm[i, L - 1 + j, t])))
    kw = dict(test="sampler", model=model_name, precision=precision, tokens=n)
    figure(name="greedy_argmax_agreement", value=exact / n, **kw)
    figure(name="max_logit_gap_to_argmax", value=max(gaps), bound=tie, **kw)
    figure(name="max_abs_dlogprob", value=max(dlp), bound=2 * tie, **kw)
    figure(name="logit_scale", value=scale, **kw)
    figure(name="seconds", value=time.time() - t0, **kw)
    assert max(gaps) <= tie, (max(gaps), tie)
    assert max(dlp) <= 2 * tie, (max(dlp), 2 * tie)


# ------------------------------------------------------------------------------------------ the decode kernel
def decode_attention64(q, prefix, own, starts, layer, step, window, scale, cap):
    """float64 numpy reference of `maxpost.decode_attention.decode_attention` (its docstring has the layout), and the
    same weighted sum of |v| (the scale of each output's rounding)."""
    q, (pk, pv), (ok, ov) = np.float64(q), map(np.float64, prefix), map(np.float64, own)
    B, K, G, hd = q.shape
    U, T = pk.shape[1], pk.shape[3]
    out, scale_out = np.zeros_like(q), np.zeros_like(q)
    for b in range(B):
        u = b // (B // U)
        p0, o0 = max(starts[u], T + step - window + 1), max(0, step - window + 1)
        for k in range(K):
            keys = np.concatenate([pk[layer, u, k, p0:], ok[layer, b, k, o0:step + 1]])
            vals = np.concatenate([pv[layer, u, k, p0:], ov[layer, b, k, o0:step + 1]])
            s = keys @ q[b, k].T * scale                                 # [slots, G]
            if cap: s = cap * np.tanh(s / cap)
            e = np.exp(s - s.max(0))
            out[b, k], scale_out[b, k] = (e / e.sum(0)).T @ vals, (e / e.sum(0)).T @ np.abs(vals)
    return out, scale_out


@pytest.mark.parametrize("case", ["global", "window+cap"])
def test_decode_kernel_against_reference(dev, case):
    """The Pallas decode-attention kernel (`maxpost.decode_attention`; Mosaic on a TPU, Pallas' interpreter in the dry
    run) at Gemma 3 1B's head shapes (1 kv head, 4 query heads of 256), 8 prompts × 4 samples, bfloat16 caches as
    the sampler keeps them, left-padded prompts, against a float64 reference of the same bfloat16 inputs. The kernel
    scores in float32 (bfloat16 products are exact there), rounds the probabilities to bfloat16 for the values'
    matmul (2^-9 each: at most 2^-9 · Σ p|v| in the weighted sum) and its output to bfloat16 (2^-9 of |o| ≤ Σ p|v|):
    bound |Δo| ≤ 2 · 2^-8 · Σ p|v| per output, twice the sum, for the TPU's approximate exp and the float32 sums
    (Σ p|v| ≈ 0.8 here while |o| ≈ 0.1: a wrong mask moves o by about its own size)."""
    import jax, jax.numpy as jnp
    from maxpost.decode_attention import NO_WINDOW, decode_attention
    acc, _ = dev
    L, P, R, K, G, hd, T, N = 2, 8, 4, 1, 4, 256, 128, 256    # P prompts (U is the rounding unit)
    B, rng = P * R, np.random.default_rng(5)
    bf = lambda *shape: np.asarray(jnp.asarray(rng.standard_normal(shape), jnp.bfloat16).astype(jnp.float32))
    q, prefix, own = bf(B, K, G, hd), (bf(L, P, K, T, hd), bf(L, P, K, T, hd)), (bf(L, B, K, N, hd), bf(L, B, K, N, hd))
    starts = rng.integers(0, T // 2, P).astype(np.int32); starts[0] = 0
    window, cap = (NO_WINDOW, None) if case == "global" else (200, 50.0)
    scale, worst, ratio = hd ** -0.5, 0.0, 0.0
    put = lambda x: jax.device_put(jnp.asarray(x, jnp.bfloat16), acc)
    f = jax.jit(lambda q, p, o, st, l, s: decode_attention(q, p, o, st, l, s, window, scale=scale, cap=cap,
                                                           interpret=jax.default_backend() != "tpu"))
    t0 = time.time()
    for layer, step in ((0, 0), (1, 77), (1, N - 1)):
        got = np.asarray(f(put(q), tuple(map(put, prefix)), tuple(map(put, own)), jax.device_put(starts, acc),
                           layer, step), np.float64)
        want, sw = decode_attention64(q, prefix, own, starts, layer, step, window, scale, cap)
        worst = max(worst, float(np.abs(got - want).max()))
        ratio = max(ratio, float((np.abs(got - want) / (2 * U * sw)).max()))      # ≤ 1: within the bound
    kw = dict(test="decode_kernel", model="gemma3-1b heads", precision="bfloat16 caches", case=case)
    figure(name="max_abs_dout", value=worst, **kw)
    figure(name="max_dout_over_bound", value=ratio, bound=1.0, **kw)
    figure(name="seconds", value=time.time() - t0, **kw)
    assert ratio <= 1.0, (ratio, worst)


if __name__ == "__main__":          # without pytest: every case, or those whose name contains argv[1]
    import traceback, jax
    if jax.default_backend() != "tpu" and not DRY:
        sys.exit(print("not a TPU: nothing to run (MAXPOST_TPU_TESTS_ON_CPU=1 runs a dry run on the CPU)"))
    cases = ([(test_logits_against_cpu, dict(model_name=m, precision=p)) for m in LOGIT_CASES for p in PRECISIONS] +
             [(test_trainer_step_against_cpu, dict(kind=k, precision=p))
              for k in ("sft-full", "sft-lora", "dpo", "grpo") for p in PRECISIONS] +
             [(test_sampler_against_forward, dict(model_name=m, precision=p)) for m in SAMPLER_CASES for p in PRECISIONS] +
             [(test_decode_kernel_against_reference, dict(case=c)) for c in ("global", "window+cap")])
    want = sys.argv[1] if len(sys.argv) > 1 else ""
    gen = _dev(); d = next(gen); failed = []
    for fn, kw in cases:
        name = f"{fn.__name__}[{'-'.join(map(str, kw.values()))}]"
        if want not in name: continue
        try: fn(d, **kw); print("PASSED", name, flush=True)
        except Exception: traceback.print_exc(); print("FAILED", name, flush=True); failed.append(name)
    gen.close()
    print(f"{len(failed)} failed" + (": " + ", ".join(failed) if failed else ""))
    sys.exit(1 if failed else 0)
