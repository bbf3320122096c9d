"""The full version of `make demo`'s RL stage: does GRPO raise a real model's held-out accuracy beyond its CI?

SmolLM2-135M-Instruct (embedded GGUF) → LoRA SFT on `maxpost.arithmetic` (generated word problems, seeded
train/held-out split) → GRPO with LoRA on the SFT model → greedy pass@1 of the shipped, SFT and GRPO models on the
first `num_eval_rows` held-out problems (default 500), with Wilson intervals and paired bootstrap gains.

    python benchmarks/rl_arithmetic_smollm2.py [key=value …]     # any maxpost.demo key overrides the defaults below

    python benchmarks/rl_arithmetic_smollm2.py --evaluate-only [key=value …]   # re-run only the evaluation of the
                                                    # shipped, SFT and GRPO models an earlier run left in its folder

    python benchmarks/rl_arithmetic_smollm2.py --arms baseline,packed_sync,packed_one_step_off [key=value …]
        # the RL loop's variants side by side (issue 15): SFT once (stage `sft`), then GRPO per arm from that SFT
        # model with the same prompts and seeds (stage `rl`, only the arms named), then greedy pass@1 of the SFT
        # model and of every arm trained so far on the same held-out problems (stage `evaluate`), with paired
        # differences between arms; steps/hour and the mean split of a step per arm, reward curves in one PNG
        # (--png). `stages=sft` / `stages=rl --arms a` / `stages=evaluate` split the work into separate runs.

It is `maxpost.demo` with larger budgets (the same code path as `make demo`), so the report lands in
`<base_output_directory>/<run_name>/report.{md,json,png}`. It exits 0 whether or not GRPO helped, and prints the verdict.
"""
import json, sys, platform, time
from pathlib import Path
from maxpost.config import load_config, output_dir
from maxpost.convert.from_gguf import embedded_hf
from maxpost.demo import DemoConfig, checks, evaluate_stage, format_report, run, rl_stage, sft_stage

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

# the RL loop's variants (maxpost.rl.config keys); baseline: the loop before issue 15 (fixed-shape update, no
# engine-mismatch correction, rollout then update in turn)
ARMS = {"baseline": ("packing=false", "importance_sampling_mode=off", "rollout_mode=sync"),
        "packed_sync": ("packing=true", "importance_sampling_mode=auto", "rollout_mode=sync"),
        "packed_one_step_off": ("packing=true", "importance_sampling_mode=auto", "rollout_mode=one_step_off")}
SPLIT = ("step", "rollout", "reward", "reference", "update", "rollout_wait", "sync")

def _ci(v): return f"{v['value']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]"

