"""Does the native engine (default `decode`) give bit-identical tokens and log-probs to another checkout's?

    # main before a change, unpacked: git archive main maxpost | tar -x -C /tmp/main_pkg
    PYTHONPATH=/tmp/main_pkg python benchmarks/sampler_same_as.py /tmp/a.npz
    PYTHONPATH=$PWD          python benchmarks/sampler_same_as.py /tmp/b.npz --compare /tmp/a.npz

Generates on this machine's default backend, float32, with `NativeEngine`'s defaults (the `maxpost` package on
PYTHONPATH): greedy 40 tokens, sampled 40 × 2 (temperature 0.8, top-k 20, top-p 0.9) and temperature-1 40 × 2 (both
with sampling log-probs) on tiny-gemma3 and tiny-llama (random init, 4 random prompts of 5..40 tokens) and
SmolLM2-135M (3 chat prompts), and saves every token list, log π and log q. --compare: exit 1 unless every array
equals the other file's bit for bit (`np.array_equal`, same dtype and shape).
"""
import argparse, sys
import numpy as np
import jax
from flax import nnx


def generate() -> dict:
    import maxpost
    from maxpost.checkpoint import load_model
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.engine import SamplingParams, chat_prompt_ids, load_tokenizer
    from maxpost.generate import NativeEngine
    from maxpost.model import Decoder, model_config
    print("maxpost from", maxpost.__file__, "backend", jax.default_backend())
    rng = np.random.default_rng(0)
    cases = {"greedy": SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=()),
             "sampled": SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=40, n=2, seed=3,
                                       stop_token_ids=(), sampling_logprobs=True),
             "t1": SamplingParams(temperature=1.0, max_tokens=40, n=2, seed=5, stop_token_ids=(), sampling_logprobs=True)}
    models = {}
    for name in ("tiny-gemma3", "tiny-llama"):
        cfg = model_config(name)
        models[name] = (Decoder(cfg, rngs=nnx.Rngs(0)),
                        [rng.integers(1, cfg.vocab_size, int(L)).tolist() for L in rng.integers(5, 41, 4)])
    path = embedded_hf("smollm2-135m"); tok = load_tokenizer(path)
    models["smollm2-135m"] = (load_model(path), [chat_prompt_ids(tok, [{"role": "user", "content": q}])
                                                 for q in ("What is 7*8?", "Name a prime.", "Hi!")])
    res = {}
    for name, (m, prompts) in models.items():
        for label, sp in cases.items():
            for i, x in enumerate(NativeEngine(m, None, max_batch=8, max_len=256).generate(prompts, sp)):
                res[f"{name}/{label}/{i}/tok"] = np.array(x.token_ids); res[f"{name}/{label}/{i}/lp"] = x.logprobs
                if x.sampling_logprobs is not None: res[f"{name}/{label}/{i}/lq"] = x.sampling_logprobs
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out"); ap.add_argument("--compare")
    a = ap.parse_args()
    res = generate()
    np.savez(a.out, **res)
    print(f"{len(res)} arrays, {sum(v.size for k, v in res.items() if k.endswith('/tok'))} tokens -> {a.out}")
    if a.compare:
        other = np.load(a.compare)
        if sorted(other.files) != sorted(res):
            sys.exit(f"different cases: {sorted(set(other.files) ^ set(res))}")
        diff = [k for k in res if other[k].dtype != res[k].dtype or other[k].shape != res[k].shape
                or not np.array_equal(other[k], res[k])]
        print(f"against {a.compare}: arrays not bit-identical: {diff or 'none'}")
        sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
