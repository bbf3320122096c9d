"""Hash of the lowered RL update (StableHLO without locations) on the tiny addition task, full and LoRA, and its
loss and gradient norm: run it on two trees to show that a change left the compiled RL update as it was.

    python benchmarks/rl_update_hash.py                          # this tree
    PYTHONPATH=/tmp/base python benchmarks/rl_update_hash.py     # an older tree (git archive <commit> maxpost)
"""
import hashlib, json, re
import numpy as np

def main():
    import optax
    import maxpost
    from maxpost.rl.config import check_config
    from maxpost.rl.rollout import sampling_params
    from maxpost.rl.trainer import RLTrainer, make_rollout_engine, training_batch, minibatch
    from maxpost.model import model_config, random_params
    from maxpost.testing import DigitTokenizer, addition_config, addition_rows
    mc = model_config("tiny-llama"); params = random_params(mc, 0)
    out = {"maxpost": maxpost.__file__}
    for lora in (False, True):
        cfg = addition_config("grpo", 1, batch_size=4, num_generations=4, use_lora=lora, lora_rank=4)
        tr = RLTrainer(cfg, check_config(cfg), mc, params); st = tr.init_state()
        eng = make_rollout_engine(cfg, tr, st, DigitTokenizer())
        rows = addition_rows([(a, b) for a in range(2) for b in range(2)])
        res = eng.generate([r["prompt_ids"] for r in rows], sampling_params(cfg, 3))
        bt = training_batch(tr, res)
        bt["advantages"] = np.linspace(-0.5, 1.5, len(res), dtype=np.float32)
        if tr.use_ref: bt["ref_logps"] = np.asarray(tr.ref_logps(tr.put(bt))) - 0.1
        mb = tr.put(minibatch(bt, 0, 1))
        txt = re.sub(r"loc\([^)]*\)", "", tr._update.lower(st, tr.frozen, mb).as_text(debug_info=False))
        _, m = tr.update(st, mb)
        out["lora" if lora else "full"] = {"hlo_sha1": hashlib.sha1(txt.encode()).hexdigest()[:16],
                                           **{k: float(v) for k, v in m.items() if np.ndim(v) == 0}}
    print(json.dumps(out, indent=1))

if __name__ == "__main__": main()
