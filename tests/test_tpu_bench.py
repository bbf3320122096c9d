"""`python benchmarks/tpu.py`, the one benchmark command for an accelerator, as a CPU dry run: its records and its
markdown rows, the budget rule (a part that cannot start is recorded as skipped and never runs), and the rule that
writes RESULTS_tpu.md (one block per device kind and date; another device's or date's block is never touched)."""
import argparse, json, shutil, subprocess, sys
from pathlib import Path

from conftest import cli_env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_dry_run_records_and_rows(tmp_path):
    "SFT LoRA and the sampler on tiny-gemma3 (no Tunix): the start, weights, measurement and end records, the md rows."
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "benchmarks/tpu.py", "--model", "tiny-gemma3", "--llama", "", "--B", "2",
                        "--T", "16", "--steps", "2", "--sampler", "4:4:4", "--items", "sft_lora,sampler", "--no-tunix",
                        "--out", str(out), "--tmp", str(tmp_path)], cwd=ROOT, env=cli_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    recs = [json.loads(l) for l in (out / "tpu.jsonl").read_text().splitlines()]
    by = {x["what"]: x for x in recs}
    start = by["device"]
    assert start["event"] == "start" and start["device_kind"] == "cpu" and start["jax"] and start["bf16_matmul_tflops"] > 0
    assert all(x["run"] == start["run"] for x in recs) and start["run"].startswith("cpu 20")
    sft = by["sft lora tiny-gemma3 B=2 T=16 maxpost"]
    assert "error" not in sft, sft
    assert (sft["framework"], sft["mode"], sft["B"], sft["T"], sft["compiles"]) == ("maxpost", "lora", 2, 16, 1)
    assert len(sft["losses"]) == 3 and len(sft["first_steps_s"]) == 1 and sft["tokens_per_s"] > 0
    assert abs(sft["loss_step1"] - sft["losses"][0]) < 1e-5 and 3 < sft["loss_step1"] < 7     # ≈ ln 128 = 4.85
    smp = by["sampler 4 rows"]
    assert "error" not in smp, smp
    assert smp["tokens"] == 16 and smp["decode_steps"] >= 4 and smp["hbm_bw_source"].startswith("measured")
    assert 0 < smp["fraction_of_bound"] and smp["hbm_bound_tokens_per_s"] > 0
    assert recs[-1]["event"] == "end" and not any(x.get("event") == "skipped" for x in recs)
    md = (out / "tpu_results.md").read_text()
    assert md.startswith("<!-- tpu.py: " + start["run"] + " [sft_lora,sampler] -->") and md.count("\n| ") == 3  # header + 2 rows
    assert "| sft lora tiny-gemma3 B=2 T=16 maxpost | tiny-gemma3, lora, B = 2 × 16" in md and "of the HBM bound" in md


def test_budget_skips_a_part_before_it_starts(tmp_path):
    "A part whose time estimate exceeds what is left (on a TPU) is recorded as skipped: budget, and is not called."
    import tpu
    a = argparse.Namespace(budget=100.0, out=str(tmp_path), model="m", steps=1, no_tunix=True)
    b = tpu.Bench(a); b.run, b.kind, b.on_tpu = "TPU v5 lite 2026-12-06", "TPU v5 lite", True
    called = []
    assert b.attempt("big part", 10_000, lambda: called.append(1) or {}) is None and not called
    got = b.attempt("small part", 1, lambda: called.append(1) or {"x": 1})
    assert called == [1] and got["x"] == 1
    assert b.attempt("broken part", 1, lambda: 1 / 0)["error"].startswith("ZeroDivisionError")
    recs = [json.loads(l) for l in (tmp_path / "tpu.jsonl").read_text().splitlines()]
    assert [(x["what"], x.get("event")) for x in recs] == [("big part", "skipped"), ("small part", None),
                                                            ("broken part", None)]
    assert "skipped: budget (big part" in (tmp_path / "tpu.log").read_text()


