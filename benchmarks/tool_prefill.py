"""What re-prefilling costs a multi-turn tool RL step: the native engine starts every turn from scratch, prefilling the
prompt and all earlier turns again before it decodes the next turn. This measures, in the tool RL step of
`benchmarks/tool_rl.py` (tiny llama, `tools=calculator max_turns=2`, 16 prompts × 8 episodes, `rl_step`), how long
each turn's engine call takes, and for the later turns how long their prefill takes with the whole sequence (what
the engine does now) and with only the new tokens (the observation: what it would prefill if it kept each episode's
KV cache between turns). Each prefill is timed as a `max_tokens=1` call on the same sequences, after a warm-up call
of the same shapes (no compile in the timings); the warm start is 20 SFT steps (the tests' `tool_ckpt`), enough that
most episodes call the calculator.

    python benchmarks/tool_prefill.py [--steps 3] [--call-steps 20] [--reuse on|off]
    python benchmarks/tool_prefill.py --model smollm2-135m [--steps 3] [--batch 4] [--group 4]

`--model smollm2-135m`: the same measurement on a real model, the embedded SmolLM2-135M-Instruct (LoRA, float32) on
GSM8K's train split with the calculator (`dataset_type=gsm8k tools=calculator max_turns=2`, as the tool tutorial's
command), no warm start: how often the model calls the tool is the shipped model's own.

`--reuse`: whether the rollout's engine calls keep each episode's KV between turns and prefill only the new tokens
(`maxpost.prefix_reuse`, what tool RL does by default since it was built; `off`: every turn prefilled whole, as
before). The last column is the share of the rollout's prompt tokens served from the kept KV.
"""
import argparse, time
from dataclasses import replace
import numpy as np
from maxpost.addition import addition_answer
from maxpost.model import model_config
from maxpost.rl.config import RLConfig, check_config
from maxpost.rl.rollout import PromptStream
from maxpost.rl.tool_task import ToolDigitTokenizer, multiplication_split, warm_start
from maxpost.rl.trainer import RLTrainer, make_rollout_engine, rl_step

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=3); ap.add_argument("--call-steps", type=int, default=20)
ap.add_argument("--model", default="tiny-llama", choices=["tiny-llama", "smollm2-135m"])
ap.add_argument("--batch", type=int, default=4); ap.add_argument("--group", type=int, default=4)
ap.add_argument("--reuse", default="on", choices=["on", "off"])
a = ap.parse_args()

class Recording:
    "The engine, its generate calls recorded: (turn sequences, params, stream ids, seconds, results)."
    def __init__(self, engine): self.engine, self.calls = engine, []
    def __getattr__(self, k): return getattr(self.engine, k)
    def generate(self, prompts, params, *, stream_ids=None, reuse_prefixes=None):
        reuse = bool(reuse_prefixes) and a.reuse == "on"
        t0 = time.perf_counter(); out = self.engine.generate(prompts, params, stream_ids=stream_ids, reuse_prefixes=reuse)
        self.calls.append((prompts, params, stream_ids, time.perf_counter() - t0, out)); return out

def prefill_seconds(engine, seqs, params, sids) -> float:
    "Seconds of a prefill (+ one sampled token) of `seqs`, after a warm-up call of the same shapes."
    sp = replace(params, max_tokens=1)
    engine.generate(seqs, sp, stream_ids=sids)
    t0 = time.perf_counter(); engine.generate(seqs, sp, stream_ids=sids); return time.perf_counter() - t0

if a.model == "tiny-llama":
    train, _ = multiplication_split(2000, 300, 2, 0)
    params = warm_start(train, steps=0, call_steps=a.call_steps, batch=16, T=64)
    L = len(train[0]["prompt_ids"])
    cfg = RLConfig(model_name="tiny-llama", dataset_type="multiplication", reward_functions="addition_answer",
                   tools="calculator", max_turns=2, batch_size=16, num_generations=8, max_prefill_predict_length=L,
                   max_completion_length=32, steps=a.steps, learning_rate=2e-3, loss_chunk_size=1024, num_iterations=2,
                   eval_before_after=False, enable_tqdm=False, dtype="float32", weight_dtype="float32")
    trainer = RLTrainer(cfg, check_config(cfg), model_config(cfg.model_name), params)
    tok, fns, weights = ToolDigitTokenizer(), [addition_answer], [1.0]
else:
    from maxpost.config import load_config
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.rl.rollout import check_dataset, load_prompts, load_rewards
    from maxpost.rl.trainer import load_policy_base
    from maxpost.train_rl import default_config
    cfg = load_config(RLConfig, [f"model_name={a.model}", f"load_parameters_path={embedded_hf(a.model)}",
                                 "dataset_type=gsm8k", "tools=calculator", "max_turns=2", f"batch_size={a.batch}",
                                 f"num_generations={a.group}", "max_prefill_predict_length=512", "max_completion_length=128",
                                 "use_lora=true", "eval_before_after=false", "enable_tqdm=false", "dtype=float32",
                                 "weight_dtype=float32"], base_yaml=default_config())
    lc = check_config(cfg); fns, weights = load_rewards(cfg); cfg = check_dataset(cfg)
    mcfg, base, tok, _ = load_policy_base(cfg)
    train, _ = load_prompts(cfg, tok, cfg.train_split, 256)
    trainer = RLTrainer(cfg, lc, mcfg, base)
state = trainer.init_state()
engine = Recording(make_rollout_engine(cfg, trainer, state, tok))
stream = PromptStream(train, 0)
print("| step | step s | rollout s | turn-1 call s | later turns' calls s | their prefill, whole sequence s | "
      "their prefill, new tokens only s | tokens prefilled again | turns | served from kept KV |\n|---|---|---|---|---|---|---|---|---|---|")
for s in range(a.steps):
    engine.calls = []
    t0 = time.perf_counter(); state, m, _ = rl_step(trainer, state, engine, stream, fns, weights)
    step_s = time.perf_counter() - t0
    calls = list(engine.calls)
    later = calls[1:]
    full = new = 0.0; again = 0
    held = {sid: len(p) + len(r.token_ids) for p, sid, r in zip(calls[0][0], calls[0][2], calls[0][4])}
    for seqs, sp, sids, _, res in later:     # a later turn: the episode so far, prefilled whole
        full += prefill_seconds(engine.engine, seqs, sp, sids)
        # a kept KV cache would hold the previous turn's prompt and sampled tokens: only the observation is new
        news = [list(q[held[sid]:]) for q, sid in zip(seqs, sids)]
        again += sum(held[sid] for sid in sids)
        new += prefill_seconds(engine.engine, news, sp, sids)
        held = {sid: len(q) + len(r.token_ids) for q, sid, r in zip(seqs, sids, res)}
    print(f"| {s + 1} | {step_s:.2f} | {m['time/rollout']:.2f} | {calls[0][3]:.2f} | {sum(c[3] for c in later):.2f} | "
          f"{full:.2f} | {new:.2f} | {again} | {m['tools/turns_mean']:.2f} | {m.get('tools/prefix_cache_hit_rate', 0.0):.3f} |",
          flush=True)
