"""GRPO with LoRA on SmolLM2-135M-Instruct on GSM8K for a fixed wall-clock budget, evaluated before and after.

    python benchmarks/rl_gsm8k_smollm2.py --minutes 30 [--out /tmp/rl_bench] [key=value ...]

Trains with `maxpost.rl.train` (the code of `python -m maxpost.train_rl`) for `--minutes` (at most 30) of RL steps,
evaluates greedily on a fixed slice of the GSM8K test split (`num_eval_rows`, first rows) before and after, and prints
accuracy and format accuracy with 95% Wilson intervals and the fraction of step time spent in rollout, reward,
reference/old log-probs, update and weight sync. Extra `key=value` arguments override the config (maxpost.rl.RLConfig).
Defaults (each overridable): GRPO with β = 0 (no reference pass: the budget goes to rollouts and updates), LoRA
rank 16 / α 32 at lr 5e-4, 2 prompts × 8 samples per step, one solved GSM8K train example before each question
(`few_shot=1`: with the bare prompt, SmolLM2-135M never wrote a format tag in 48 samples at temperature 1, so every
group had zero reward variance and nothing could be learned; with the example about 30 % of samples earn partial
format credit), completions of at most 160 tokens, rewards answer + exact format + per-tag format, weighted 1:1:1.
`remat_policy=full` is on: without it the backward pass of 16 rows × 576 tokens keeps every layer's attention
probabilities and asked for a 28.7 GB buffer on the 24 GB development machine (measured, see RESULTS_rl.md).
"""
import argparse, json, sys, time
from pathlib import Path

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="training budget in minutes (max 30)")
    ap.add_argument("--out", default="/tmp/maxpost_rl_bench", help="base_output_directory")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the RL config")
    a = ap.parse_args()
    if not 0 < a.minutes <= 30: ap.error("--minutes must be in (0, 30]")
    from maxpost.config import load_config
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.rl import RLConfig, train
    from maxpost.train_rl import default_config
    import jax
    hf = embedded_hf("smollm2-135m")
    base = ["model_name=smollm2-135m", f"load_parameters_path={hf}", f"base_output_directory={a.out}",
            f"run_name=smollm2_grpo_lora_{int(time.time())}", "loss_algo=grpo", "beta=0", "use_lora=true",
            "lora_rank=16", "lora_alpha=32", "learning_rate=5e-4", "batch_size=2", "num_generations=8",
            "few_shot=1", "max_prefill_predict_length=320", "max_completion_length=160", "num_eval_rows=128",
            "remat_policy=full", "reward_functions=gsm8k_answer,gsm8k_exact_format,gsm8k_approx_format",
            "reward_weights=1,1,1", "steps=100000", f"max_train_seconds={a.minutes * 60}",
            "checkpoint_period=1000000", "save_model=false", "enable_tqdm=false", "log_completions=4"]
    cfg = load_config(RLConfig, base + a.overrides, base_yaml=default_config())
    t0 = time.perf_counter()
    res = train(cfg)
    wall = time.perf_counter() - t0
    t = res["time_s"]
    step_total = t.get("step", sum(v for k, v in t.items() if k != "step")) or 1.0
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}); {res['steps']} RL steps in "
          f"{args_budget(a)} budget; whole run {wall:.0f} s (evaluations and compiles included)")
    print("| metric | before | after |\n|---|---|---|")
    for k in ("gsm8k_answer", "gsm8k_exact_format", "gsm8k_approx_format", "total", "completion_length_mean",
              "truncation_rate"):
        b, f = res["before"].get(k), res["after"].get(k)
        if b is None: continue
        ci = lambda s: f"{s['mean']:.3f}" + (f" [{s['lo']:.3f}, {s['hi']:.3f}]" if s["lo"] is not None else "")
        print(f"| {k} | {ci(b)} | {ci(f)} |")
    print("step time split: " + ", ".join(f"{k} {100 * v / step_total:.1f}%" for k, v in t.items() if k != "step")
          + f" (of {step_total:.0f} s over {res['steps']} steps)")
    print(json.dumps({"summary": {k: v for k, v in res.items() if k not in ("before", "after")}}))

def args_budget(a): return f"{a.minutes:g}-minute"

if __name__ == "__main__": main()
