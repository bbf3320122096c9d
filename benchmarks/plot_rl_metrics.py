"""Plot the curves of an RL run from its metrics.jsonl (one JSON object per step, as `maxpost.rl.train` writes).

    python benchmarks/plot_rl_metrics.py RUN_DIR/metrics.jsonl OUT.png

Panels: reward per function (mean over the step's samples), frac_reward_zero_std, completion length and truncation
rate, and the step time split (rollout / update / sync / reference / reward).
"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(path, out):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if "reward_mean" in r]
    step = [r["step"] for r in rows]
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    for k in sorted({k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")}):
        ax[0, 0].plot(step, [r.get(k) for r in rows], marker=".", label=k.split("/")[1])
    ax[0, 0].plot(step, [r["reward_mean"] for r in rows], "k--", label="total (weighted)")
    ax[0, 0].set_title("reward, mean over the step's samples"); ax[0, 0].legend(fontsize=8)
    ax[0, 1].plot(step, [r.get("frac_reward_zero_std") for r in rows], marker=".")
    ax[0, 1].set_title("fraction of groups with zero reward variance"); ax[0, 1].set_ylim(-0.05, 1.05)
    ax[1, 0].plot(step, [r.get("completion_length_mean") for r in rows], marker=".", label="mean completion length")
    ax2 = ax[1, 0].twinx()
    ax2.plot(step, [r.get("truncation_rate") for r in rows], "r.", label="truncation rate"); ax2.set_ylim(-0.05, 1.05)
    ax[1, 0].set_title("completion length (tokens) and truncation rate (red)")
    parts = ["rollout", "update", "sync", "reference", "reward"]
    bottom = [0.0] * len(rows)
    for p in parts:
        v = [r.get(f"time/{p}", 0.0) for r in rows]
        ax[1, 1].bar(step, v, bottom=bottom, label=p); bottom = [b + x for b, x in zip(bottom, v)]
    ax[1, 1].set_title("step time split (s)"); ax[1, 1].legend(fontsize=8)
    for a in ax.flat: a.set_xlabel("RL step")
    fig.tight_layout(); fig.savefig(out, dpi=90)
    print(f"wrote {out} ({len(rows)} steps)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