def _run(kind: str, date: str, tps: float) -> list[dict]:
    "The records of a small made-up run on device `kind`."
    run = f"{kind} {date}"
    common = {"run": run, "device_kind": kind}
    return [common | {"what": "device", "event": "start", "jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "libtpu 0.0.42",
                      "platform_version": "x", "bf16_matmul_tflops": 184.0, "hbm_bw_measured_gbps": 700.0,
                      "budget_s": 540.0, "argv": []},
            common | {"what": "sft lora B=2 T=1024 maxpost", "framework": "maxpost", "model": "gemma3-1b", "mode": "lora",
                      "B": 2, "T": 1024, "remat": "none", "tokens_per_s": tps, "step_s_median": 2048 / tps,
                      "mfu_6N": 0.7, "loss_step1": 12.5, "first_steps_s": [20.0]},
            common | {"what": "dpo lora 2 pairs tunix", "event": "skipped", "why": "budget", "left_s": 12.0}]


def test_write_results_one_block_per_device_and_date(tmp_path):
    """Into a copy of RESULTS_tpu.md holding blocks of another device and of another date: a new run is appended, the
    same device and date again replaces only its own block, and every other byte stays. The dates are in 2000, so
    that no real run's block in the file shares their key."""
    import tpu_results as tr
    md = tmp_path / "RESULTS_tpu.md"
    shutil.copy(ROOT / "benchmarks" / "RESULTS_tpu.md", md)
    tr.write_results(md, _run("TPU v6 lite", "2000-01-01", 40_000.0))
    tr.write_results(md, _run("TPU v5 lite", "2000-01-02", 20_000.0))
    before = md.read_text()
    tr.write_results(md, _run("TPU v5 lite", "2000-01-03", 23_000.0))
    after = md.read_text()
    assert after.startswith(before) and after.count("<!-- tpu.py: TPU v5 lite 2000-01-03 -->") == 1
    assert "| 23,000 tokens/s" in after and "skipped: budget (12.0 s left)" in after
    tr.write_results(md, _run("TPU v5 lite", "2000-01-03", 24_000.0))        # the same key: replaced in place
    again = md.read_text()
    assert again.startswith(before) and again.count("<!-- tpu.py: TPU v5 lite 2000-01-03 -->") == 1
    assert "| 24,000 tokens/s" in again and "| 23,000 tokens/s" not in again
    for other in ("| 40,000 tokens/s", "| 20,000 tokens/s"):                  # the other blocks are kept
        assert again.count(other) == 1
    assert again.startswith((ROOT / "benchmarks" / "RESULTS_tpu.md").read_text())
    # a run of other items on the same day keeps the day's first block and adds its own
    other = _run("TPU v5 lite", "2000-01-03", 25_000.0)
    other[0]["argv"] = ["--items", "sampler,grpo"]
    tr.write_results(md, other)
    both = md.read_text()
    assert both.startswith(again) and "<!-- tpu.py: TPU v5 lite 2000-01-03 [sampler,grpo] -->" in both
    assert "| 24,000 tokens/s" in both and "| 25,000 tokens/s" in both


def test_bad_input_one_line_error_before_any_work(tmp_path):
    "An unknown item, a malformed shape or an unknown model stops with one line naming the option, and writes nothing."
    for args, want in ((["--items", "sft_lora,nope"], "--items: unknown item 'nope'"),
                       (["--grpo", "8:8:256"], "--grpo: '8:8:256' is not"),
                       (["--model", "gemma3-2b"], "--model: unknown model_name 'gemma3-2b'")):
        r = subprocess.run([sys.executable, "benchmarks/tpu.py", *args, "--out", str(tmp_path / "o")], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        errs = [l for l in r.stderr.splitlines() if "error" in l.lower()]
        assert r.returncode == 2 and len(errs) == 1 and "Traceback" not in r.stderr, r.stderr
        assert errs[0].startswith("tpu.py: error: ") and want in errs[0], r.stderr
        assert not (tmp_path / "o").exists()
