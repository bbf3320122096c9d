"""On a real chip: does each trainer at its defaults fit, as `python -m maxpost.aot` said, and how fast is it?

Each case runs in its own process (the chip's peak-memory counter cannot be reset), with the trainer exactly as the
command line builds it (`for_backend()` defaults: bfloat16, remat full on a TPU), weights drawn on the device
(`maxpost.trainer.device_params`), and synthetic batches of the full sequence length. It prints one `FIT {json}` line per
case: the aot verdict and HBM figure for the same config (compiled for this chip's topology by libtpu), the chip's
peak HBM in use, whether the step compiled exactly once over all steps, the step time after the first, tokens/s and
MFU (6·N·tokens/s over the bf16 matmul peak measured in the same process).

    python benchmarks/tpu_fit.py                    # every case, gemma3-1b, on the chip at hand
    python benchmarks/tpu_fit.py --model tiny-gemma3 --seq 64 --cases sft_full   # a CPU dry run
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys, time

CASES = {   # name → (mode, key=value …) at the seed's shapes; batches are per chip
    "sft_full": ("train_sft", ["per_device_batch_size=8"]),
    "sft_lora": ("train_sft", ["use_lora=true", "per_device_batch_size=16"]),
    "dpo_full": ("train_dpo", ["per_device_batch_size=4"]),
    "rl_lora": ("train_rl", ["use_lora=true", "batch_size=8", "num_generations=8", "max_prefill_predict_length=256",
                             "max_completion_length=256"]),
}


def matmul_peak() -> float:
    "bf16 matmul FLOP/s of this chip, measured: 8192³ products, best of 5 after a warm-up."
    import jax, jax.numpy as jnp
    n = 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    f = jax.jit(lambda a: (a @ a).sum())
    f(a).block_until_ready()
    best = min(_timed(lambda: f(a).block_until_ready()) for _ in range(5))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter(); fn(); return time.perf_counter() - t0


def synthetic(B: int, T: int, vocab: int, seed: int = 0) -> dict:
    "A host batch of B full rows of T tokens (one segment each, loss on the second half)."
    import numpy as np
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, (B, T + 1)).astype(np.int32)
    mask = np.zeros((B, T), np.float32); mask[:, T // 2:] = 1
    return {"inputs": ids[:, :-1], "targets": ids[:, 1:], "positions": np.tile(np.arange(T, dtype=np.int32), (B, 1)),
            "segment_ids": np.ones((B, T), np.int32), "loss_mask": mask}


def run_case(name: str, model: str, seq: int, steps: int, with_aot: bool = False) -> dict:
    import jax, numpy as np
    from maxpost import aot
    mode, args = CASES[name]
    argv = [f"model_name={model}", *args, *([f"max_target_length={seq}"] if mode != "train_rl" else [])]
    rec = {"case": name, "model": model, "argv": argv, "device": str(jax.devices()[0].device_kind),
           "backend": jax.default_backend()}
    if with_aot and jax.default_backend() == "tpu":      # the same compile again: costs a minute a case
        kind = jax.devices()[0].device_kind
        topo = {"TPU v5 lite": "v5e-1", "TPU v6 lite": "v6e-1"}.get(kind)
        if topo:
            a = aot.check(mode, argv, topo, quiet=True)
            rec["aot"] = {"fits": a["fits"], "why": a["why"],
                          "programs": {p["program"]: p.get("hbm", {}).get("total") for p in a["programs"]}}
    cls, yml, _, _ = aot._modes()[mode]
    from maxpost.config import load_config
    cfg = load_config(cls, argv + ["enable_tqdm=false"], base_yaml=yml).for_backend()
    rec |= {"dtype": cfg.dtype, "weight_dtype": cfg.weight_dtype, "remat_policy": cfg.remat_policy}
    mesh = cfg.mesh()
    from maxpost.trainer import load_base
    t0 = time.perf_counter()
    mcfg, base, _ = load_base(cfg, mesh)
    rec["init_s"] = round(time.perf_counter() - t0, 1)
    n_params = mcfg.num_params()
    times, losses = [], []
    try:
        if mode in ("train_sft", "train_dpo"):
            if mode == "train_sft":
                from maxpost.sft import SFTTrainer as Tr
            else:
                from maxpost.dpo import DPOTrainer as Tr
            tr = Tr(cfg, mcfg, base, mesh); del base
            state = tr.init_state()
            B = int(round(cfg.per_device_batch_size * mesh.size))
            rows = 2 * B if mode == "train_dpo" else B
            batch = synthetic(rows, cfg.max_target_length, mcfg.vocab_size)
            if mode == "train_dpo": batch["ref_logps"] = np.zeros(rows, np.float32)
            for s in range(steps):
                t0 = time.perf_counter()
                state, m = tr.step(state, batch)
                losses.append(float(m["loss"])); times.append(time.perf_counter() - t0)
            rec["compiles"] = tr._step._cache_size()
            tokens = rows * cfg.max_target_length
        else:
            from maxpost.rl.config import loss_config
            from maxpost.rl.trainer import RLTrainer
            from maxpost.checkpoint import empty_decoder
            from maxpost.engine import make_engine
            from maxpost.generate import SamplingParams
            tr = RLTrainer(cfg, loss_config(cfg), mcfg, base, mesh); del base
            state = tr.init_state()
            R = cfg.batch_size * cfg.num_generations // cfg.num_minibatches
            T = cfg.max_prefill_predict_length + cfg.max_completion_length
            b = synthetic(R, T, mcfg.vocab_size)
            mb = {k: b[k] for k in ("inputs", "targets", "positions", "segment_ids")}
            uniform = np.full((R, T), -np.log(mcfg.vocab_size), np.float32)   # a random model's log-probs, about
            mb |= {"completion_mask": b["loss_mask"], "engine_logps": uniform,     # (zeros would make KL and the
                   "advantages": np.random.default_rng(1).standard_normal(R).astype(np.float32)}   # ratios explode)
            if tr.recompute_old: mb["old_logps"] = uniform
            if tr.use_ref: mb["ref_logps"] = uniform
            eng = make_engine("native", empty_decoder(mcfg, tr.dtype, tr.wdtype), None, max_batch=R, max_len=T,
                              max_prefill=cfg.max_prefill_predict_length, stop_token_ids=())
            eng.sync_weights(tr.host_engine_params(state))
            prompts = [list(np.random.default_rng(i).integers(4, mcfg.vocab_size, cfg.max_prefill_predict_length))
                       for i in range(cfg.batch_size)]
            sp = SamplingParams(n=cfg.num_generations, max_tokens=cfg.max_completion_length, temperature=1.0, seed=0)
            gen_t = []
            for s in range(2):
                t0 = time.perf_counter(); out = eng.generate(prompts, sp); gen_t.append(time.perf_counter() - t0)
            rec["sampler_s"] = round(gen_t[-1], 3)
            rec["sampler_tokens_per_s"] = round(sum(len(r.token_ids) for r in out) / gen_t[-1], 1)
            dev = tr.put(mb)
            for s in range(steps):
                t0 = time.perf_counter()
                state, m = tr.update(state, dev)
                losses.append(float(m["loss"])); times.append(time.perf_counter() - t0)
            rec["compiles"] = tr._update._cache_size()
            tokens = R * T
        rec["ok"] = True
    except Exception as e:   # out of memory on the chip, or anything else: recorded, not hidden
        rec["ok"] = False; rec["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400]}"
    if times:
        rec["losses"] = [round(x, 5) for x in losses]
        rec["first_step_s"] = round(times[0], 2)
        if len(times) > 1:
            st = sorted(times[1:])[len(times[1:]) // 2]
            rec["step_s"] = round(st, 4); rec["tokens_per_s"] = round(tokens / st, 1)
            if jax.default_backend() == "tpu":
                peak = matmul_peak(); rec["bf16_peak_tflops"] = round(peak / 1e12, 1)
                rec["mfu_6n"] = round(6 * n_params * tokens / st / peak, 3)
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        rec["peak_hbm_gib"] = round(stats["peak_bytes_in_use"] / 2 ** 30, 3)
        rec["hbm_limit_gib"] = round(stats.get("bytes_limit", 0) / 2 ** 30, 3)
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-1b")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--aot", action="store_true", help="also run maxpost.aot's check for this chip in each case")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per case")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print("FIT " + json.dumps(run_case(a.one, a.model, a.seq, a.steps, a.aot)), flush=True); return
    for name in a.cases.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--model", a.model, "--seq", str(a.seq), "--steps", str(a.steps)]
        try: r = subprocess.run(cmd + (["--aot"] if a.aot else []), capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print("FIT " + json.dumps({"case": name, "ok": False, "error": f"timed out after {a.timeout:g} s"}), flush=True)
            continue
        lines = [l for l in r.stdout.splitlines() if l.startswith("FIT ")]
        print(lines[-1] if lines else "FIT " + json.dumps({"case": name, "ok": False, "rc": r.returncode,
                                                            "stderr": r.stderr[-1500:]}), flush=True)


if __name__ == "__main__":
    main()
