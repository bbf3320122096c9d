"""QLoRA against bfloat16 LoRA on a real model, on the CPU (issue 29, item 2): what the quantized base costs in quality,
in memory and in time, side by side in one run.

1. Logits: the model with its layer weights (wq … w_down) quantized (int8 per output channel; nf4 in blocks of 64,
   with and without double quantization), and with all its weights rounded to bfloat16, against the float32 model on
   check_logits' parity batch (four texts, the longest 600 tokens): mean KL(float32 ‖ variant) per position, top-1
   agreement, max |Δ logit|. Every variant is computed in float32, so the figure is the weights' rounding alone.
2. Training: LoRA SFT (rank 8, lr 1e-3 after no warm-up, bfloat16 compute) on the same GSM8K train batches (2 × 256
   tokens) from the same adapter init, with the frozen base in bfloat16 (the reference: "bfloat16 LoRA"), int8, nf4
   and nf4 + double quantization, each in a fresh subprocess: the loss at each step, its difference from the
   reference, the step time after the first step (compile) and the process's peak RSS. The variants run in two
   rounds in opposite orders; time ratios are the medians of each round's ratio to that round's reference.

    .venv/bin/python benchmarks/qlora_quality.py [--model smollm2-135m] [--steps 6] [--rounds 2] [--json out.json]
"""
import argparse, json, platform, subprocess, sys, textwrap, time
from pathlib import Path

VARIANTS = {"bf16": {}, "int8": {"lora_weight_qtype": "int8"}, "nf4": {"lora_weight_qtype": "nf4"},
            "nf4+dq": {"lora_weight_qtype": "nf4", "lora_double_quant": True}}

CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from maxpost.data import SFTDataIterator
    from maxpost.sft import SFTConfig, SFTTrainer, load_examples
    from maxpost.trainer import load_base
    keys, steps = json.loads(sys.argv[1]), int(sys.argv[2])
    cfg = SFTConfig(**keys)
    mcfg, base, tok_dir = load_base(cfg)
    tr = SFTTrainer(cfg, mcfg, base); del base
    ex = load_examples(cfg, mcfg, tok_dir, "train", 64, 0)
    it = SFTDataIterator(ex, int(cfg.per_device_batch_size), cfg.max_target_length, seed=0)
    state, losses, times = tr.init_state(), [], []
    for _ in range(steps):
        b = next(it); t0 = time.perf_counter()
        state, m = tr.step(state, b)
        losses.append(float(m["loss"])); times.append(time.perf_counter() - t0)
    # VmHWM, the peak RSS of this program since its exec (ru_maxrss would keep the forking parent's peak)
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) * 1024
    print(json.dumps(dict(losses=losses, times=times, peak_rss=hwm)))
