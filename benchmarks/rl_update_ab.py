"""The RL update of this tree against another tree's (before a change), side by side on the same batch: SmolLM2-135M
GRPO with LoRA at the settings of benchmarks/rl_packing_ab.py (GSM8K, 2 prompts × 8 samples, shared-prompt packing,
two iterations, here with a KL term so that the reference pass runs too). Each tree runs in its own process; each
samples the same rollout once (same weights, prompts and seed, so the same tokens), builds the update batch, and then
times, alternating with the other process: the old-policy and reference log-prob passes, and the updates of the
step (`num_iterations` × `num_minibatches` calls of `RLTrainer.update`, the state carried on).

    git archive <commit> maxpost | tar -x -C /tmp/base
    python benchmarks/rl_update_ab.py --baseline /tmp/base [--rounds 5]

Prints each part's median seconds (min, max) per tree, the ratios baseline / this tree, and the largest difference
of the update losses between the two trees.
"""
import argparse, json, os, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import sft_throughput as st

def worker():
    import numpy as np, jax
    import maxpost
    from maxpost.config import load_config
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.rl import RLConfig
    from maxpost.rl.config import check_config
    from maxpost.rl.rollout import PromptStream, collect_rollout, load_prompts, load_rewards
    from maxpost.rl.trainer import RLTrainer, load_policy_base, make_rollout_engine, training_batch, minibatch
    from maxpost.losses import group_advantages
    from maxpost.train_rl import default_config
    hf = embedded_hf("smollm2-135m")
    args = ["model_name=smollm2-135m", f"load_parameters_path={hf}", "loss_algo=grpo", "beta=0.04", "use_lora=true",
            "lora_rank=16", "lora_alpha=32", "learning_rate=5e-4", "batch_size=2", "num_generations=8",
            "few_shot=1", "max_prefill_predict_length=320", "max_completion_length=160", "remat_policy=full",
            "reward_functions=gsm8k_answer,gsm8k_exact_format,gsm8k_approx_format", "reward_weights=1,1,1",
            "eval_before_after=false", "enable_tqdm=false", "packing=true", "packing_share_prompt=true"]
    cfg = load_config(RLConfig, args, base_yaml=default_config())
    lc = check_config(cfg)
    fns, weights = load_rewards(cfg)
    mcfg, params, tok, _ = load_policy_base(cfg)
    rows, _ = load_prompts(cfg, tok, cfg.train_split, 64)
    tr = RLTrainer(cfg, lc, mcfg, params); state = tr.init_state()
    eng = make_rollout_engine(cfg, tr, state, tok)
    ro = collect_rollout(cfg, lc, np.asarray(jax.device_get(state["rng"])), eng, PromptStream(rows, 0), fns, weights)
    batch = training_batch(tr, ro["res"])
    batch["advantages"] = np.asarray(group_advantages(np.concatenate(ro["rewards"]), cfg.num_generations,
                                                      lc.advantage_method, lc.advantage_eps)).astype(np.float32)
    say = lambda d: print(st.TAG + json.dumps(d), flush=True)
    say({"ready": True, "maxpost": maxpost.__file__, "n_tokens": int(sum(len(r.token_ids) for r in ro["res"]))})
    for line in sys.stdin:
        if line.strip() == "done": say({"peak_rss_gib": st._peak_rss_gib()}); return
        t0 = time.perf_counter()
        dev = tr.put(batch)
        b = dict(batch, old_logps=np.asarray(tr.policy_logps(state, dev)), ref_logps=np.asarray(tr.ref_logps(dev)))
        t1 = time.perf_counter()
        mbs = [tr.put(minibatch(b, j, cfg.num_minibatches)) for j in range(cfg.num_minibatches)]
        losses = []
        for _ in range(cfg.num_iterations):
            for mb in mbs:
                state, m = tr.update(state, mb); losses.append(float(m["loss"]))
        t2 = time.perf_counter()
        say({"logps_s": t1 - t0, "update_s": t2 - t1, "losses": losses})

class Worker(st.Worker):
    def __init__(self, name, tree):
        env = os.environ | {"PYTHONUNBUFFERED": "1"} | ({"PYTHONPATH": tree} if tree else {})
        self.name, self.p = name, subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                                   stdout=subprocess.PIPE, text=True, cwd=ROOT.parent, env=env)

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="a tree with an older maxpost/ (git archive <commit> maxpost)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds after the compiling one")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker: return worker()
    print(st.cpu_info(), "| load average", os.getloadavg(), flush=True)
    ws, out = {}, {}
    for name, tree in (("maxpost", None), (st.BASE, a.baseline)):
        ws[name] = Worker(name, tree); out[name] = ws[name].read() | {"rounds": []}
    for _ in range(a.rounds + 1):
        for k, w in ws.items(): out[k]["rounds"].append(w.ask("step"))
    for k, w in ws.items(): out[k] |= w.ask("done"); w.p.wait()
    res = {"cpu": st.cpu_info(), "load_average_end": os.getloadavg()}
    for k, r in out.items():
        timed = r["rounds"][1:]
        res[k] = {"maxpost": r["maxpost"], "n_tokens": r["n_tokens"], "peak_rss_gib": r["peak_rss_gib"],
                  **{p: [statistics.median(x[p] for x in timed), min(x[p] for x in timed), max(x[p] for x in timed)]
                     for p in ("logps_s", "update_s")}, "losses_round1": r["rounds"][0]["losses"]}
    m, b = out["maxpost"]["rounds"][1:], out[st.BASE]["rounds"][1:]
    for p in ("logps_s", "update_s"):
        res[f"ratio baseline/maxpost {p} per round"] = [y[p] / x[p] for x, y in zip(m, b)]
        res[f"ratio baseline/maxpost {p} median"] = statistics.median(res[f"ratio baseline/maxpost {p} per round"])
    res["max_loss_diff_round1"] = max(abs(x - y) for x, y in zip(out["maxpost"]["rounds"][0]["losses"],
                                                               out[st.BASE]["rounds"][0]["losses"]))
    print(json.dumps(res, indent=1))

if __name__ == "__main__": main()
