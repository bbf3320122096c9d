"""`python -m maxpost.train_dpo` end to end: a tiny random model learns the synthetic preference and resumes exactly
after SIGKILL; bad input stops with one line before any compute; MaxText's command (module path changed) runs DPO on
SmolLM2-135M for three steps and lowers the loss on its batch."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest
from conftest import cli_env as _env, kill_at, read_metrics as _metrics, run_json

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model_name=tiny-gemma3", "enable_tqdm=false", "save_model=false"]

def _cmd(*args) -> list[str]:
    return [sys.executable, "-m", "maxpost.train_dpo", *map(str, args)]

def _run(args, env, timeout=600) -> dict: return run_json(_cmd(*args), env, timeout)

SHARED = ["model_name=tiny-llama", "dpo.share_prompt=true", "dpo.max_response_length=24"]   # one row per pair

@pytest.mark.parametrize("layout", [[], SHARED], ids=["two_rows", "shared_prompt"])
def test_tiny_dpo_learns_and_resumes_exactly_after_sigkill(tmp_path, layout):
    """LoRA DPO on the synthetic preference (even over odd token ids, maxpost.dpo_data.synthetic_pairs): the held-out
    preference accuracy after 30 steps is above the 95% interval of the untrained model's; a run killed with SIGKILL
    after its checkpoint at step 10, then restarted with the same command, logs the same 30 losses and metrics. Both
    layouts: two rows per pair (tiny-gemma3), and one shared row per pair (`dpo.share_prompt`, tiny-llama: no
    sliding window)."""
    env = _env(tmp_path)
    common = TINY + layout + ["steps=30", "checkpoint_period=10", "eval_interval=30", "use_lora=true", "lora_rank=4",
                     f"base_output_directory={tmp_path}"]
    ref = _run(common + ["run_name=ref"], env)
    first, last = ref["eval_preference_accuracy_initial"], ref["eval_preference_accuracy"]
    assert last[0] > first[2], (first, last)
    ref_m = _metrics(ref["run_dir"])
    assert [m["step"] for m in ref_m] == list(range(1, 31))
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
            "logps/rejected"} <= set(ref_m[0])
    run_dir = tmp_path / "killed"
    kill_at(_cmd(*common, "run_name=killed"), env, run_dir / "checkpoints" / "10", 300)
    assert 30 not in [int(d.name) for d in (run_dir / "checkpoints").iterdir() if d.name.isdigit()]
    res = _run(common + ["run_name=killed"], env)
    assert res["start_step"] >= 10 and res["steps"] == 30, res
    got = _metrics(run_dir)
    assert [m["step"] for m in got] == list(range(1, 31))
    for k in ("loss", "grad_norm", "rewards/margins", "rewards/accuracies"):
        assert [m[k] for m in got] == [m[k] for m in ref_m], k
    assert got[-1]["eval_preference_accuracy"] == ref_m[-1]["eval_preference_accuracy"]

def _error(capsys, argv) -> str:
    from maxpost.train_dpo import main
    with pytest.raises(SystemExit) as e: main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: "), err
    return err[-1]

def test_bad_input_stops_before_compute(tmp_path, hf_smol, capsys):
    "Each bad input of the issue ends with one `error:` line, exit 2, and no run folder content."
    rows = tmp_path / "pairs.jsonl"
    rows.write_text(json.dumps({"input": "2+2?", "chosen": "4", "rejected": "5"}) + "\n")
    no_rej = tmp_path / "norej.jsonl"; no_rej.write_text(json.dumps({"prompt": "2+2?", "chosen": "4"}) + "\n")
    out = [f"base_output_directory={tmp_path / 'runs'}", "run_name=x", "enable_tqdm=false"]
    hf = ["model_name=tiny-gemma3", "dataset_type=hf", f"tokenizer_path={hf_smol}", *out]
    assert "no ['rejected']" in _error(capsys, hf + [f"hf_path={no_rej}"])
    assert "no column ['prompt']" in _error(capsys, hf + [f"hf_path={rows}", "train_data_columns=['prompt','chosen','rejected']"])
    assert "'train_data_columns'" in _error(capsys, hf + [f"hf_path={rows}", "train_data_columns=['chosen']"])
    assert "'dpo.algo'" in _error(capsys, TINY + out + ["dpo.algo=kto"])
    assert "'dpo.dpo_beta'" in _error(capsys, TINY + out + ["dpo_beta=0"])
    assert "'dpo.dpo_beta'" in _error(capsys, TINY + out + ["dpo.dpo_beta=-0.1"])
    assert "'dpo.max_response_length'" in _error(capsys, TINY + out + ["dpo.share_prompt=true"])
    assert "dpo.share_prompt=true: a shared row of 40 slots" in _error(capsys, TINY + out + ["dpo.share_prompt=true", "dpo.max_response_length=8"])   # sliding window 4
    for algo in ("orpo", "simpo"):
        assert "uses no reference model" in _error(capsys, TINY + out + [f"dpo.algo={algo}", f"dpo.reference_model_path={hf_smol}"])
    assert "gemma3-270m" in _error(capsys, ["model_name=gemma3-270m", f"load_parameters_path={hf_smol}", *out])
    for key in ("prompt_template=plain", "use_chat_template=false", "synthetic_task=copy"):   # SFT keys DPO cannot honour
        assert f"{key.split('=')[0]} is an SFT key" in _error(capsys, TINY + out + [key])
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("metrics.jsonl"))

def test_maxtext_command_smollm2_three_steps_lower_the_loss(tmp_path, hf_smol):
    """The issue's MaxText command with only the module path changed, its keys as given except max_target_length
    (128 rather than 1024: a 1024-slot full fine-tuning step of SmolLM2 takes minutes and several GB on a loaded
    2-core CPU), plus LoRA, a learning rate and save_model=false: DPO on one explicit triplet for 3 steps; the loss on
    that batch falls from log 2 (policy = reference at step 1)."""
    rows = tmp_path / "pairs.jsonl"
    rows.write_text(json.dumps({"input": "What is the capital of France?", "chosen": "The capital of France is Paris.",
                                "rejected": "The capital of France is Berlin."}) + "\n")
    res = _run([f"run_name=smol", f"base_output_directory={tmp_path}", "model_name=smollm2-135m",
                f"load_parameters_path={hf_smol}", "dataset_type=hf", f"hf_path={rows}", "train_split=train",
                "train_data_columns=['input', 'chosen', 'rejected']", "steps=3", "eval_interval=0",
                "per_device_batch_size=1", "max_target_length=128", "use_dpo=1", "dpo.algo=dpo",
                "use_lora=true", "lora_rank=8", "learning_rate=1e-3", "warmup_steps_fraction=0", "save_model=false", "enable_tqdm=false"], _env(tmp_path))
    m = _metrics(res["run_dir"])
    assert abs(m[0]["loss"] - 0.6931) < 1e-3, m[0]
    assert m[2]["loss"] < m[0]["loss"] - 1e-3 and m[2]["rewards/margins"] > 0, [x["loss"] for x in m]