""")

def nf4_input_blocks(w, n_in: int, block: int = 64):
    """Reference NF4 with bitsandbytes' block axis, in float64 numpy: blocks of `block` consecutive *input* weights of
    one output (torch's [out, in] row-major order), absmax scale, the nearest NF4 code. maxpost's `quantize` takes
    blocks of consecutive *output* weights of one input instead (its [in, out] row-major order, the layout its
    dequantize + matmul reads); this variant shows what that choice costs or saves on a real model."""
    import numpy as np
    from maxpost.quant import nf4_codebook
    cb = np.asarray(nf4_codebook(), np.float64)
    L, shape = w.shape[0], w.shape[1:]
    n, m = int(np.prod(shape[:n_in])), int(np.prod(shape[n_in:]))
    x = np.asarray(w, np.float64).reshape(L, n, m).transpose(0, 2, 1).reshape(L, m, n // block, block)
    s = np.abs(x).max(-1, keepdims=True)
    idx = np.abs((x / np.where(s > 0, s, 1))[..., None] - cb).argmin(-1)
    return (cb[idx] * s).reshape(L, m, n).transpose(0, 2, 1).reshape(w.shape).astype(np.float32)

def logit_kl(model_name: str, hf) -> dict:
    "Section 1: each variant's logits against the float32 model's on the parity batch."
    import jax.numpy as jnp, ml_dtypes, numpy as np
    from transformers import AutoTokenizer
    from maxpost.checkpoint import load_model, model_params
    from maxpost.convert.check_logits import compare_logits, maxpost_logits, parity_batch
    from maxpost.lora import LORA_IN_AXES
    from maxpost.quant import dequantize_base, quantize_base
    ids, mask = parity_batch(AutoTokenizer.from_pretrained(str(hf)), 600)
    model = load_model(hf)
    params = {k: np.asarray(v) for k, v in model_params(model).items()}
    ref_fn = maxpost_logits(model, ids, mask)
    ref = np.stack([ref_fn(b) for b in range(ids.shape[0])])
    out = {}
    for name, kw in VARIANTS.items():
        if name == "bf16": p = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in params.items()}
        else: p = {k: np.asarray(v, np.float32) for k, v in dequantize_base(quantize_base(
                  params, kw["lora_weight_qtype"], LORA_IN_AXES, double_quant=kw.get("lora_double_quant", False)), jnp.float32).items()}
        for k, v in p.items(): getattr(model, k)[...] = jnp.asarray(v)
        out[name] = compare_logits(ref, maxpost_logits(model, ids, mask), mask)
        print(f"logits {name:7s} KL {out[name]['kl']:.3e}  top-1 {out[name]['top1']:.4f}  max|d| {out[name]['max_abs_diff']:.3f}",
              flush=True)
    name = "nf4, input blocks (numpy reference)"
    for k, v in params.items(): getattr(model, k)[...] = jnp.asarray(nf4_input_blocks(v, LORA_IN_AXES[k]) if k in LORA_IN_AXES else v)
    out[name] = compare_logits(ref, maxpost_logits(model, ids, mask), mask)
    print(f"logits {name} KL {out[name]['kl']:.3e}  top-1 {out[name]['top1']:.4f}  max|d| {out[name]['max_abs_diff']:.3f}", flush=True)
    return out

def train_runs(model_name: str, hf, steps: int, rounds: int) -> dict:
    "Section 2: each variant's LoRA SFT run in a fresh subprocess, `rounds` rounds in alternating order."
    common = dict(model_name=model_name, load_parameters_path=str(hf), use_lora=True, lora_rank=8, dtype="bfloat16",
                  weight_dtype="bfloat16", per_device_batch_size=2, max_target_length=256, learning_rate=1e-3,
                  warmup_steps_fraction=0.0, quantized_base_path="", enable_tqdm=False)
    runs = {k: [] for k in VARIANTS}
    for r in range(rounds):
        for name in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
            t0 = time.time()
            p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(common | VARIANTS[name]), str(steps)],
                               capture_output=True, text=True)
            if p.returncode: raise SystemExit(f"{name} failed:\n{p.stderr[-3000:]}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            runs[name].append(res)
            print(f"round {r} {name:7s} losses {[round(x, 4) for x in res['losses']]} step {sorted(res['times'][1:])[len(res['times'][1:]) // 2]:.3f} s"
                  f" peak RSS {res['peak_rss'] / 2**30:.2f} GiB ({time.time() - t0:.0f} s)", flush=True)
    return dict(config=common, runs=runs)

def summarize(tr: dict) -> dict:
    import numpy as np
    runs, ref = tr["runs"], tr["runs"]["bf16"]
    med = lambda t: float(np.median(t[1:]))
    out = {}
    for name, rs in runs.items():
        d = np.abs(np.asarray(rs[0]["losses"]) - np.asarray(ref[0]["losses"]))
        same = all(r["losses"] == rs[0]["losses"] for r in rs)
        out[name] = dict(losses=rs[0]["losses"], max_abs_loss_diff=float(d.max()),
                         max_rel_loss_diff=float((d / np.asarray(ref[0]["losses"])).max()), deterministic=same,
                         step_ratio=float(np.median([med(r["times"]) / med(q["times"]) for r, q in zip(rs, ref)])),
                         step_seconds=[med(r["times"]) for r in rs], peak_rss_gib=[r["peak_rss"] / 2**30 for r in rs])
    return out

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("--logits-only", action="store_true", help="section 1 only")
    a = ap.parse_args()
    from maxpost.convert.from_gguf import embedded_hf
    hf = embedded_hf(a.model)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    kind = "AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else "AVX2"
    print(f"{a.model}; CPU {cpu} ({kind}), {len(open('/proc/cpuinfo').read().split('processor')) - 1} cores; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    res = dict(model=a.model, cpu=cpu, kind=kind, logits=logit_kl(a.model, hf))
    if a.logits_only: return print(json.dumps(res["logits"], indent=1))
    res["train"] = train_runs(a.model, hf, a.steps, a.rounds)
    res["summary"] = summarize(res["train"])
    for name, s in res["summary"].items():
        print(f"{name:7s} max |loss - bf16 LoRA's| {s['max_abs_loss_diff']:.4f} (relative {s['max_rel_loss_diff']:.4f}); "
              f"step time {s['step_ratio']:.2f}x bf16 LoRA's; peak RSS {max(s['peak_rss_gib']):.2f} GiB; "
              f"same losses in every round: {s['deterministic']}")
    if a.json: Path(a.json).write_text(json.dumps(res, indent=1))

if __name__ == "__main__": main()
