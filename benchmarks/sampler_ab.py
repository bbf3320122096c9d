"""The native sampler before and after the scanned decode (issue 28 item 4), side by side in one process, float32,
on this machine's CPU: the same tokens and log-probs, compile time and tokens/s.

    python benchmarks/sampler_ab.py [--models tiny-gemma3 tiny-llama smollm2-135m] [--prompts 8] [--n 8] [--new 128]
                                    [--reps 2] [--old COMMIT] [--decode auto|scan|unrolled] [--exact] [--skip-speed]

The old engine is `maxpost/generate.py` as of commit `--old` (default 6e261df, the last one with only the unrolled,
fused-weight decode; main's generate.py was the same until the merge of the scanned decode), loaded from git into its
own module; the new one is this checkout's, run with `NativeEngine(decode=--decode)` (default "auto": on a CPU, the
unrolled program; "scan" runs the accelerators' program here). For each model:
- equality: greedy (10 and `--new` tokens) and sampled (temperature 0.8, top-k 20, top-p 0.9, with sampling
  log-probs) generations of both engines on the same prompts, at float32 matmul precision "highest": the tokens must
  be identical and log π, log q agree within float32 rounding (max |Δ| printed; the run fails above 1e-4, or, with
  `--exact`, above 0: bit-identical, as "auto" must be on a CPU);
- speed: `prompts` prompts × `n` samples × `new` tokens at temperature 1 with no stop token (every row runs every
  step), one compiled call; "compile" is the first call's wall time minus the best warm call's; tokens/s is over the
  best of `reps` warm calls, the two engines' calls interleaved so that a busy machine slows both alike.
Tiny models get random prompts of 5..40 tokens; SmolLM2 gets GSM8K chat prompts (as `maxpost.generate.benchmark`).
"""
import argparse, dataclasses, importlib.util, subprocess, sys, time, types
from pathlib import Path
import numpy as np
import jax, jax.numpy as jnp
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]


def old_module(commit: str):
    "maxpost/generate.py at `commit`, imported as maxpost._generate_old (its relative imports resolve in maxpost)."
    src = subprocess.run(["git", "show", f"{commit}:maxpost/generate.py"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    mod = types.ModuleType("maxpost._generate_old"); mod.__package__ = "maxpost"
    sys.modules[mod.__name__] = mod
    exec(compile(src, f"{commit}:maxpost/generate.py", "exec"), mod.__dict__)
    return mod


def load(name: str):
    "(Decoder, tokenizer or None, prompts) for a tiny preset (random init) or a cached real model."
    from maxpost.model import Decoder, model_config, TINY_MODELS
    if name in TINY_MODELS:
        rng = np.random.default_rng(0)
        cfg = model_config(name)
        prompts = [rng.integers(1, cfg.vocab_size, int(L)).tolist() for L in rng.integers(5, 41, 8)]
        return Decoder(cfg, rngs=nnx.Rngs(0)), None, prompts
    from maxpost.checkpoint import load_model
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.engine import chat_prompt_ids, load_tokenizer
    from maxpost.rewards import load_gsm8k, build_prompt
    path = embedded_hf(name)
    tok = load_tokenizer(path)
    prompts = [chat_prompt_ids(tok, build_prompt(r["question"], "maxtext_gsm8k")) for r in load_gsm8k("test", 8)]
    return load_model(path), tok, prompts


def equality(old, new, model, prompts, new_tokens: int, decode: str = "auto", exact: bool = False) -> dict:
    from maxpost.engine import SamplingParams
    out = {}
    greedy = SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=())
    sampled = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=new_tokens, n=2, seed=3,
                             stop_token_ids=(), sampling_logprobs=True)
    cases = {"greedy 10": greedy, f"greedy {new_tokens}": dataclasses.replace(greedy, max_tokens=new_tokens),
             f"sampled {new_tokens} x2": sampled}
    with jax.default_matmul_precision("highest"):
        for label, sp in cases.items():
            a = old.NativeEngine(model, None, max_batch=16, max_len=512).generate(prompts[:4], sp)
            b = new.NativeEngine(model, None, max_batch=16, max_len=512, decode=decode).generate(prompts[:4], sp)
            same = all(x.token_ids == y.token_ids for x, y in zip(a, b))
            dlp = max(float(np.abs(x.logprobs - y.logprobs).max()) for x, y in zip(a, b))
            dlq = max((float(np.abs(x.sampling_logprobs - y.sampling_logprobs).max()) for x, y in zip(a, b)
                       if x.sampling_logprobs is not None), default=0.0)
            out[label] = dict(tokens_equal=same, tokens=sum(len(x.token_ids) for x in a), max_dlogp=dlp, max_dlogq=dlq)
            tol = 0.0 if exact else 1e-4
            assert same and dlp <= tol and dlq <= tol and (dlp < 1e-4 and dlq < 1e-4), (label, out[label])
    return out


def speed(old, new, model, prompts, n: int, new_tokens: int, reps: int, decode: str = "auto") -> dict:
    from maxpost.engine import SamplingParams
    sp = SamplingParams(temperature=1.0, max_tokens=new_tokens, n=n, seed=0, stop_token_ids=())
    engines = {"old": old.NativeEngine(model, None, max_batch=len(prompts) * n, max_len=512),
               "new": new.NativeEngine(model, None, max_batch=len(prompts) * n, max_len=512, decode=decode)}
    first, warm = {}, {k: [] for k in engines}
    for k, e in engines.items():
        t0 = time.perf_counter(); e.generate(prompts, sp); first[k] = time.perf_counter() - t0
    for r in range(reps):
        for k, e in engines.items():
            e.generate(prompts, dataclasses.replace(sp, seed=r + 1)); warm[k].append(e.stats)
    out = {}
    for k in engines:
        best = min(warm[k], key=lambda s: s["seconds"])
        out[k] = dict(first_call_s=round(first[k], 2), compile_s=round(first[k] - best["seconds"], 2),
                      warm_s=round(best["seconds"], 3), tokens=best["tokens"], tokens_per_s=round(best["tokens_per_s"], 1))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["tiny-gemma3", "tiny-llama", "smollm2-135m"])
    ap.add_argument("--prompts", type=int, default=8); ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new", type=int, default=128); ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--old", default="6e261df"); ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--decode", default="auto", choices=["auto", "scan", "unrolled"], help="the new engine's program")
    ap.add_argument("--exact", action="store_true", help="fail unless tokens and log-probs are bit-identical")
    a = ap.parse_args()
    import maxpost.generate as new
    old = old_module(a.old)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {jax.device_count()} device(s); old = {a.old}; "
          f"new: decode={a.decode} (scanned program: {new.use_scan(a.decode)})")
    for name in a.models:
        model, tok, prompts = load(name)
        print(f"== {name}: prompt lengths {[len(p) for p in prompts]}")
        for label, r in equality(old, new, model, prompts, a.new, a.decode, a.exact).items(): print(f"  equal {label}: {r}")
        if not a.skip_speed:
            for k, r in speed(old, new, model, prompts[:a.prompts], a.n, a.new, a.reps, a.decode).items(): print(f"  speed {k}: {r}")


if __name__ == "__main__":
    main()
