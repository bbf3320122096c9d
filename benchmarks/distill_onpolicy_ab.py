"""On-policy against off-policy distillation on the addition task (issue 29 item 1).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/distill_onpolicy_ab.py [--steps 25] [--lmbdas 0,0.5,1] [--seeds 3] [--alpha 0.5]

The teacher is tiny-llama fine-tuned on the 100 additions (`maxpost.testing.sft_addition`, 60 steps); each student is
a random tiny-gemma3 (init seed 3 + s), fully fine-tuned with forward KL at α = `--alpha` (0.5) for `--steps` steps on the 76
training additions, with `distill_on_policy_prob` λ from `--lmbdas` (rollout_seed s). Printed per (λ, seed): the
held-out (24 additions) distillation loss teacher-forced on the dataset's answers and on the student's own samples of
the held-out prompts (temperature 1, 4 tokens), as in nbs/05i_distill_onpolicy.ipynb's learning check, and the
student's greedy exact-match accuracy on the held-out sums."""
import argparse, json, time
import numpy as np

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--lmbdas", default="0,0.5,1")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.5)          # distill_alpha (sampled batches train at 1 anyway)
    a = ap.parse_args()
    from maxpost.addition import EOS
    from maxpost.data import SFTDataIterator
    from maxpost.distill import DistillConfig, DistillTrainer, addition_examples
    from maxpost.distill_onpolicy import Resampler
    from maxpost.engine import SamplingParams
    from maxpost.model import model_config, random_params
    from maxpost.testing import sft_addition
    scfg, tcfg = model_config("tiny-gemma3"), model_config("tiny-llama")
    teacher = sft_addition(steps=60, model_name="tiny-llama")
    held_ex = addition_examples("test")
    held = list(SFTDataIterator(held_ex, 8, 32, seed=0, num_epochs=1))
    prompts, answers = [e.ids[~e.mask].tolist() for e in held_ex], [e.ids[e.mask].tolist() for e in held_ex]
    rows = []
    for lmbda in [float(x) for x in a.lmbdas.split(",")]:
        for s in range(a.seeds):
            t0 = time.perf_counter()
            cfg = DistillConfig(model_name="tiny-gemma3", teacher_model_name="tiny-llama", per_device_batch_size=8,
                                max_target_length=32, learning_rate=1e-2, warmup_steps_fraction=0.05, adam_weight_decay=0.0,
                                loss_chunk_size=128, steps=a.steps, max_completion_length=4, distill_on_policy_prob=lmbda,
                                rollout_seed=s, distill_alpha=a.alpha)
            tr = DistillTrainer(cfg, scfg, random_params(scfg, 3 + s), tcfg, teacher, stop_token_ids=(EOS,))
            sampler = Resampler(cfg.model_copy(update={"distill_on_policy_prob": 1.0}), 32, {"student": scfg}, tr.dtype,
                                tr.wdtype, (EOS,))
            st = tr.init_state(); it = SFTDataIterator(addition_examples("train"), 8, 32, seed=0)
            for _ in range(a.steps): st, m = tr.step(st, next(it))
            w = tr.merged_params(st)
            own = [sampler(b, "student", 1000 + i, w if i == 0 else None)[0] for i, b in enumerate(held)]
            greedy = sampler.engines["student"].generate(prompts, SamplingParams(temperature=0.0, max_tokens=4))
            acc = float(np.mean([r.token_ids == ans for r, ans in zip(greedy, answers)]))
            row = dict(lmbda=lmbda, alpha=a.alpha, seed=s, heldout_kl_data=tr.evaluate(st, held)["distill_loss"],
                       heldout_kl_own_samples=tr.evaluate(st, own)["distill_loss"], greedy_accuracy=acc,
                       seconds=round(time.perf_counter() - t0, 1))
            rows.append(row); print(json.dumps(row), flush=True)
    for lmbda in sorted({r["lmbda"] for r in rows}):
        rs = [r for r in rows if r["lmbda"] == lmbda]
        print(f"λ={lmbda}: held-out KL on the answers {np.mean([r['heldout_kl_data'] for r in rs]):.4f}, on its own "
              f"samples {np.mean([r['heldout_kl_own_samples'] for r in rs]):.4f}, greedy accuracy "
              f"{np.mean([r['greedy_accuracy'] for r in rs]):.3f} (mean of {len(rs)} seeds)")

if __name__ == "__main__": main()
