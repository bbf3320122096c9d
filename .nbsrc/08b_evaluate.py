# %% [markdown]
# # Evaluate
#
# > `python -m maxpost.evaluate`: sample completions of a test set with an engine, check the answers, and report accuracy, pass@k or maj@k with 95% intervals, one JSONL line per problem and a summary.json; `evaluate()` does the same from Python for RL.

# %%
#| default_exp evaluate

# %%
#| export
from __future__ import annotations
import json, math, time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from pydantic import field_validator, model_validator

from maxpost.config import Config, ConfigError, dump_config, load_config, output_dir, run_cli
from maxpost.generate import (ENGINES, NativeEngine, SamplingParams, chat_prompt_ids, check_engine, load_tokenizer,
                              make_engine)
from maxpost.metrics import format_summary, summarize, write_jsonl
from maxpost.rewards import (PROMPT_TEMPLATES, build_prompt, extract_answer, format_gold, format_ok, is_correct,
                             load_gsm8k)

# %% [markdown]
# An evaluation is: a test set, a prompt template, an engine, a sampling setting, and a statistic. The three
# statistics (`eval_mode`) are the ones of `maxpost.metrics`:
#
# | `eval_mode` | samples per problem | sampling | headline |
# |---|---|---|---|
# | `pass_at_1` | 1 | greedy ($\tau = 0$) unless `temperature` is given | accuracy |
# | `pass` | $K$ = `num_eval_passes` | $\tau$ = `temperature` (default 1) | unbiased pass@K (Chen et al. 2021, arXiv 2107.03374) |
# | `maj` | $K$ | $\tau$ = `temperature` (default 1) | maj@K: is the most common extracted answer right (Wang et al. 2022, arXiv 2203.11171) |
#
# Every metric comes with a 95% interval (Wilson for 0/1 per-problem values, a bootstrap over problems otherwise), and
# `summarize` also reports format accuracy (does the completion follow the template's answer format), mean completion
# length and the truncation rate (completions that hit `max_tokens`). The score is always printed with how many
# problems it is on: `accuracy 0.310 [0.250, 0.380] on 200 of 1319 problems`, so a capped run cannot pass for a full
# one.

# %% [markdown]
# ## Datasets
#
# A dataset is a loader `split -> list of {question, answer}` rows, `answer` in GSM8K's `... #### N` form (the gold
# number is what follows `####`). GSM8K is the one there is now; others are registered by adding a loader here.

# %%
#| export
DATASETS: dict[str, Callable[[str], list[dict]]] = {"gsm8k": lambda split: load_gsm8k(split)}
EVAL_MODES = ("pass_at_1", "pass", "maj")

def load_dataset(name: str, split: str = "test") -> list[dict]:
    "Rows of dataset `name`, split `split`."
    if name not in DATASETS: raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[name](split)

# %% [markdown]
# ## The config
#
# The command's arguments, in the MaxText grammar of `maxpost.config`. Every choice is checked when the config is
# built, before a model is loaded: an unknown dataset, template, engine or mode, or a combination that cannot mean
# anything (K greedy samples are K copies of one), is a one-line error.

