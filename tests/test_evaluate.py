"End-to-end runs of `python -m maxpost.evaluate` on the real SmolLM2-135M (HF folder, loaded in memory)."
import json, subprocess, sys

import pytest

from maxpost.convert.from_gguf import embedded_hf
from maxpost.metrics import read_jsonl, score_completions_file


def run_cli(*args, timeout=900):
    p = subprocess.run([sys.executable, "-m", "maxpost.evaluate", *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def smol():
    return str(embedded_hf("smollm2-135m"))


def test_cli_end_to_end(smol, tmp_path):
    rc, out, err = run_cli(f"load_parameters_path={smol}", "model_name=smollm2-135m", "dataset=gsm8k",
                           "eval_mode=pass_at_1", "num_eval_examples=8", "max_tokens=12", "template=plain",
                           "batch_size=8", f"base_output_directory={tmp_path}", "run_name=e2e")
    assert rc == 0, err[-3000:]
    run = tmp_path / "e2e"
    assert {p.name for p in run.iterdir()} >= {"completions.jsonl", "summary.json", "config.yml"}
    assert "on 8 of 1319 problems" in out, out          # the cap is printed beside the score
    assert out.splitlines()[-2].startswith("accuracy ")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["n_problems"] == 8 and summary["eval"]["n_available"] == 1319
    records = read_jsonl(run / "completions.jsonl")
    assert [r["index"] for r in records] == list(range(8))
    for r in records:
        assert len(r["completions"]) == 1 and 1 <= r["lengths"][0] <= 12
        assert r["finish_reasons"][0] in ("stop", "length") and r["prompt"].startswith("<|im_start|>")
    # the saved completions re-score (without the model) to the summary the run printed
    again = score_completions_file(run / "completions.jsonl", template="plain")
    for key in ("accuracy", "format_accuracy", "truncation_rate"):
        assert again[key] == summary[key], key


def test_cli_errors_before_compute(smol, tmp_path):
    rc, out, err = run_cli(f"load_parameters_path={smol}", "dataset=math500", f"base_output_directory={tmp_path}")
    assert rc == 2 and "bad value for 'dataset'" in err and "'math500'" in err, err
    rc, out, err = run_cli(f"load_parameters_path={smol}", "few_shot=4", "max_prefill_length=256",
                           f"base_output_directory={tmp_path}")      # prompts too long: refused before the model loads
    assert rc == 2 and "max_prefill_length=256 is too short" in err, err
    try:
        import vllm  # noqa: F401
    except Exception:
        rc, out, err = run_cli(f"load_parameters_path={smol}", "rollout_engine=vllm", f"base_output_directory={tmp_path}")
        assert rc == 2 and "pip install -e .[vllm]" in err, err
    assert not any(tmp_path.iterdir())                   # nothing written
