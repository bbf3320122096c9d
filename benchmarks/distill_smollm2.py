"""Distillation on a real model, on the CPU: does a half-depth SmolLM2 student learn more from the teacher's
distributions than from the labels alone, in the same steps on the same data?

    nice -n 10 python benchmarks/distill_smollm2.py [--out DIR] [--teacher PATH] [--steps N] [--keep K] [--lr LR]
        [--eval-rows N] [--distill "key=value …"] [key=value …]   # key=value: maxpost.demo keys (the teacher's
        SFT, the evaluation); --distill: train_distill keys after the default forward_kl, α = 0.5 (e.g. GKD's
        "distill_loss=jsd distill_jsd_beta=0.5 distill_on_policy_prob=0.5")
    python benchmarks/distill_smollm2.py --out DIR --teacher PATH --held-out-kl   # then: both students' held-out
        KL(teacher ‖ student) and NLL on the 64 held-out examples the runs evaluated (`DIR/held_out_kl.json`)

1. Teacher: SmolLM2-135M-Instruct after `make demo`'s SFT stage (`maxpost.demo.sft_stage`: LoRA, 8 steps of 4 × 256
   packed tokens of `maxpost.arithmetic`, merged), or the checkpoint `--teacher` names (e.g. a demo's `runs/demo/sft/model`).
2. Student: `maxpost.distill.drop_layers` of the teacher, `--keep` of its 30 layers (default 15: evenly spaced, the
   first and the last kept), saved as a maxpost checkpoint (`student_init`).
3. Two runs from that student, full fine-tuning, the same `--steps` steps on the same batches (the same data seed,
   batch 4 × 256 packed tokens, `--lr`): SFT on the labels (`maxpost.sft.train`, `python -m maxpost.train_sft`'s
   code) and distillation from the teacher (`maxpost.distill.train`, `python -m maxpost.train_distill`'s code:
   forward KL, α = 0.5, τ = 1).
4. Greedy pass@1 of teacher, student before training, SFT-only student and distilled student on the first
   `--eval-rows` held-out problems (`maxpost.demo.evaluate_stage`), Wilson 95 % intervals, and the paired bootstrap
   difference distilled − SFT-only over the same problems.

Writes `<out>/report.json`, `<out>/report.md` and `<out>/curves.png` (both students' training and held-out losses).
Exits 0 whichever student wins, and prints the verdict.
"""
import json, platform, subprocess, sys, time
from pathlib import Path

import numpy as np

from maxpost.config import load_config
from maxpost.demo import DemoConfig, evaluate_stage, sft_stage
from maxpost.metrics import paired_difference


def opt(argv, flag, default, cast=str):
    "The value after `flag` in argv (removed from it), else `default`."
    if flag not in argv: return default
    i = argv.index(flag); v = argv[i + 1]; del argv[i:i + 2]
    return cast(v)

def records(run_dir) -> list[dict]:
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]

def student_args(out: Path, start: Path, name: str, steps: int, lr: float, c: DemoConfig) -> list[str]:
    "The key=values both students share: same start, data, batches, optimizer; full fine-tuning."
    return ["model_name=", f"load_parameters_path={start}", f"base_output_directory={out}", f"run_name={name}",
            "dataset_type=arithmetic", f"prompt_template={c.template}", f"steps={steps}",
            f"per_device_batch_size={c.sft_batch}", f"max_target_length={c.sft_seq}", "use_lora=false",
            f"learning_rate={lr}", "warmup_steps_fraction=0.125", f"eval_interval={steps}",
            f"num_eval_rows={c.sft_eval_rows}", "enable_checkpointing=false", "save_model=true", "enable_tqdm=false"]

def make_student(teacher: Path, dest: Path, keep: int) -> dict:
    "The layer-dropped copy of the teacher, saved with its tokenizer."
    from maxpost.checkpoint import load_any, save_checkpoint
    from maxpost.distill import drop_layers, keep_layers
    params, mcfg, tok = load_any(teacher)
    smcfg, sp = drop_layers(params, mcfg, keep)
    save_checkpoint(dest, sp, smcfg, tokenizer_dir=tok, overwrite=True)
    return dict(layers=keep_layers(mcfg.num_layers, keep), teacher_layers=mcfg.num_layers,
                teacher_params=mcfg.num_params(), student_params=smcfg.num_params())