# %%
#| export
class EvalConfig(Config):
    "python -m maxpost.evaluate load_parameters_path=… dataset=gsm8k eval_mode=pass_at_1|pass|maj …"
    model_name: str = ""                      # a preset; when set, the checkpoint is checked against it
    load_parameters_path: str = ""            # a maxpost checkpoint folder or an HF model folder
    tokenizer_path: str = ""                  # default: the checkpoint's tokenizer/ (or the HF folder)
    dataset: str = "gsm8k"
    split: str = "test"
    eval_mode: str = "pass_at_1"              # pass_at_1 | pass | maj
    num_eval_passes: int = 1                  # K: samples per problem for pass / maj
    num_eval_examples: int | None = None      # evaluate the first N problems only; None = all
    template: str = "maxtext_gsm8k"           # a name in PROMPT_TEMPLATES
    few_shot: int = 0                         # solved train examples put before the question
    rollout_engine: str = "native"            # native | vllm
    temperature: float | None = None          # None: 0 (greedy) for pass_at_1, 1.0 for pass / maj
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 512                     # completion tokens per sample
    seed: int = 0
    batch_size: int = 64                      # sequences (problems × K) per engine call
    max_prefill_length: int = 2048            # longest prompt the engine accepts
    dtype: str = "float32"                    # float32 | bfloat16 (compute and params)
    fallback_last_number: bool = False        # when no tagged answer is found, take the last number in the text
    base_output_directory: str = ""
    run_name: str = ""

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v):
        if v not in DATASETS: raise ValueError(f"unknown dataset {v!r}; known: {', '.join(DATASETS)}")
        return v

    @field_validator("eval_mode")
    @classmethod
    def _mode(cls, v):
        if v not in EVAL_MODES: raise ValueError(f"unknown eval_mode {v!r}; known: {', '.join(EVAL_MODES)}")
        return v

    @field_validator("template")
    @classmethod
    def _template(cls, v):
        if v not in PROMPT_TEMPLATES: raise ValueError(f"unknown template {v!r}; known: {', '.join(PROMPT_TEMPLATES)}")
        return v

    @field_validator("rollout_engine")
    @classmethod
    def _engine(cls, v):
        if v not in ENGINES: raise ValueError(f"unknown rollout_engine {v!r}; known: {', '.join(ENGINES)}")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v):
        if v not in ("float32", "bfloat16"): raise ValueError(f"dtype must be float32 or bfloat16, not {v!r}")
        return v

    @model_validator(mode="after")
    def _combination(self):
        if self.num_eval_passes < 1: raise ValueError(f"num_eval_passes must be >= 1, got {self.num_eval_passes}")
        if self.num_eval_examples is not None and self.num_eval_examples < 1:
            raise ValueError(f"num_eval_examples must be >= 1 (or None for all), got {self.num_eval_examples}")
        if self.eval_mode == "pass_at_1" and self.num_eval_passes != 1:
            raise ValueError(f"eval_mode=pass_at_1 draws one greedy sample per problem; for num_eval_passes="
                             f"{self.num_eval_passes} use eval_mode=pass (pass@k) or eval_mode=maj (maj@k)")
        if self.eval_mode != "pass_at_1" and self.sampling_temperature == 0 and self.num_eval_passes > 1:
            raise ValueError(f"eval_mode={self.eval_mode} with temperature=0: the {self.num_eval_passes} greedy "
                             f"samples would be identical; set temperature > 0")
        if self.few_shot < 0 or self.max_tokens < 1 or self.batch_size < 1:
            raise ValueError("few_shot must be >= 0, max_tokens and batch_size >= 1")
        SamplingParams(temperature=self.sampling_temperature, top_k=self.top_k, top_p=self.top_p,
                       max_tokens=self.max_tokens, n=self.num_eval_passes, seed=self.seed)   # same checks as generate
        return self

    @property
    def sampling_temperature(self) -> float:
        "The temperature used: `temperature`, or its default for the mode."
        if self.temperature is not None: return float(self.temperature)
        return 0.0 if self.eval_mode == "pass_at_1" else 1.0

    @property
    def headline_metric(self) -> str:
        "The summary key this mode reports first."
        return {"pass_at_1": "accuracy", "pass": f"pass@{self.num_eval_passes}",
                "maj": f"maj@{self.num_eval_passes}"}[self.eval_mode]

# %%
from fastcore.test import test_eq, test_fail, test_close

test_eq(EvalConfig().sampling_temperature, 0.0)
test_eq(EvalConfig(eval_mode="maj", num_eval_passes=8).headline_metric, "maj@8")
test_eq(EvalConfig(eval_mode="pass", num_eval_passes=4).sampling_temperature, 1.0)
test_fail(lambda: load_config(EvalConfig, ["dataset=math500"]), contains="unknown dataset 'math500'; known: gsm8k")
test_fail(lambda: load_config(EvalConfig, ["rollout_engine=sglang"]), contains="unknown rollout_engine 'sglang'")
test_fail(lambda: load_config(EvalConfig, ["eval_mode=best"]), contains="unknown eval_mode")
test_fail(lambda: load_config(EvalConfig, ["template=cot"]), contains="unknown template")
test_fail(lambda: load_config(EvalConfig, ["num_eval_passes=4"]), contains="use eval_mode=pass")
test_fail(lambda: load_config(EvalConfig, ["eval_mode=maj", "num_eval_passes=4", "temperature=0"]), contains="identical")
test_fail(lambda: load_config(EvalConfig, ["eval_mode=pass", "top_p=0"]), contains="top_p")
test_fail(lambda: load_config(EvalConfig, ["num_eval_exmaples=3"]), contains="did you mean 'num_eval_examples'")
test_eq(load_config(EvalConfig, ["num_eval_examples=None"]).num_eval_examples, None)

