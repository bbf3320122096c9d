"""rollout_mode=sync against one_step_off, side by side: GRPO on the tiny-llama addition task (tests/test_rl.py's
experiment: SFT'd to ≈10% sampled accuracy, 16 prompts × 8 samples, 2 iterations per batch), one run per mode in one
process, same SFT start, prompts and rollout seeds.

    python benchmarks/rl_one_step_off_ab.py [--steps 60] [--png benchmarks/results/rl_one_step_off_tiny.png]

Prints per mode: steps per hour (step 1, which compiles, left out), the mean split of a step (rollout — in the
background thread for one_step_off —, the main thread's wait for it, update, sync), the staleness, and the sampled
accuracy before/after (mean ± std over 5 evaluation seeds); draws both reward curves on one PNG. Timing on a shared
machine: only the ratio of the two runs means something, with the load average printed beside it.
"""
import argparse, json, os, time

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--png", default="benchmarks/results/rl_one_step_off_tiny.png")
    a = ap.parse_args()
    import numpy as np
    from maxpost.testing import addition_experiment, sft_addition
    params, out = sft_addition(), {}
    for mode in ("sync", "one_step_off"):
        load0 = os.getloadavg()[0]
        r = addition_experiment(params, "grpo", steps=a.steps, rollout_mode=mode)
        rec, timed = r["records"], r["records"][1:]
        split = {k: float(np.mean([m.get(f"time/{k}", 0.0) for m in timed]))
                 for k in ("step", "rollout", "reward", "reference", "update", "rollout_wait", "sync")}
        out[mode] = {"steps_per_hour": 3600 / split["step"], "split_s": split, "load_before": load0,
                     "load_after": os.getloadavg()[0], "staleness": sorted({m["staleness"] for m in rec}),
                     "acc_before": [float(np.mean(r["before"])), float(np.std(r["before"], ddof=1))],
                     "acc_after": [float(np.mean(r["after"])), float(np.std(r["after"], ddof=1))],
                     "reward": [m["reward_mean"] for m in rec],
                     "lag_logp_diff_mean": float(np.mean([m["sampling/sampling_logp_difference/mean"] for m in timed]))}
        o = out[mode]
        print(f"{mode}: {o['steps_per_hour']:.0f} steps/h; split s/step " + ", ".join(f"{k} {v:.3f}" for k, v in split.items())
              + f"; staleness {o['staleness']}; accuracy {o['acc_before'][0]:.3f}±{o['acc_before'][1]:.3f} -> "
              f"{o['acc_after'][0]:.3f}±{o['acc_after'][1]:.3f}; |log pi_old - log q| {o['lag_logp_diff_mean']:.4f}; "
              f"load {load0:.1f} -> {o['load_after']:.1f}", flush=True)
    print(f"one_step_off / sync steps per hour: {out['one_step_off']['steps_per_hour'] / out['sync']['steps_per_hour']:.2f}")
    import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, o in out.items():
        w = np.convolve(o["reward"], np.ones(5) / 5, mode="valid")
        ax.plot(range(1, len(o["reward"]) + 1), o["reward"], alpha=0.3)
        ax.plot(range(5, len(o["reward"]) + 1), w, label=f"{mode} (5-step mean)", color=ax.lines[-1].get_color())
    ax.set_xlabel("step"); ax.set_ylabel("mean reward"); ax.set_title("GRPO, tiny llama addition: sync vs one_step_off")
    ax.legend(); fig.tight_layout(); fig.savefig(a.png, dpi=100)
    print(json.dumps({m: {k: v for k, v in o.items() if k != "reward"} for m, o in out.items()}))

if __name__ == "__main__":
    main()
