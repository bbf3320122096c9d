"""A MaxText or TRL user's commands work unchanged: each command below is copied from its source (named with it), with
only the module path, the model path and the dataset path changed, and run for one step on the embedded SmolLM2-135M.

What is changed, and nothing else:
- the module: `python -m maxpost.train_sft` / `maxpost.train_rl` / `maxpost.train_dpo` (MaxText's RL command also names MaxText's own
  `rl.yml`, a file of MaxText's; maxpost's module brings its own base config, so that argument goes with the module);
- the model: `model_name=smollm2-135m` and the embedded model's HF folder for `load_parameters_path`,
  `tokenizer_path` or TRL's `--model_name_or_path`;
- the dataset: a small local JSONL file in the command's expected format for `hf_path` / `--dataset_name`;
- environment placeholders that name a place or a machine: `run_name`, `base_output_directory` / `--output_dir`,
  `hf_access_token` (a dummy), `chips_per_vm=1`.
Then `BUDGET` keys are appended (one step, short sequences, no evaluation or saving) so that each run takes seconds;
they change how long the run is, not how the command is read.
"""
import json
from pathlib import Path
import pytest
from conftest import cli_env as _env, last_json, run_module

# ---- the commands, as published ------------------------------------------------------------------------------------
# MaxText, docs/tutorials/posttraining/sft.md ("Run SFT on Hugging Face Dataset"), maxtext 0.2.x:
MAXTEXT_SFT = """python3 -m maxtext.trainers.post_train.sft.train_sft run_name=${RUN_NAME?}
    base_output_directory=${BASE_OUTPUT_DIRECTORY?} model_name=${MODEL?} load_parameters_path=${MAXTEXT_CKPT_PATH?}
    per_device_batch_size=${PER_DEVICE_BATCH_SIZE?} steps=${STEPS?} hf_path=${DATASET_NAME?}
    train_split=${TRAIN_SPLIT?} train_data_columns=${TRAIN_DATA_COLUMNS?} profiler=xplane"""
# MaxText, docs/tutorials/posttraining/rl.md ("Run GRPO"; "Run GSPO" adds loss_algo=gspo-token):
MAXTEXT_GRPO = """python3 -m src.maxtext.trainers.post_train.rl.train_rl src/maxtext/configs/post_train/rl.yml
    model_name=${MODEL} tokenizer_path=${TOKENIZER} load_parameters_path=${MAXTEXT_CKPT_PATH} run_name=${RUN_NAME}
    base_output_directory=${BASE_OUTPUT_DIRECTORY} hf_access_token=${HF_TOKEN} chips_per_vm=${CHIPS_PER_VM}"""
MAXTEXT_GSPO = MAXTEXT_GRPO + " loss_algo=gspo-token"
# TRL, docs/source/quickstart.md + clis.md: `SFTTrainer(model="Qwen/Qwen2.5-0.5B",
# train_dataset=load_dataset("trl-lib/Capybara", split="train"))`, as its command line:
TRL_SFT = "trl sft --model_name_or_path Qwen/Qwen2.5-0.5B --dataset_name trl-lib/Capybara --output_dir Qwen2.5-0.5B-SFT"
# MaxText, docs/tutorials/posttraining/dpo.md ("Running DPO Training"), maxtext 0.2.x:
MAXTEXT_DPO = """python3 -m maxtext.trainers.post_train.dpo.train_dpo run_name=${RUN_NAME?}
    base_output_directory=${BASE_OUTPUT_DIRECTORY?} model_name=${MODEL?} load_parameters_path=${MAXTEXT_CKPT_PATH?}
    dataset_type=hf hf_path=${DATASET_NAME?} train_split=${TRAIN_SPLIT?} train_data_columns="${TRAIN_DATA_COLUMNS?}"
    steps=${STEPS?} eval_interval=0 per_device_batch_size=1 max_target_length=1024 use_dpo=1 dpo.algo=${ALGORITHM?}"""
# TRL, docs/source/dpo_trainer.md (quick start: Qwen2-0.5B-Instruct on trl-lib/ultrafeedback_binarized) + clis.md,
# as its command line:
TRL_DPO = ("trl dpo --model_name_or_path Qwen/Qwen2-0.5B-Instruct --dataset_name trl-lib/ultrafeedback_binarized "
           "--output_dir Qwen2-0.5B-DPO")

# TRL, docs/source/grpo_trainer.md (quick start: `GRPOTrainer(model="Qwen/Qwen2-0.5B-Instruct",
# reward_funcs=accuracy_reward, train_dataset=load_dataset("trl-lib/DeepMath-103K", split="train"))`) + clis.md
# (`trl grpo … --reward_funcs accuracy_reward`), as its command line:
TRL_GRPO = ("trl grpo --model_name_or_path Qwen/Qwen2-0.5B-Instruct --dataset_name trl-lib/DeepMath-103K "
            "--reward_funcs accuracy_reward --output_dir Qwen2-0.5B-GRPO")