def held_out_kl(out: Path, teacher, c: DemoConfig, model_dir) -> dict:
    "Held-out KL(teacher ‖ model) and NLL of a trained student, on the runs' held-out examples (`DistillTrainer.evaluate`)."
    from maxpost.data import SFTDataIterator
    from maxpost.distill import DistillConfig, DistillTrainer, load_examples, load_teacher
    from maxpost.sft import batch_rows, train_eval_examples
    from maxpost.trainer import load_base
    from maxpost.train_distill import default_config as distill_yml
    cfg = load_config(DistillConfig, [*student_args(out, model_dir, "kl_eval", 1, 1e-4, c),
                                      f"teacher_load_parameters_path={teacher}"], base_yaml=distill_yml())
    mcfg, params, tok = load_base(cfg); tmcfg, tparams = load_teacher(cfg, mcfg)
    _, eval_ex = train_eval_examples(cfg, mcfg, tok, load_examples)
    tr = DistillTrainer(cfg, mcfg, params, tmcfg, tparams)
    B, _ = batch_rows(cfg, tr.mesh)
    return tr.evaluate(tr.init_state(), SFTDataIterator(eval_ex, B, cfg.max_target_length, seed=0, pack=cfg.packing,
                                                        num_epochs=1))

def _ci(v): return f"{v['value']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]"

