"""SFT throughput on a CPU: maxpost's SFTTrainer against Tunix's PeftTrainer with Tunix's own Gemma 3 model, on the
same weights (the embedded Gemma 3 270M, loaded by each framework from the same HF folder) and the same batch.

    python benchmarks/sft_throughput.py [--mode lora|full] [--batch 2] [--seq 256] [--steps 3] [--dtype float32]
    python benchmarks/sft_throughput.py --rss [--batch 4] [--seq 512]   # peak RSS of a full fine-tune (maxpost CLI)
    python benchmarks/sft_throughput.py --step-hash   # hash of the lowered tiny train step: compare two code versions

Prints maxpost and Tunix tokens/s (median of the timed steps, after one compile step each; the timed steps alternate
between the two so that both run under the same CPU load), the measured peak of a
jnp.dot matmul in the same dtype, the model-flops utilisation 6·N·tokens/s ÷ peak, and the ratio maxpost / Tunix.
Every token of the batch is a real token and every next-token prediction is in the loss, so both do the same work.
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np
import jax
import jax.numpy as jnp
import optax

ROOT = Path(__file__).resolve().parents[1]
LORA_RANK, LORA_ALPHA, LR = 16, 32.0, 1e-4

def matmul_peak(dtype, n: int = 2048, reps: int = 5) -> float:
    "Best FLOP/s of a jitted n×n×n jnp.dot in `dtype` (the CPU's practical peak, under the same load)."
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=dtype))
    f(a, a).block_until_ready()
    best = min(_timed(lambda: f(a, a).block_until_ready()) for _ in range(reps))
    return 2 * n ** 3 / best

def _timed(fn) -> float:
    t = time.perf_counter(); fn(); return time.perf_counter() - t

def make_tokens(vocab: int, batch: int, seq: int) -> np.ndarray:
    "Random token ids [batch, seq] (no padding), avoiding the special ids below 10."
    return np.random.default_rng(0).integers(10, vocab, (batch, seq), dtype=np.int32)

def setup_maxpost(hf_dir, tokens, mode: str, dtype: str):
    "A function that runs one maxpost SFT step on `tokens` and returns its loss (blocking); and N."
    from maxpost.sft import SFTConfig, SFTTrainer, load_base
    B, T = tokens.shape
    cfg = SFTConfig(model_name="gemma3-270m", load_parameters_path=str(hf_dir), use_lora=mode == "lora",
                    lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA, learning_rate=LR, warmup_steps_fraction=0.0,
                    steps=100, per_device_batch_size=B, max_target_length=T, dtype=dtype)
    mcfg, base, _ = load_base(cfg)
    tr = SFTTrainer(cfg, mcfg, base); del base
    targets = np.concatenate([tokens[:, 1:], np.zeros((B, 1), np.int32)], 1)
    mask = np.ones((B, T), np.float32); mask[:, -1] = 0
    batch = dict(inputs=tokens, targets=targets, positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
                 segment_ids=np.ones((B, T), np.int32), loss_mask=mask)
    box = {"state": tr.init_state()}
    def step():
        box["state"], m = tr.step(box["state"], batch)
        return float(m["loss"])
    return step, mcfg.num_params()

def setup_tunix(hf_dir, tokens, mode: str, dtype: str):
    "A function that runs one Tunix PeftTrainer step (its own train loop, one batch) and returns its loss."
    import qwix
    from flax import nnx
    from tunix.models.gemma3 import model as gm, params_safetensors as gp
    from tunix.sft import peft_trainer, utils as su
    B, T = tokens.shape
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    cfg = gm.ModelConfig.gemma3_270m()
    cfg.param_dtype = jnp.dtype(dtype)
    def gen_input(x):
        return dict(input_tokens=x.input_tokens, input_mask=x.input_mask,
                    positions=su.build_positions_from_mask(x.input_mask),
                    attention_mask=su.make_causal_attn_mask(x.input_mask))
    ex = peft_trainer.TrainingInput(input_tokens=jnp.asarray(tokens), input_mask=jnp.ones((B, T), bool))
    with mesh:
        model = gp.create_model_from_safe_tensors(str(hf_dir), cfg, mesh, dtype=jnp.dtype(dtype))
        if mode == "lora":
            prov = qwix.LoraProvider(module_path=".*q_einsum|.*kv_einsum|.*gate_proj|.*down_proj|.*up_proj|"
                                                 ".*attn_vec_einsum", rank=LORA_RANK, alpha=LORA_ALPHA)
            inp = gen_input(ex)
            model = qwix.apply_lora_to_model(model, prov, inp["input_tokens"], inp["positions"], None,
                                             inp["attention_mask"], rngs=nnx.Rngs(0))
            assert jax.tree.leaves(nnx.state(model, nnx.LoRAParam)), "qwix created no LoRA params"
        opt = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(LR, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))
        tr = peft_trainer.PeftTrainer(model, opt, peft_trainer.TrainingConfig(eval_every_n_steps=10**9))
        tr = tr.with_gen_model_input_fn(gen_input)
    tr.is_managed_externally = True          # one call of train() per batch; no max_steps, no close()
    losses, orig = [], tr._buffer_metrics
    def spy(buf, loss, step, additional_metrics=None):
        losses.append(loss); return orig(buf, loss=loss, step=step, additional_metrics=additional_metrics)
    tr._buffer_metrics = spy
    def step():
        with mesh: tr.train([ex])
        return float(jax.block_until_ready(losses[-1]))
    return step

def bench(steps_fns: dict, steps: int) -> dict:
    "First (compiling) step of each, then `steps` rounds that alternate the frameworks, so both see the same load."
    out = {k: {"losses": [], "step_s": []} for k in steps_fns}
    for k, f in steps_fns.items():
        t = time.perf_counter(); out[k]["losses"].append(f()); out[k]["first_step_s"] = time.perf_counter() - t
    for _ in range(steps):
        for k, f in steps_fns.items():
            t = time.perf_counter(); out[k]["losses"].append(f()); out[k]["step_s"].append(time.perf_counter() - t)
    return out

def rss_run(hf_dir, batch: int, seq: int, steps: int = 2) -> dict:
    "Peak RSS of `python -m maxpost.train_sft` doing a full fine-tune of Gemma 3 270M (synthetic ids, float32)."
    out = Path(tempfile.mkdtemp())
    args = ["model_name=gemma3-270m", f"load_parameters_path={hf_dir}", "dataset_type=synthetic",
            "synthetic_task=copy", f"per_device_batch_size={batch}", f"max_target_length={seq}", f"steps={steps}",
            "eval_interval=0", "enable_checkpointing=false", "save_model=false", "enable_tqdm=false",
            "num_train_rows=2048", "run_name=rss", f"base_output_directory={out}"]
    r = subprocess.run([sys.executable, "-m", "maxpost.train_sft", *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode: raise SystemExit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])

def step_hash() -> dict:
    "Hash of the lowered SFT train step (StableHLO, no debug locations) of tiny-gemma3, full and LoRA, and its first loss."
    import hashlib, re
    from maxpost.data import SFTDataIterator
    from maxpost.sft import SFTConfig, SFTTrainer, model_config, random_params, synthetic_examples
    mcfg = model_config("tiny-gemma3"); base = random_params(mcfg, 0)
    b = next(SFTDataIterator(synthetic_examples(64, mcfg.vocab_size, "copy"), 8, 64, seed=0))
    out = {}
    for mode in ("full", "lora"):
        cfg = SFTConfig(model_name="tiny-gemma3", max_target_length=64, per_device_batch_size=8, loss_chunk_size=128,
                        use_lora=mode == "lora", lora_rank=4)
        tr = SFTTrainer(cfg, mcfg, base); st = tr.init_state()
        txt = re.sub(r"loc\([^)]*\)", "", tr._step.lower(st, tr.frozen, tr.put_batch(b)).as_text(debug_info=False))
        _, m = tr.step(st, b)
        out[mode] = {"hlo_sha1": hashlib.sha1(txt.encode()).hexdigest()[:16], "loss": float(m["loss"]),
                     "grad_norm": float(m["grad_norm"])}
    return out

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["lora", "full"], default="lora")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="timed steps after the compile step")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--skip-tunix", action="store_true")
    ap.add_argument("--rss", action="store_true", help="measure peak RSS of a full fine-tune instead")
    ap.add_argument("--step-hash", action="store_true", help="print the hash of the lowered tiny train step instead")
    a = ap.parse_args()
    if a.step_hash:
        print(json.dumps(step_hash())); return
    from maxpost.convert.from_gguf import embedded_hf
    hf_dir = embedded_hf("gemma3-270m")
    if a.rss:
        print(json.dumps(rss_run(hf_dir, a.batch, a.seq))); return
    tokens = make_tokens(262_144, a.batch, a.seq)
    dt = jnp.float32 if a.dtype == "float32" else jnp.bfloat16
    res = {"config": vars(a), "devices": str(jax.devices()), "cpus": os.cpu_count(),
           "load_avg_start": os.getloadavg()}
    res["peak_flops_before"] = matmul_peak(dt)
    fns = {}
    fns["maxpost"], N = setup_maxpost(hf_dir, tokens, a.mode, a.dtype)
    if not a.skip_tunix: fns["tunix"] = setup_tunix(hf_dir, tokens, a.mode, a.dtype)
    for k, v in bench(fns, a.steps).items():
        res[k] = v | {"tokens_per_s": tokens.size / statistics.median(v["step_s"])}
    res["peak_flops_after"] = matmul_peak(dt)
    res["load_avg_end"] = os.getloadavg()
    peak = max(res["peak_flops_before"], res["peak_flops_after"])
    res["n_params"] = N
    for k in ("maxpost", "tunix"):
        if k in res:
            res[k]["mfu_6N"] = 6 * N * res[k]["tokens_per_s"] / peak
            # LoRA never forms the frozen weights' gradients: about 4N flops per token are executed, not 6N
            if a.mode == "lora": res[k]["hfu_4N"] = 4 * N * res[k]["tokens_per_s"] / peak
    if "tunix" in res: res["ratio_maxpost_over_tunix"] = res["maxpost"]["tokens_per_s"] / res["tunix"]["tokens_per_s"]
    print(json.dumps(res, indent=1, default=str))
    print(f"\n{a.mode} SFT, Gemma 3 270M, batch {a.batch} x {a.seq}, {a.dtype}; matmul peak {peak / 1e9:.1f} GFLOP/s")
    for k in ("maxpost", "tunix"):
        if k in res:
            hfu = f"   HFU(4N) {res[k]['hfu_4N']:.3f}" if "hfu_4N" in res[k] else ""
            print(f"  {k:8s} {res[k]['tokens_per_s']:8.1f} tokens/s   MFU(6N) {res[k]['mfu_6N']:.3f}{hfu}   "
                  f"first step {res[k]['first_step_s']:.1f} s   losses {[round(x, 4) for x in res[k]['losses']]}")
    if "tunix" in res: print(f"  maxpost / Tunix = {res['ratio_maxpost_over_tunix']:.2f}")

if __name__ == "__main__":
    main()