BUDGET = {
    "sft": ["max_target_length=64", "eval_interval=0", "save_model=false", "enable_checkpointing=false",
            "enable_tqdm=false"],
    "dpo": ["max_target_length=64", "save_model=false", "enable_checkpointing=false", "enable_tqdm=false"],
    "rl": ["steps=1", "batch_size=2", "num_generations=2", "max_completion_length=4", "num_train_rows=2",
           "eval_before_after=false", "save_model=false", "enable_checkpointing=false", "enable_tqdm=false"],
}

def _argv(command: str, env: dict) -> list[str]:
    "The command's arguments after the module (and after MaxText's config file), placeholders filled from `env`."
    import re, shlex
    words = shlex.split(command)
    words = words[words.index("-m") + 2:] if "-m" in words else words[2:]          # drop `python3 -m module` / `trl sft`
    if words and words[0].endswith((".yml", ".yaml")): words = words[1:]           # MaxText's own rl.yml (see above)
    fill = lambda w: re.sub(r"\$\{(\w+)\??\}", lambda m: str(env[m.group(1)]), w)
    return [fill(w) for w in words]

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Local stand-ins for the commands' hub datasets, in their formats: chat messages (UltraChat, Capybara), and the
    DPO tutorial's 3-column triplets (argilla/distilabel-intel-orca-dpo-pairs: input, chosen, rejected), TRL's DPO pairs
    (ultrafeedback_binarized) and TRL's GRPO prompts with their `solution` (DeepMath-103K)."""
    d = tmp_path_factory.mktemp("compat")
    msgs = [[{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": f"It is {i + 1}."}]
            for i in range(8)]
    (d / "chat.jsonl").write_text("".join(json.dumps({"messages": m, "id": i}) + "\n" for i, m in enumerate(msgs)))
    pair = lambda i, a: [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": f"It is {a}."}]
    (d / "ultrafeedback.jsonl").write_text("".join(json.dumps({"chosen": pair(i, i + 1), "rejected": pair(i, i + 2),
                                                               "score_chosen": 8.0, "score_rejected": 2.0}) + "\n"
                                                   for i in range(4)))   # TRL's conversational, implicit-prompt pairs
    (d / "deepmath.jsonl").write_text("".join(json.dumps({        # TRL's DeepMath-103K: conversational prompt + solution
        "prompt": [{"role": "user", "content": f"What is {i}/3? Put the final answer in \\boxed{{}}."}],
        "solution": f"\\frac{{{i}}}{{3}}"}) + "\n" for i in range(1, 5)))
    (d / "dpo.jsonl").write_text("".join(json.dumps({"input": f"What is {i} + 1?", "chosen": f"It is {i + 1}.",
                                                     "rejected": f"It is {i + 2}."}) + "\n" for i in range(4)))
    return d

def _result(r) -> dict: return last_json(r.stdout)

def test_maxtext_sft(hf_smol, data, tmp_path):
    env = dict(RUN_NAME="sft", BASE_OUTPUT_DIRECTORY=tmp_path, MODEL="smollm2-135m", MAXTEXT_CKPT_PATH=hf_smol,
               PER_DEVICE_BATCH_SIZE=1, STEPS=1, DATASET_NAME=data / "chat.jsonl", TRAIN_SPLIT="train_sft",
               TRAIN_DATA_COLUMNS="['messages']")
    res = _result(run_module("maxpost.train_sft", *_argv(MAXTEXT_SFT, env), *BUDGET["sft"], env=_env(tmp_path)))
    assert res["steps"] == 1
    cfg = (tmp_path / "sft" / "config.yml").read_text()
    assert "profiler: xplane" in cfg and "train_split: train_sft" in cfg

def test_trl_sft(hf_smol, data, tmp_path):
    out = tmp_path / "Qwen2.5-0.5B-SFT"
    argv = _argv(TRL_SFT.replace("Qwen/Qwen2.5-0.5B", str(hf_smol)).replace("trl-lib/Capybara", str(data / "chat.jsonl"))
                 .replace("Qwen2.5-0.5B-SFT", str(out)), {})
    res = _result(run_module("maxpost.train_sft", *argv, "--max_steps", "1", "--per_device_train_batch_size", "1",
                             *BUDGET["sft"], env=_env(tmp_path)))
    assert res["steps"] == 1 and Path(res["run_dir"]) == out

def test_maxtext_dpo(hf_smol, data, tmp_path):
    "The DPO tutorial's command (full fine-tuning, MaxText's keys as given; `max_target_length` cut to 64 by BUDGET)."
    env = dict(RUN_NAME="dpo", BASE_OUTPUT_DIRECTORY=tmp_path, MODEL="smollm2-135m", MAXTEXT_CKPT_PATH=hf_smol,
               DATASET_NAME=data / "dpo.jsonl", TRAIN_SPLIT="train", TRAIN_DATA_COLUMNS="['input', 'chosen', 'rejected']",
               STEPS=1, ALGORITHM="dpo")
    res = _result(run_module("maxpost.train_dpo", *_argv(MAXTEXT_DPO, env), *BUDGET["dpo"], env=_env(tmp_path)))
    assert res["steps"] == 1 and res["algo"] == "dpo" and abs(res["loss"] - 0.6931) < 1e-3, res   # log 2 at step 1
    assert "max_target_length: 64" in (tmp_path / "dpo" / "config.yml").read_text()

def test_trl_dpo(hf_smol, data, tmp_path):
    "TRL's DPO quick start: conversational pairs whose shared first turn is the prompt; `--dataset_name` selects them."
    out = tmp_path / "Qwen2-0.5B-DPO"
    argv = _argv(TRL_DPO.replace("Qwen/Qwen2-0.5B-Instruct", str(hf_smol))
                 .replace("trl-lib/ultrafeedback_binarized", str(data / "ultrafeedback.jsonl")).replace("Qwen2-0.5B-DPO", str(out)), {})
    res = _result(run_module("maxpost.train_dpo", *argv, "--max_steps", "1", "--per_device_train_batch_size", "1",
                             *BUDGET["dpo"], env=_env(tmp_path)))
    assert res["steps"] == 1 and res["algo"] == "dpo" and abs(res["loss"] - 0.6931) < 1e-3, res
    assert Path(res["run_dir"]) == out and "ultrafeedback.jsonl" in (out / "config.yml").read_text()

def _rl_env(hf_smol, tmp_path):
    return dict(MODEL="smollm2-135m", TOKENIZER=hf_smol, MAXTEXT_CKPT_PATH=hf_smol, RUN_NAME="rl",
                BASE_OUTPUT_DIRECTORY=tmp_path, HF_TOKEN="hf_dummy", CHIPS_PER_VM=1)

def test_maxtext_grpo(hf_smol, tmp_path):
    r = run_module("maxpost.train_rl", *_argv(MAXTEXT_GRPO, _rl_env(hf_smol, tmp_path)), *BUDGET["rl"], env=_env(tmp_path))
    assert _result(r)["steps"] == 1

def test_maxtext_gspo(hf_smol, tmp_path, capsys):
    """The GSPO command differs from the GRPO one by `loss_algo=gspo-token` only; a second one-step RL run would double
    this file's cost (minutes on the 2-core CI machine), so it is read and checked as train_rl does before any compute:
    gspo-token with the paper's clip range, and no epsilon warning (the user set none)."""
    from maxpost.config import load_config
    from maxpost.rl.config import RLConfig, check_config
    from maxpost.train_rl import default_config
    cfg = load_config(RLConfig, _argv(MAXTEXT_GSPO, _rl_env(hf_smol, tmp_path)) + BUDGET["rl"], base_yaml=default_config())
    lc = check_config(cfg)
    assert (lc.loss_algo, lc.epsilon, lc.epsilon_high) == ("gspo-token", 3e-4, 4e-4)
    assert "warning" not in capsys.readouterr().err

def test_trl_grpo(hf_smol, data, tmp_path):
    """TRL's GRPO quick start: `accuracy_reward` is TRL's (the LaTeX answer against column `solution`), and the
    unnamed columns are TRL's `prompt` / `solution`. A reward function that fails does not stop a step (it scores 0,
    counted in `reward_errors`), so the test reads the step's metrics, not only its exit status."""
    out = tmp_path / "Qwen2-0.5B-GRPO"
    argv = _argv(TRL_GRPO.replace("Qwen/Qwen2-0.5B-Instruct", str(hf_smol))
                 .replace("trl-lib/DeepMath-103K", str(data / "deepmath.jsonl")).replace("Qwen2-0.5B-GRPO", str(out)), {})
    res = _result(run_module("maxpost.train_rl", *argv, *BUDGET["rl"], env=_env(tmp_path)))
    assert res["steps"] == 1 and Path(res["run_dir"]) == out
    m = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert m["reward_errors"] == 0 and "rewards/accuracy_reward/mean" in m, m
    cfg = (out / "config.yml").read_text()
    assert all(f"{k}\n" in cfg for k in ("reward_functions: accuracy_reward", "prompt_column: prompt",
                                          "answer_column: solution")), cfg