def arms(c: DemoConfig, names: list[str], png: str) -> dict:
    "SFT once, GRPO per arm from the same SFT model, evaluation of all arms trained so far; report_arms.{md,json}."
    import os
    import numpy as np
    from maxpost.evaluate import compare_runs
    bad = [n for n in names if n not in ARMS]
    assert not bad, f"unknown arm(s) {bad}; arms: {', '.join(ARMS)}"
    out = output_dir(c.base_output_directory, c.run_name).absolute(); out.mkdir(parents=True, exist_ok=True)
    stages = [s.strip() for s in c.stages.split(",")]
    if "sft" in stages:
        t0 = time.time(); (out / "sft.json").write_text(json.dumps(sft_stage(c, out) | {"seconds": time.time() - t0}, default=str))
    sft = json.loads((out / "sft.json").read_text())["model_dir"]
    if "rl" in stages:
        for n in names:
            load0, t0 = os.getloadavg(), time.time()
            r = rl_stage(c, out, sft, run_name=f"rl_{n}", overrides=ARMS[n])
            recs = [json.loads(l) for l in (Path(r["run_dir"]) / "metrics.jsonl").read_text().splitlines() if l.strip()]
            timed = recs[1:]                                  # step 1 compiles
            r |= dict(overrides=ARMS[n], seconds=time.time() - t0, load_before=load0, load_after=os.getloadavg(),
                      split_s={k: float(np.mean([m.get(f"time/{k}", 0.0) for m in timed])) for k in SPLIT},
                      first_step_s=recs[0]["time/step"], format_reward=[m["rewards/gsm8k_plain_format/mean"] for m in recs],
                      completion_length=[m["completion_length_mean"] for m in recs],
                      staleness=[m["staleness"] for m in recs],
                      logp_diff=[m.get("sampling/sampling_logp_difference/mean") for m in recs])
            r["steps_per_hour"] = 3600 / r["split_s"]["step"]
            (out / f"arm_{n}.json").write_text(json.dumps(r, default=str))
            print(f"[arms] {n}: {r['steps_per_hour']:.0f} steps/h (steps 2-{len(recs)}), split s/step "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["split_s"].items()) + f"; load {load0[0]:.1f}", flush=True)
    done = {n: json.loads((out / f"arm_{n}.json").read_text()) for n in ARMS if (out / f"arm_{n}.json").exists()}
    models = {n: a["model_dir"] for n, a in done.items()} | {"sft": sft}    # one file per model: a cut run keeps its models
    for n, path in models.items():
        f = out / f"evaluate_{n}.json"
        if "evaluate" in stages and not f.exists():
            load0, t0 = os.getloadavg(), time.time(); e = evaluate_stage(c, out, {n: path})[n]
            f.write_text(json.dumps(e | {"seconds": time.time() - t0, "load_before": load0, "load_after": os.getloadavg()}))
            print(f"[arms] evaluated {n}: {time.time() - t0:.0f} s, load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    ev = {n: json.loads((out / f"evaluate_{n}.json").read_text()) for n in models if (out / f"evaluate_{n}.json").exists()}
    if not ev: return done
    L = [f"| arm | steps/h (2-{c.rl_steps}) | s/step | " + " | ".join(SPLIT[1:]) + " | first step s | accuracy [95% Wilson] | "
         "format accuracy | GRPO - SFT (paired) |", "|" + "---|" * (len(SPLIT) + 6)]
    if "sft" in ev:
        L.append(f"| sft (start) | | | " + " | " * (len(SPLIT) - 1) + f" | {_ci(ev['sft']['summary']['accuracy'])} | "
                 f"{_ci(ev['sft']['summary']['format_accuracy'])} | |")
    for n, a in done.items():
        if n not in ev: continue
        s = ev[n]["summary"]
        g = compare_runs(out / "eval_sft" / "completions.jsonl", out / f"eval_{n}" / "completions.jsonl") if "sft" in ev \
            else {"accuracy_difference": None}
        L.append(f"| {n} | {a['steps_per_hour']:.0f} | {a['split_s']['step']:.2f} | "
                 + " | ".join(f"{a['split_s'][k]:.2f}" for k in SPLIT[1:]) + f" | {a['first_step_s']:.1f} | "
                 f"{_ci(s['accuracy'])} | {_ci(s['format_accuracy'])} | {_ci(g['accuracy_difference']) if g['accuracy_difference'] else ''} |")
    L.append("")
    names_ev = [n for n in done if n in ev]                      # the arms, paired two by two
    for i, x in enumerate(names_ev):
        for y in names_ev[i + 1:]:
            g = compare_runs(out / f"eval_{x}" / "completions.jsonl", out / f"eval_{y}" / "completions.jsonl")
            L.append(f"paired over {g['n_problems']} problems, {y} - {x}: accuracy {_ci(g['accuracy_difference'])}; "
                     f"identical completions {g['identical']:.3f}, same correctness {g['same_correct']:.3f}")
    text = "\n".join(L); (out / "report_arms.md").write_text(text + "\n"); print(text)
    import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n, a in done.items():
        x = range(1, len(a["reward"]) + 1)
        axes[0].plot(x, a["answer"], marker=".", label=n); axes[1].plot(x, a["format_reward"], marker=".", label=n)
    for ax, t in zip(axes, ("answer reward", "format reward")):
        ax.set_xlabel("GRPO step"); ax.set_title(f"{t} (mean of the step's samples)"); ax.legend()
    fig.suptitle("SmolLM2-135M arithmetic GRPO from one SFT model: loop variants"); fig.tight_layout(); fig.savefig(png, dpi=100)
    print(f"report: {out / 'report_arms.md'}; plot: {png}")
    return done

FULL = ["stages=sft,rl,evaluate", "base_output_directory=runs", "run_name=rl_arithmetic_smollm2",
        "sft_steps=8", "rl_steps=12", "rl_prompts=4", "rl_generations=4", "rl_learning_rate=5e-5",
        "num_eval_rows=500", "sft_eval_rows=64"]

if __name__ == "__main__":
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in open("/proc/cpuinfo").read()]
    print(f"cpu: {platform.processor() or platform.machine()}, flags: {' '.join(flags)}", flush=True)
    only = "--evaluate-only" in sys.argv; argv = [a for a in sys.argv[1:] if a != "--evaluate-only"]
    opt = lambda k, d: argv[argv.index(k) + 1] if k in argv else d
    names, png = opt("--arms", None), opt("--png", "benchmarks/results/rl_arithmetic_arms.png")
    argv = [a for i, a in enumerate(argv) if a not in ("--arms", "--png") and (i == 0 or argv[i - 1] not in ("--arms", "--png"))]
    t0 = time.time(); c = load_config(DemoConfig, FULL + argv)
    if names:
        arms(c, names.split(","), png); print(f"wall: {time.time() - t0:.0f} s"); sys.exit(0)
    rep = evaluate_only(c) if only else run(c)
    g = rep.get("gains", {}).get("grpo - sft")
    if g:
        verdict = "raised" if g["ci"][0] > 0 else "lowered" if g["ci"][1] < 0 else "did not change (within the CI)"
        print(f"GRPO {verdict} held-out accuracy: GRPO - SFT {g['value']:+.3f} [{g['ci'][0]:+.3f}, {g['ci'][1]:+.3f}]")
    print(f"wall: {time.time() - t0:.0f} s")