# %% [markdown]
# ## `evaluate`
#
# `evaluate(model_or_engine, tokenizer, dataset_rows, cfg)` is what the command runs and what RL calls before and
# after training (with its own engine, after `sync_weights`, or with the model: a `Decoder` gets a native engine; the
# compiled programs are shared between engines of one architecture, so a second call does not recompile).
#
# 1. Cap the rows to `num_eval_examples` (the first N).
# 2. Render each question with the template (and `few_shot` solved train examples) as chat messages, through the
#    tokenizer's chat template, ending with the assistant prompt.
# 3. Sort problems by prompt length and cut them into batches of `batch_size // K` problems, so that each engine call
#    holds prompts of similar length (less padding, fewer compiled shapes); a tqdm bar counts problems.
# 4. Extract and check every completion's answer with `maxpost.rewards` (`extract_answer`, `is_correct`,
#    `format_ok`): the same code the RL rewards use, so an evaluation and a reward never disagree on a completion.
# 5. Summarize with `maxpost.metrics.summarize` (all pass@k and maj@k for k in {1, K}), and add what was run.
#
# Sampled runs are reproducible: the native engine draws each sample from a stream keyed on the seed, the prompt's place
# in its batch and the sample index, and the batches are a fixed function of the rows, the cap, `batch_size` and K.
# (Changing `batch_size` or `num_eval_examples` regroups the problems and so changes which samples they get.)
#
# A record per problem holds what is needed to re-score it later without the model (`score_completions_file`):
# index, question, rendered prompt, gold, completions, extracted answers, correct, format_ok, lengths (tokens),
# finish reasons, template.

# %%
#| export
def _as_config(cfg) -> EvalConfig:
    if cfg is None: return EvalConfig()
    if isinstance(cfg, EvalConfig): return cfg
    if isinstance(cfg, dict): return EvalConfig(**cfg)
    raise TypeError(f"cfg must be an EvalConfig or a dict, not {type(cfg).__name__}")

def score_results(row: dict, results: list, template: str, fallback_last_number: bool = False) -> dict:
    "The fields of a problem's record computed from its GenerationResults."
    gold = format_gold(row["answer"])
    texts = [r.text for r in results]
    answers = [extract_answer(t, fallback_last_number=fallback_last_number) for t in texts]
    return dict(gold=gold, completions=texts, answers=answers, correct=[is_correct(a, gold) for a in answers],
                format_ok=[format_ok(t, template) for t in texts], lengths=[len(r.token_ids) for r in results],
                finish_reasons=[r.finish_reason for r in results])

def headline(summary: dict) -> str:
    "'accuracy 0.310 [0.250, 0.380] on 200 of 1319 problems': the mode's metric and the cap, on one line."
    e = summary["eval"]
    m = summary[e["headline"]]
    return (f"{e['headline']} {m['value']:.3f} [{m['ci'][0]:.3f}, {m['ci'][1]:.3f}] on {summary['n_problems']} of "
            f"{e['n_available']} problems")

