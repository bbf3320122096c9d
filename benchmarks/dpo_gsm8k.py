"""DPO and ORPO with LoRA on SmolLM2-135M-Instruct on the offline default pairs (GSM8K: reference solution over the
model's own wrong sample), held-out preference accuracy before and after with 95% Wilson intervals.

    python benchmarks/dpo_gsm8k.py [--algos dpo,orpo] [--out /tmp/dpo_bench] [key=value ...]

Each algorithm runs `maxpost.dpo.train` (the code of `python -m maxpost.train_dpo`) from the same starting model on
the same pairs: `num_train_rows` GSM8K train problems and `num_eval_rows` test problems, each sampled once with the
native engine (temperature 0.7, 256 tokens; cached with provenance under $MAXPOST_CACHE/dpo_pairs; problems the model
solves are left out). It evaluates on the held-out pairs before the first step and after the last, and prints:
  - preference accuracy: chosen response's length-averaged log-prob above the rejected one's, under the policy;
  - rewards/accuracies (TRL): the algorithm's own reward of chosen above rejected (DPO: β·(log π − log π_ref); at
    step 0 every DPO reward is 0 up to rounding, so its "before" is no baseline: compare it with 0.5).
Extra `key=value` arguments override the config (maxpost.dpo.DPOConfig) for every algorithm.
"""
import argparse, json, sys, time
from pathlib import Path

DEFAULTS = ["model_name=smollm2-135m", "use_lora=true", "lora_rank=16", "lora_alpha=32", "learning_rate=5e-4",
            "warmup_steps_fraction=0.1", "steps=24", "per_device_batch_size=4", "max_target_length=384",
            "num_train_rows=64", "num_eval_rows=64", "eval_at_start=true", "save_model=false",
            "checkpoint_period=0", "remat_policy=full", "enable_tqdm=false"]

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algos", default="dpo,orpo")
    ap.add_argument("--out", default="/tmp/maxpost_dpo_bench")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    from maxpost.config import load_config
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.dpo import DPOConfig, train
    from maxpost.metrics import wilson_interval
    from maxpost.train_dpo import default_config
    hf = embedded_hf("smollm2-135m")
    results = {}
    for algo in a.algos.split(","):
        argv = DEFAULTS + [f"load_parameters_path={hf}", f"base_output_directory={a.out}",
                           f"run_name={algo}_{int(time.time())}", f"dpo.algo={algo}"] + a.overrides
        cfg = load_config(DPOConfig, argv, base_yaml=default_config())
        cfg = cfg.model_copy(update={"eval_interval": cfg.steps})
        t0 = time.time(); s = train(cfg); s["seconds"] = round(time.time() - t0, 1)
        n = s["eval_pairs"]; ra = s["eval_rewards/accuracies"]
        s["eval_rewards/accuracies_ci"] = list(wilson_interval(round(ra * n), n))
        s["argv"] = argv; results[algo] = s
        b, f = s["eval_preference_accuracy_initial"], s["eval_preference_accuracy"]
        print(f"{algo}: {s['train_pairs']} train / {n} held-out pairs, {s['steps']} steps in {s['seconds']} s; "
              f"preference accuracy {b[0]:.3f} [{b[1]:.3f}, {b[2]:.3f}] -> {f[0]:.3f} [{f[1]:.3f}, {f[2]:.3f}]; "
              f"rewards/accuracies {ra:.3f} [{s['eval_rewards/accuracies_ci'][0]:.3f}, "
              f"{s['eval_rewards/accuracies_ci'][1]:.3f}]; tokens/s {s['tokens_per_s']}", flush=True)
    out = Path(__file__).parent / "results" / f"dpo_gsm8k_{a.algos.replace(',', '_')}.json"
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {out}")

if __name__ == "__main__": main()
