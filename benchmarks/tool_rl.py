"""Tool-use RL on a task that needs the tool: does GRPO teach a tiny model to call the calculator?

Task (`maxpost.rl.tool_task`): `a*b` with two D-digit factors (default D = 2; every product 2D digits), exact reward
on the final turn. Tiny llama (4 layers, width 32), randomly initialized, warm-started by SFT (`warm_start`):
`--call-steps` steps on calculator episodes (call, result, copied answer), then `--mix-steps` steps at `--mix-lr` on a
mix, a calculator episode with probability `--p-tool`, else a direct answer (which the model cannot learn). Then GRPO
with `tools=calculator`, `max_turns=2` through `maxpost.rl.trainer.rl_step`, the step `python -m maxpost.train_rl`
runs (16 prompts × 8 episodes, 2 iterations, lr 2e-3). Before and after: the run's own evaluation
(`maxpost.rl.trainer.evaluate_policy`), one episode sampled at temperature 1 per held-out row: accuracy with its
Wilson 95% interval, tool-call rate, malformed-call rate and turns per episode, each with its 95% interval.

    python benchmarks/tool_rl.py [--digits 2] [--p-tool 0.25] [--call-steps 300] [--mix-steps 100] [--mix-lr 1e-3] [--rl-steps 40] [--n-test 300]
                                 [--json benchmarks/results/tool_rl.json] [--png benchmarks/results/tool_rl.png]

It exits 0 whether or not RL helped and prints the verdict (after's interval above before's, or not).
"""
import argparse, json, time
import numpy as np
from maxpost.addition import addition_answer
from maxpost.model import model_config
from maxpost.rl.config import RLConfig, check_config
from maxpost.rl.rollout import PromptStream
from maxpost.rl.tool_task import ToolDigitTokenizer, multiplication_split, warm_start
from maxpost.rl.trainer import RLTrainer, evaluate_policy, make_rollout_engine, rl_step

ap = argparse.ArgumentParser()
ap.add_argument("--digits", type=int, default=2); ap.add_argument("--p-tool", type=float, default=0.25)
ap.add_argument("--call-steps", type=int, default=300); ap.add_argument("--mix-steps", type=int, default=100)
ap.add_argument("--mix-lr", type=float, default=1e-3); ap.add_argument("--rl-steps", type=int, default=40)
ap.add_argument("--n-train", type=int, default=2000); ap.add_argument("--n-test", type=int, default=300)
ap.add_argument("--lr", type=float, default=2e-3); ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--json", default=""); ap.add_argument("--png", default="")
a = ap.parse_args()

t0 = time.time()
train, test = multiplication_split(a.n_train, a.n_test, a.digits, a.seed)
params = warm_start(train, p_tool=a.p_tool, steps=a.mix_steps, call_steps=a.call_steps, mix_learning_rate=a.mix_lr, seed=a.seed)
t_sft = time.time() - t0
L = len(train[0]["prompt_ids"])
cfg = RLConfig(model_name="tiny-llama", dataset_type="multiplication", reward_functions="addition_answer",
               tools="calculator", max_turns=2, batch_size=16, num_generations=8, max_prefill_predict_length=L,
               max_completion_length=32, steps=a.rl_steps, learning_rate=a.lr, loss_chunk_size=1024,
               num_iterations=2, eval_before_after=False, enable_tqdm=False, dtype="float32", weight_dtype="float32",
               rollout_seed=a.seed, eval_temperature=1.0, num_eval_passes=1)
trainer = RLTrainer(cfg, check_config(cfg), model_config(cfg.model_name), params)
state = trainer.init_state()
engine = make_rollout_engine(cfg, trainer, state, ToolDigitTokenizer())
ev = lambda: evaluate_policy(cfg, engine, test, [addition_answer], [1.0], seed=10_000 + a.seed)
before = ev()
stream, records = PromptStream(train, cfg.data_shuffle_seed), []
for s in range(cfg.steps):
    state, m, _ = rl_step(trainer, state, engine, stream, [addition_answer], [1.0])
    records.append({k: float(m[k]) for k in ("reward_mean", "tools/call_rate", "tools/malformed_rate", "tools/turns_mean")})
    if s % 10 == 0 or s == cfg.steps - 1: print(s, {k: round(v, 3) for k, v in records[-1].items()}, flush=True)
after = ev()
ci = lambda e, k, f=".3f": f"{e[k]['mean']:{f}} [{e[k]['lo']:{f}}, {e[k]['hi']:{f}}]"
fmt = lambda e: " | ".join(ci(e, k, ".2f" if k == "tools/turns_mean" else ".3f")
                           for k in ("addition_answer", "tools/call_rate", "tools/malformed_rate", "tools/turns_mean"))
print(f"\n{a.digits}-digit factors, p_tool={a.p_tool}, SFT {a.call_steps} call + {a.mix_steps} mixed steps (lr {a.mix_lr}), RL {a.rl_steps} steps, "
      f"{a.n_test} held-out rows, one episode each at temperature 1 ({time.time() - t0:.0f} s, SFT {t_sft:.0f} s)\n")
print("| model | accuracy [Wilson 95%] | tool-call rate [95%] | malformed-call rate [95%] | turns / episode [95%] |\n|---|---|---|---|---|")
print(f"| SFT warm start | {fmt(before)} |\n| + GRPO {a.rl_steps} steps | {fmt(after)} |")
first, last = records[:10], records[-10:]
mean = lambda rs, k: float(np.mean([r[k] for r in rs]))
print(f"\ntraining, mean of the first / last 10 steps: reward {mean(first, 'reward_mean'):.3f} → {mean(last, 'reward_mean'):.3f}, "
      f"call rate {mean(first, 'tools/call_rate'):.3f} → {mean(last, 'tools/call_rate'):.3f}")
acc_b, acc_a = before["addition_answer"], after["addition_answer"]
print("verdict:", "accuracy rose beyond its 95% interval" if acc_a["lo"] > acc_b["hi"] else "NO gain beyond the 95% interval")
if a.json:
    with open(a.json, "w") as f: json.dump({"args": vars(a), "before": before, "after": after, "records": records}, f, indent=1)
if a.png:
    from matplotlib.figure import Figure
    fig = Figure(figsize=(10, 3.5)); ax = fig.subplots(1, 2)
    ax[0].plot([r["reward_mean"] for r in records], label="reward (accuracy of the step's samples)")
    ax[0].plot([r["tools/call_rate"] for r in records], label="tool-call rate"); ax[0].set_xlabel("RL step"); ax[0].legend()
    names, x = ["addition_answer", "tools/call_rate"], np.arange(2)
    for off, e, lab in ((-0.2, before, "SFT warm start"), (0.2, after, f"+ GRPO {a.rl_steps} steps")):
        m = np.array([e[n]["mean"] for n in names])
        err = np.array([[m[i] - e[n]["lo"], e[n]["hi"] - m[i]] for i, n in enumerate(names)]).T
        ax[1].bar(x + off, m, 0.4, yerr=err, capsize=3, label=lab)
    ax[1].set_xticks(x, ["accuracy", "call rate"]); ax[1].legend(); ax[1].set_title("held-out, one episode per row (95% CI)")
    fig.tight_layout(); fig.savefig(a.png, dpi=80)