def evaluate(model_or_engine, tokenizer, dataset_rows: Sequence[dict], cfg: EvalConfig | dict | None = None,
             out_dir=None, progress: bool = True) -> tuple[dict, list[dict]]:
    "Generate, check and summarize `dataset_rows` under `cfg`; returns (summary, per-problem records)."
    from maxpost.model import Decoder
    cfg = _as_config(cfg)
    K = cfg.num_eval_passes
    if isinstance(model_or_engine, Decoder):
        engine = NativeEngine(model_or_engine, tokenizer, max_batch=max(cfg.batch_size, K),
                              max_prefill=cfg.max_prefill_length)
    elif hasattr(model_or_engine, "generate"): engine = model_or_engine
    else: raise TypeError(f"evaluate needs a Decoder or an engine, not {type(model_or_engine).__name__}")
    tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
    if tokenizer is None: raise ValueError("evaluate needs a tokenizer (for the chat template and the completions)")
    n_available = len(dataset_rows)
    if n_available == 0: raise ValueError("no dataset rows to evaluate")
    rows = list(dataset_rows)[:cfg.num_eval_examples] if cfg.num_eval_examples else list(dataset_rows)
    shots = load_gsm8k("train", cfg.few_shot) if cfg.few_shot else None
    prompts = []
    for r in rows:
        msgs = build_prompt(r["question"], cfg.template, cfg.few_shot, few_shot_examples=shots)
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        prompts.append((text, list(tokenizer.encode(text, add_special_tokens=False))))
    sp = SamplingParams(temperature=cfg.sampling_temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                        max_tokens=cfg.max_tokens, n=K, seed=cfg.seed)
    order = sorted(range(len(rows)), key=lambda i: -len(prompts[i][1]))     # longest first: the slowest batch compiles first
    per_call = max(1, cfg.batch_size // K)
    records: list[dict | None] = [None] * len(rows)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(rows), unit="problem", desc=f"{cfg.dataset} {cfg.eval_mode}")
    t0, ntok = time.perf_counter(), 0
    for start in range(0, len(order), per_call):
        idx = order[start:start + per_call]
        results = engine.generate([prompts[i][1] for i in idx], sp)
        for j, i in enumerate(idx):
            mine = results[j * K:(j + 1) * K]
            ntok += sum(len(r.token_ids) for r in mine)
            records[i] = dict(index=i, question=rows[i]["question"], prompt=prompts[i][0], template=cfg.template,
                              **score_results(rows[i], mine, cfg.template, cfg.fallback_last_number))
        if bar is not None: bar.update(len(idx))
    if bar is not None: bar.close()
    seconds = time.perf_counter() - t0
    summary = summarize(records)
    summary["eval"] = dict(dataset=cfg.dataset, split=cfg.split, eval_mode=cfg.eval_mode, k=K,
                           headline=cfg.headline_metric, temperature=cfg.sampling_temperature, top_k=cfg.top_k,
                           top_p=cfg.top_p, max_tokens=cfg.max_tokens, template=cfg.template, few_shot=cfg.few_shot,
                           seed=cfg.seed, n_available=n_available, n_evaluated=len(rows),
                           engine=type(engine).__name__, seconds=seconds, tokens=ntok,
                           tokens_per_s=ntok / max(seconds, 1e-9))
    if out_dir is not None:
        out = Path(out_dir); out.mkdir(parents=True, exist_ok=True)
        write_jsonl(records, out / "completions.jsonl")
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary, records

# %% [markdown]
# ### Scoring, checked with a scripted engine
#
# An engine that returns prepared completions makes the statistics exactly predictable. Six problems, K = 4 samples:
# problem $i$ gets $c_i$ = (4, 3, 2, 1, 0, 0) correct answers in the template's format, the other samples a wrong
# number (or, for problem 5, no answer at all). Then pass@1 is the mean of $c_i / 4$, pass@4 counts the problems with
# any correct sample, and maj@4 the problems whose most common answer is right: problems 0 and 1 (and not problem 2,
# whose 2 : 2 tie goes to the answer seen first, the wrong one, by construction).

# %%
from maxpost.generate import GenerationResult
from maxpost.convert.from_gguf import embedded_hf
from maxpost.metrics import pass_at_k, score_completions_file
import tempfile

class ScriptedEngine:
    "An Engine whose completions are looked up by the question in the prompt."
    def __init__(self, tokenizer, script: dict[str, list[str]]):
        self.tokenizer, self.script, self.calls = tokenizer, script, []
    def sync_weights(self, params): pass
    def generate(self, prompts, params=None):
        self.calls.append(len(prompts))
        out = []
        for pi, ids in enumerate(prompts):
            text = self.tokenizer.decode(ids)
            q = next(q for q in self.script if q in text)
            for si, c in enumerate(self.script[q][:params.n]):
                toks = self.tokenizer.encode(c)
                out.append(GenerationResult(pi, si, list(ids), toks + [2], c, np.zeros(len(toks) + 1, np.float32), "stop"))
        return out