def report(rep: dict) -> str:
    ev, s = rep["evaluate"], rep["student"]
    L = [f"teacher: {rep['teacher']} ({s['teacher_layers']} layers, {s['teacher_params'] / 1e6:.1f} M parameters); "
         f"student: {len(s['layers'])} layers {s['layers']} ({s['student_params'] / 1e6:.1f} M parameters); "
         f"{rep['steps']} steps; distillation keys: {' '.join(rep.get('distill_keys', []))}", "",
         f"| model | accuracy [95% Wilson] | format accuracy | mean length | held-out NLL after training |",
         "|---|---|---|---|---|"]
    nll = {"student_sft": rep["sft"]["eval_loss"], "student_distilled": rep["distill"]["eval_sft_loss"]}
    for k, v in ev.items():
        L.append(f"| {k} | {_ci(v['summary']['accuracy'])} | {_ci(v['summary']['format_accuracy'])} | "
                 f"{v['summary']['mean_response_length']['value']:.1f} | {nll.get(k, float('nan')):.3f} |")
    L.append("")
    for k, g in rep["gains"].items(): L.append(f"paired over {rep['eval_rows']} problems, {k}: {_ci(g)}")
    d = rep["distill"]
    L.append(f"distilled student's held-out KL(teacher ‖ student): {d['eval_distill_loss_initial']:.3f} before, "
             f"{d['eval_distill_loss']:.3f} after")
    L.append("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in rep["seconds"].items()))
    return "\n".join(L)

def plot(rep: dict, path: Path):
    import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for k, lab in (("sft", "SFT-only student"), ("distill", "distilled student")):
        r = rep["curves"][k]; x = range(1, len(r["loss"]) + 1)
        axes[0].plot(x, r["hard_loss"] if r.get("hard_loss") else r["loss"], marker=".", label=lab)
    axes[0].set_xlabel("step"); axes[0].set_title("training NLL on the labels (each step's batch)"); axes[0].legend()
    ev = rep["evaluate"]; names = list(ev)
    m = np.array([ev[n]["summary"]["accuracy"]["value"] for n in names])
    ci = np.array([ev[n]["summary"]["accuracy"]["ci"] for n in names])
    axes[1].bar(names, m, yerr=np.clip([m - ci[:, 0], ci[:, 1] - m], 0, None), capsize=4, color="#4a7ebb")
    axes[1].set_ylim(0, 1); axes[1].set_title(f"held-out accuracy, {rep['eval_rows']} problems, 95% CI")
    axes[1].tick_params(axis="x", labelsize=8)
    fig.tight_layout(); fig.savefig(path, dpi=100)

def main(argv: list[str]):
    out = Path(opt(argv, "--out", "runs/distill_smollm2")).absolute(); out.mkdir(parents=True, exist_ok=True)
    teacher = opt(argv, "--teacher", None)
    steps, keep, lr = opt(argv, "--steps", 8, int), opt(argv, "--keep", 15, int), opt(argv, "--lr", 3e-4, float)
    rows = opt(argv, "--eval-rows", 128, int)
    dkeys = ["distill_loss=forward_kl", "distill_alpha=0.5", *opt(argv, "--distill", "").split()]   # later keys win
    kl_only = "--held-out-kl" in argv; argv = [a for a in argv if a != "--held-out-kl"]
    c = load_config(DemoConfig, [f"base_output_directory={out.parent}", f"run_name={out.name}",
                                 f"num_eval_rows={rows}", *argv])
    if kl_only:       # an earlier run's students: their held-out KL from the teacher (the SFT run logs no KL)
        res = {k: held_out_kl(out, teacher or out / "sft" / "model", c, out / k / "model")
               for k in ("student_sft", "student_distilled")}
        (out / "held_out_kl.json").write_text(json.dumps(res, indent=1)); print(json.dumps(res, indent=1)); return
    from maxpost.distill import DistillConfig, train as distill_train
    from maxpost.sft import SFTConfig, train as sft_train
    from maxpost.train_distill import default_config as distill_yml
    from maxpost.train_sft import default_config as sft_yml
    secs, rep = {}, {"argv": sys.argv, "steps": steps, "keep": keep, "lr": lr, "eval_rows": rows,
                     "cpu": subprocess.run(["lscpu"], capture_output=True, text=True).stdout}
    t = time.time()
    if teacher is None:
        teacher = sft_stage(c, out)["model_dir"]; secs["teacher_sft"] = time.time() - t
    rep["teacher"] = str(teacher)
    t = time.time(); rep["student"] = make_student(Path(teacher), out / "student_init", keep)
    secs["drop_layers"] = time.time() - t
    common = student_args(out, out / "student_init", "student_sft", steps, lr, c)
    t = time.time(); rep["sft"] = sft_train(load_config(SFTConfig, common, base_yaml=sft_yml()))
    secs["student_sft"] = time.time() - t
    dargs = [a.replace("run_name=student_sft", "run_name=student_distilled") for a in common]
    t = time.time()
    rep["distill"] = distill_train(load_config(DistillConfig, [*dargs, f"teacher_load_parameters_path={teacher}", *dkeys],
                                               base_yaml=distill_yml()))
    rep["distill_keys"] = dkeys
    secs["student_distill"] = time.time() - t
    rep["curves"] = {k: {"loss": [m["loss"] for m in records(rep[k]["run_dir"])],
                         "hard_loss": [m.get("hard_loss") for m in records(rep[k]["run_dir"])] if k == "distill" else None}
                     for k in ("sft", "distill")}
    t = time.time()
    rep["evaluate"] = evaluate_stage(c, out, {"teacher": teacher, "student_init": out / "student_init",
                                              "student_sft": rep["sft"]["model_dir"],
                                              "student_distilled": rep["distill"]["model_dir"]})
    secs["evaluate"] = time.time() - t
    ev = rep["evaluate"]
    rep["gains"] = {"distilled - sft-only": paired_difference(ev["student_sft"]["correct"],
                                                              ev["student_distilled"]["correct"], n_boot=2000),
                    "teacher - distilled": paired_difference(ev["student_distilled"]["correct"],
                                                             ev["teacher"]["correct"], n_boot=2000)}
    rep["seconds"] = secs
    text = report(rep); (out / "report.md").write_text(text + "\n"); print(text)
    (out / "report.json").write_text(json.dumps(rep, indent=1, default=str))
    plot(rep, out / "curves.png")
    g = rep["gains"]["distilled - sft-only"]
    verdict = "beat" if g["ci"][0] > 0 else "lost to" if g["ci"][1] < 0 else "did not differ from (within the CI)"
    print(f"the distilled student {verdict} the SFT-only student: {g['value']:+.3f} [{g['ci'][0]:+.3f}, {g['ci'][1]:+.3f}]")
    print(f"report: {out / 'report.md'}, {out / 'report.json'}; plot: {out / 'curves.png'}")

if __name__ == "__main__":
    print(f"cpu: {platform.processor() or platform.machine()}", flush=True)
    t0 = time.time(); main(sys.argv[1:]); print(f"wall: {time.time() - t0:.0f} s")
