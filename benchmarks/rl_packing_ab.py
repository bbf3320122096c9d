"""Packed against fixed-shape RL updates, side by side: SmolLM2-135M GRPO steps at the settings of
benchmarks/rl_gsm8k_smollm2.py, alternating the trainers step by step in one process.

    python benchmarks/rl_packing_ab.py [--steps 3] [--modes fixed,packed,shared] [--out FILE] [key=value ...]

Modes: `fixed` (packing=false: [B, prompt + completion budget] rows, and attention as one block of all T × T scores:
the loop before issue 15), `packed`
(packing=true packing_share_prompt=false: each completion with its own copy of its prompt, at real lengths) and
`shared` (the default since: the prompt once per group, its completions after it); `packed` and `shared` run the
attention in query blocks (`maxpost.model.masked_attention`'s default). All trainers start from the same LoRA init and see the same prompts (two prompt streams with the same seed) and
rollout seeds; each has its own native engine. Step 1 of each (compiles) is reported apart. Prints, per mode, the
mean step time and its split (rollout, reward, reference, update, sync), the packed / fixed ratios, the packed
shapes, and the engine-vs-trainer mismatch the step logged (native engine, float32: expected ~1e-6 nats). The
machine may be shared: only the ratios of alternated steps are meaningful, not the absolute times.
"""
import argparse, json, sys, time

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode after the compile step")
    ap.add_argument("--modes", default="fixed,packed,shared", help="comma-separated: fixed, packed, shared")
    ap.add_argument("--out", default=None, help="write the summary JSON here")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the RL config")
    a = ap.parse_args()
    import numpy as np
    from maxpost.config import load_config
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.rl import RLConfig
    from maxpost.rl.config import check_config
    from maxpost.rl.rollout import PromptStream, load_prompts, load_rewards
    from maxpost.rl.trainer import RLTrainer, load_policy_base, make_rollout_engine, rl_step
    from maxpost.train_rl import default_config
    hf = embedded_hf("smollm2-135m")
    base = ["model_name=smollm2-135m", f"load_parameters_path={hf}", "loss_algo=grpo", "beta=0", "use_lora=true",
            "lora_rank=16", "lora_alpha=32", "learning_rate=5e-4", "batch_size=2", "num_generations=8",
            "few_shot=1", "max_prefill_predict_length=320", "max_completion_length=160", "remat_policy=full",
            "reward_functions=gsm8k_answer,gsm8k_exact_format,gsm8k_approx_format", "reward_weights=1,1,1",
            "eval_before_after=false", "enable_tqdm=false"]
    runs = {}
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    import sft_throughput as st_
    print(st_.cpu_info(), "| load average", __import__("os").getloadavg(), flush=True)
    layout = {"fixed": ["packing=false"], "packed": ["packing=true", "packing_share_prompt=false"],
              "shared": ["packing=true", "packing_share_prompt=true"]}
    for mode in a.modes.split(","):
        cfg = load_config(RLConfig, base + layout[mode] + a.overrides, base_yaml=default_config())
        lc = check_config(cfg)
        fns, weights = load_rewards(cfg)
        mcfg, params, tok, _ = load_policy_base(cfg)
        rows, _ = load_prompts(cfg, tok, cfg.train_split, 64)
        tr = RLTrainer(cfg, lc, mcfg, params)
        st = tr.init_state()
        runs[mode] = dict(tr=tr, st=st, eng=make_rollout_engine(cfg, tr, st, tok), stream=PromptStream(rows, 0),
                          fns=fns, w=weights, recs=[])
    import maxpost.model as mm
    blocked = mm.masked_attention
    one_block = lambda *x, **k: blocked(*x, **k, chunks=1)   # the attention before issue 15: all T × T scores at once
    for step in range(a.steps + 1):
        for mode, r in runs.items():
            mm.masked_attention = one_block if mode == "fixed" else blocked   # read when a step's program is traced
            t0 = time.perf_counter()
            r["st"], m, _ = rl_step(r["tr"], r["st"], r["eng"], r["stream"], r["fns"], r["w"])
            m["wall"] = time.perf_counter() - t0
            r["recs"].append(m)
            print(f"step {step + 1} {mode}: {m['wall']:.1f} s (update {m['time/update']:.1f} s, rollout "
                  f"{m['time/rollout']:.1f} s), completion length {m['completion_length_mean']:.0f}, reward "
                  f"{m['reward_mean']:.3f}, loss {m['loss']:.5f}, mismatch mean "
                  f"{m['sampling/sampling_logp_difference/mean']:.1e} max {m['sampling/sampling_logp_difference/max']:.1e}",
                  flush=True)
    out = {}
    for mode, r in runs.items():
        timed = r["recs"][1:]
        out[mode] = {k: float(np.mean([m[k] for m in timed])) for k in timed[0]
                     if k.startswith("time/") or k in ("wall", "completion_length_mean",
                                                      "sampling/sampling_logp_difference/mean", "rollout_corr/kl")}
        out[mode]["compile_step_s"] = r["recs"][0]["wall"]
    modes = list(runs)
    for x in modes[1:]:
        for k in ("wall", "time/update", "time/rollout"):
            out[f"ratio {modes[0]}/{x} {k}"] = out[modes[0]][k] / out[x][k]
            # per round: each timed step's ratio (the steps of one round ran back to back, under the same load)
            out[f"ratio {modes[0]}/{x} {k} per step"] = [p[k] / q[k] for p, q in zip(runs[modes[0]]["recs"][1:], runs[x]["recs"][1:])]
    out["load_average_end"] = __import__("os").getloadavg()
    print(json.dumps(out, indent=1))
    if a.out: open(a.out, "w").write(json.dumps(out, indent=1))

if __name__ == "__main__": main()