tok = load_tokenizer(embedded_hf("smollm2-135m"))
rows = [dict(question=f"Question number {i}: how many apples?", answer=f"work\n#### {10 + i}") for i in range(6)]
ok = lambda i: f"<reasoning>count</reasoning>\n<answer>{10 + i}</answer>"
bad = lambda i: f"<reasoning>count</reasoning>\n<answer>{99 + i}</answer>"
c = [4, 3, 2, 1, 0, 0]
script = {r["question"]: ([bad(i)] * (4 - c[i]) + [ok(i)] * c[i]) if i < 5 else ["I do not know"] * 4
          for i, r in enumerate(rows)}
eng = ScriptedEngine(tok, script)
cfg = EvalConfig(eval_mode="maj", num_eval_passes=4, batch_size=8)
tmp = Path(tempfile.mkdtemp())
summary, records = evaluate(eng, tok, rows, cfg, out_dir=tmp / "run", progress=False)
test_eq(eng.calls, [2, 2, 2])                                    # 8 sequences per call = 2 problems × 4 samples
test_close(summary["accuracy"]["value"], np.mean(np.array(c) / 4), eps=1e-12)
test_close(summary["pass@4"]["value"], 4 / 6, eps=1e-12)
test_close(summary["pass@1"]["value"], pass_at_k(np.full(6, 4), np.array(c), 1).mean(), eps=1e-12)
test_close(summary["maj@4"]["value"], 2 / 6, eps=1e-12)
test_close(summary["format_accuracy"]["value"], 5 / 6, eps=1e-12)
test_eq(summary["truncation_rate"]["value"], 0.0)
test_eq([r["index"] for r in records], list(range(6)))           # dataset order, whatever the batching
test_eq(records[5]["answers"], [None] * 4)
test_eq(records[0]["gold"], "10")
print(format_summary(summary)); print(headline(summary))
test_eq(headline(summary), f"maj@4 0.333 [{summary['maj@4']['ci'][0]:.3f}, {summary['maj@4']['ci'][1]:.3f}] on 6 of 6 problems")

# %% [markdown]
# The files: one JSONL line per problem, which re-scores (from the completions alone) to the same summary, and the
# summary as JSON. The cap is applied to the first rows and reported against the full count.

# %%
test_eq(sorted(p.name for p in (tmp / "run").iterdir()), ["completions.jsonl", "summary.json"])
test_eq(json.loads((tmp / "run" / "summary.json").read_text())["maj@4"], summary["maj@4"])
again = score_completions_file(tmp / "run" / "completions.jsonl", k=[1, 4])
for key in ("accuracy", "pass@1", "pass@4", "maj@4", "format_accuracy"): test_eq(again[key], summary[key])
s3, r3 = evaluate(eng, tok, rows, EvalConfig(num_eval_examples=3, template="maxtext_gsm8k"), progress=False)
assert headline(s3).endswith("on 3 of 6 problems"), headline(s3); test_eq(len(r3), 3)
test_eq(s3["accuracy"]["value"], 1 / 3)                          # greedy-mode first sample: problems 0 ✓, 1 ✗, 2 ✗
test_fail(lambda: evaluate(eng, tok, [], cfg), contains="no dataset rows")
test_fail(lambda: evaluate(object(), tok, rows, cfg), contains="needs a Decoder or an engine")

# %% [markdown]
# ## The command
#
# `python -m maxpost.evaluate load_parameters_path=… [key=value …]`. Everything that can be checked without the model
# is checked first: the config, the output folder, the engine (vLLM installed?), the dataset and the checkpoint path.
# Then it loads the model and tokenizer, runs `evaluate`, writes `completions.jsonl`, `summary.json` and
# `config.yml` under `base_output_directory/run_name/`, and prints the summary and the headline with its cap.

