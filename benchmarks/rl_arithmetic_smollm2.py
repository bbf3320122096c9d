"""The full version of `make demo`'s RL stage: does GRPO raise a real model's held-out accuracy beyond its CI?

SmolLM2-135M-Instruct (embedded GGUF) → LoRA SFT on `maxpost.arithmetic` (generated word problems, seeded
train/held-out split) → GRPO with LoRA on the SFT model → greedy pass@1 of the shipped, SFT and GRPO models on the
first `num_eval_rows` held-out problems (default 500), with Wilson intervals and paired bootstrap gains.

    python benchmarks/rl_arithmetic_smollm2.py [key=value …]     # any maxpost.demo key overrides the defaults below

    python benchmarks/rl_arithmetic_smollm2.py --evaluate-only [key=value …]   # re-run only the evaluation of the
                                                    # shipped, SFT and GRPO models an earlier run left in its folder

It is `maxpost.demo` with larger budgets (the same code path as `make demo`), so the report lands in
`<base_output_directory>/<run_name>/report.{md,json,png}`. It exits 0 whether or not GRPO helped, and prints the verdict.
"""
import json, sys, platform, time
from maxpost.config import load_config, output_dir
from maxpost.convert.from_gguf import embedded_hf
from maxpost.demo import DemoConfig, checks, evaluate_stage, format_report, run

def evaluate_only(c: DemoConfig) -> dict:
    "The evaluate stage alone, on the models an earlier run of this script saved under its run folder."
    out = output_dir(c.base_output_directory, c.run_name).absolute()
    models = {"shipped": embedded_hf(c.model), "sft": out / "sft" / "model", "grpo": out / "rl" / "model"}
    for k, v in models.items(): assert (k == "shipped" or v.exists()), f"no {k} model at {v}: run the full script first"
    t0 = time.time(); rep = {"config": c.model_dump(), "evaluate": evaluate_stage(c, out, models)}
    rep["seconds"] = {"evaluate": time.time() - t0}; rep["checks"] = checks(rep)
    text = format_report(rep); (out / "report_evaluate.md").write_text(text + "\n")
    (out / "report_evaluate.json").write_text(json.dumps(rep, indent=1, default=str)); print(text)
    return rep

FULL = ["stages=sft,rl,evaluate", "base_output_directory=runs", "run_name=rl_arithmetic_smollm2",
        "sft_steps=8", "rl_steps=12", "rl_prompts=4", "rl_generations=4", "rl_learning_rate=5e-5",
        "num_eval_rows=500", "sft_eval_rows=64"]

if __name__ == "__main__":
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in open("/proc/cpuinfo").read()]
    print(f"cpu: {platform.processor() or platform.machine()}, flags: {' '.join(flags)}", flush=True)
    only = "--evaluate-only" in sys.argv; argv = [a for a in sys.argv[1:] if a != "--evaluate-only"]
    t0 = time.time(); c = load_config(DemoConfig, FULL + argv)
    rep = evaluate_only(c) if only else run(c)
    g = rep.get("gains", {}).get("grpo - sft")
    if g:
        verdict = "raised" if g["ci"][0] > 0 else "lowered" if g["ci"][1] < 0 else "did not change (within the CI)"
        print(f"GRPO {verdict} held-out accuracy: GRPO - SFT {g['value']:+.3f} [{g['ci'][0]:+.3f}, {g['ci'][1]:+.3f}]")
    print(f"wall: {time.time() - t0:.0f} s")