# %%
#| export
def main(argv=None):
    "Entry point of `python -m maxpost.evaluate`."
    cfg = run_cli(lambda: load_config(EvalConfig, argv))
    def go():
        out = output_dir(cfg.base_output_directory, cfg.run_name)
        if not cfg.load_parameters_path: raise ConfigError("load_parameters_path is required (a maxpost checkpoint or an HF folder)")
        if not Path(cfg.load_parameters_path).exists():
            raise ConfigError(f"load_parameters_path {cfg.load_parameters_path} does not exist")
        check_engine(cfg.rollout_engine)
        rows = load_dataset(cfg.dataset, cfg.split)
        tokenizer = load_tokenizer(cfg.tokenizer_path or cfg.load_parameters_path)
        import jax.numpy as jnp
        dtype = jnp.float32 if cfg.dtype == "float32" else jnp.bfloat16
        extra = dict(max_batch=max(cfg.batch_size, cfg.num_eval_passes), max_prefill=cfg.max_prefill_length) \
            if cfg.rollout_engine == "native" else {}
        engine = make_engine(cfg.rollout_engine, cfg.load_parameters_path, tokenizer, dtype=dtype,
                             model_name=cfg.model_name or None, **extra)
        out.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, out / "config.yml")
        return evaluate(engine, tokenizer, rows, cfg, out_dir=out)
    summary, records = run_cli(go)
    print(format_summary(summary))
    print(headline(summary))
    print(f"wrote {output_dir(cfg.base_output_directory, cfg.run_name)}/{{completions.jsonl,summary.json,config.yml}}")
    return summary

# %%
#| eval: false
#| export
if __name__ == "__main__": main()

# %% [markdown]
# Errors come before any compute, as one line and exit status 2:

# %%
import subprocess, sys
def cli(*args):
    "Run the command in a subprocess; (exit status, stdout, stderr)."
    p = subprocess.run([sys.executable, "-m", "maxpost.evaluate", *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr

rc, out, err = cli("dataset=math", "load_parameters_path=/nonexistent", f"base_output_directory={tmp}")
test_eq(rc, 2); assert "unknown dataset 'math'" in err, err
rc, out, err = cli("load_parameters_path=/nonexistent", f"base_output_directory={tmp}")
test_eq(rc, 2); assert "does not exist" in err, err
rc, out, err = cli(f"load_parameters_path={embedded_hf('smollm2-135m')}")
test_eq(rc, 2); assert "base_output_directory is required" in err, err

# %% [markdown]
# ## SmolLM2-135M-Instruct on GSM8K
#
# The real model (float32, native engine, greedy) on a fixed slice: the first 20 problems of the GSM8K test set, with
# each template, `max_tokens=256`. Twenty problems give wide intervals (a Wilson interval on 20 is about ±0.2 wide);
# this is a smoke test of the pipeline, not a measurement of the model.

# %%
#| slow
from maxpost.checkpoint import load_model
from maxpost.metrics import plot_accuracy
from maxpost.rewards import load_gsm8k

smol = embedded_hf("smollm2-135m")
model, tok = load_model(smol), load_tokenizer(smol)
test_rows = load_gsm8k("test")
engine = NativeEngine(model, tok, max_batch=32)
summaries = {}
for template in ("maxtext_gsm8k", "plain"):
    cfg = EvalConfig(num_eval_examples=20, template=template, max_tokens=256, batch_size=32)
    summaries[template], recs = evaluate(engine, tok, test_rows, cfg, out_dir=tmp / f"smol-{template}")
    print(f"--- {template}: {summaries[template]['eval']['seconds']:.0f} s, "
          f"{summaries[template]['eval']['tokens_per_s']:.1f} tok/s")
    print(format_summary(summaries[template])); print(headline(summaries[template]))
    assert headline(summaries[template]).endswith("on 20 of 1319 problems")
print(recs[0]["completions"][0][:600])
plot_accuracy(summaries, title="SmolLM2-135M-Instruct, GSM8K test[:20], greedy")

# %% [markdown]
# What this cell printed when it was written (SmolLM2-135M-Instruct, float32, greedy, `max_tokens=256`, the first **20
# problems** of the GSM8K test set, so every interval is wide):
#
# | template | accuracy | format accuracy | truncation rate | mean length (tokens) |
# |---|---|---|---|---|
# | `maxtext_gsm8k` | 0.00 [0.00, 0.16] | 0.00 [0.00, 0.16] | 0.50 [0.30, 0.70] | 225 |
# | `plain` | 0.00 [0.00, 0.16] | 0.30 [0.15, 0.52] | 0.85 [0.64, 0.95] | 224 |
#
# The 135M model solves none of the 20 (its published GSM8K score is in the low single digits), never uses the
# `<reasoning>`/`<answer>` tags unprompted by examples, writes a `#### N` last line in 6 of 20 plain-template
# completions, and often loops until `max_tokens`. This is the baseline the SFT and RL notebooks start from. Each
# template took about 9.5 minutes here (20 rows in one batch of 32, compile included) on a 2-core machine shared with
# other jobs.

