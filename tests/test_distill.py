"""`python -m maxpost.train_distill` end to end: a tiny student distilled from a teacher checkpoint on the addition
task lowers its held-out distillation loss and resumes exactly after SIGKILL; a teacher with another vocabulary stops
with one line naming the key, before any compute; on a 4-device mesh (fsdp × tensor) the teacher is split like the
base and the steps are one device's."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from conftest import cli_env as _env, kill_at, read_metrics as _metrics, run_json

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model_name=tiny-gemma3", "enable_tqdm=false"]

def _cmd(*args) -> list[str]:
    return _cmd_of("maxpost.train_distill", *args)

def _cmd_of(module, *args) -> list[str]:
    return [sys.executable, "-m", module, *map(str, args)]

def _run(args, env, timeout=600) -> dict: return run_json(_cmd(*args), env, timeout)

def _teacher(tmp: Path, **kw) -> Path:
    "A tiny-llama teacher (trained on the additions unless `vocab_size` is given: then random) as a maxpost checkpoint."
    from maxpost.checkpoint import save_checkpoint
    from maxpost.model import model_config, random_params, tiny_config
    if kw:
        mcfg = tiny_config("llama", **kw)
        return save_checkpoint(tmp / "teacher_v", random_params(mcfg, 0), mcfg)
    from maxpost.testing import sft_addition
    return save_checkpoint(tmp / "teacher", sft_addition(steps=30, model_name="tiny-llama"), model_config("tiny-llama"),
                           model_name="tiny-llama")

def test_distill_learns_and_resumes_exactly_after_sigkill(tmp_path):
    """Full fine-tuning, 20 steps, forward KL at α = 0.5: the held-out distill loss ends below half of the random
    student's; a run killed after its checkpoint at step 10 and restarted logs the same 20 losses."""
    env = _env(tmp_path)
    common = TINY + ["steps=20", "checkpoint_period=10", "eval_interval=20", "save_model=false",
                     f"teacher_load_parameters_path={_teacher(tmp_path)}", f"base_output_directory={tmp_path}"]
    ref = _run(common + ["run_name=ref"], env)
    assert ref["eval_distill_loss"] < 0.5 * ref["eval_distill_loss_initial"], ref
    assert ref["eval_sft_loss"] < ref["eval_sft_loss_initial"], ref
    ref_m = _metrics(ref["run_dir"])
    assert [m["step"] for m in ref_m] == list(range(1, 21))
    assert {"loss", "soft_loss", "hard_loss", "loss_tokens"} <= set(ref_m[0])
    run_dir = tmp_path / "killed"
    kill_at(_cmd(*common, "run_name=killed"), env, run_dir / "checkpoints" / "10", 300)
    res = _run(common + ["run_name=killed"], env)
    assert res["start_step"] >= 10 and res["steps"] == 20, res
    got = _metrics(run_dir)
    assert [m["step"] for m in got] == list(range(1, 21))
    for k in ("loss", "soft_loss", "hard_loss", "grad_norm"):
        assert [m[k] for m in got] == [m[k] for m in ref_m], k
    assert got[-1]["eval_distill_loss"] == ref_m[-1]["eval_distill_loss"]

def test_teacher_of_another_vocabulary_is_one_line(tmp_path):
    t = _teacher(tmp_path, vocab_size=64)
    r = subprocess.run(_cmd(*TINY, f"teacher_load_parameters_path={t}", f"base_output_directory={tmp_path}",
                            "run_name=v"), capture_output=True, text=True, env=_env(tmp_path), cwd=ROOT, timeout=300)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and err and err[-1].startswith("error: teacher_load_parameters_path="), r.stderr[-2000:]
    assert "vocabulary (64 tokens)" in err[-1], err[-1]
    assert not (tmp_path / "v" / "checkpoints").exists()

MESH_SCRIPT = """
import json, jax
from maxpost.data import SFTDataIterator
from maxpost.distill import DistillConfig, DistillTrainer, addition_examples
from maxpost.model import model_config, random_params
from maxpost.sharding import make_mesh
assert len(jax.devices()) == 4
mcfg, tcfg = model_config("tiny-gemma3"), model_config("tiny-llama")
base, teacher = random_params(mcfg, 0), random_params(tcfg, 1)
batches = [b for _, b in zip(range(3), SFTDataIterator(addition_examples("train"), 8, 32, seed=0))]
out = {}
for mode in ("full", "lora"):
    cfg = DistillConfig(model_name="tiny-gemma3", teacher_model_name="tiny-llama", learning_rate=3e-3, lora_rank=4,
                        use_lora=mode == "lora", distill_loss="jsd", distill_jsd_beta=0.5, distill_temperature=2.0)
    for name, mesh in (("one", make_mesh(1, 1, jax.devices()[:1])), ("four", make_mesh(2, 2))):
        tr = DistillTrainer(cfg, mcfg, base, tcfg, teacher, mesh); st = tr.init_state(); res = []
        for b in batches:
            st, m = tr.step(st, b); res.append([float(m["loss"]), float(m["grad_norm"])])
        out[mode, name] = res; out[mode, name, "teacher"] = str(tr.teacher["wq"].sharding.spec)
print(json.dumps({"|".join(k): v for k, v in out.items()}))
"""

def test_fsdp_tensor_mesh_matches_one_device(tmp_path):
    """3 steps on 4 virtual CPU devices (fsdp=2 × tensor=2) give one device's losses and gradient norms, full and
    LoRA; the teacher's weights are split over the mesh as the base's are."""
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    r = subprocess.run([sys.executable, "-c", MESH_SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env=dict(_env(tmp_path), XLA_FLAGS=flags))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for mode in ("full", "lora"):
        assert "fsdp" in out[f"{mode}|four|teacher"] and "tensor" in out[f"{mode}|four|teacher"], out
        for (l1, g1), (l4, g4) in zip(out[f"{mode}|one"], out[f"{mode}|four"]):
            assert abs(l1 - l4) <= 1e-5 * l1 and abs(g1 - g4) <= 1e-4 * g1, (mode, out)

def _main(module, args, capsys) -> tuple[int, str, str]:
    "(exit status, last stdout line, last stderr line) of `module.main(args)` run in this process."
    import importlib
    capsys.readouterr()
    try: importlib.import_module(module).main([str(a) for a in args]); rc = 0
    except SystemExit as e: rc = e.code
    out, err = (x.strip().splitlines() for x in capsys.readouterr())
    return rc, out[-1] if out else "", err[-1] if err else ""

def test_offline_logits_resume_train_and_bad_input(tmp_path, capsys):
    """Offline distillation: `distill_logits` SIGKILLed after its second shard and run again writes only the missing
    shards, equal to an uninterrupted run's; a student trained from them for 20 steps ends with its held-out (top-k)
    distill loss below half of the random student's, as the online run's does; another teacher, another tokenizer, a
    top-k above the vocabulary and another max_target_length each stop with one line naming the key, nothing written.
    After the killed writer, the commands run in this process (`main`), to save their start-up."""
    import numpy as np
    from maxpost.config import load_config
    from maxpost.distill import DistillConfig
    from maxpost.distill_logits import write_logits
    from maxpost.train_distill import default_config
    env, teacher = _env(tmp_path), _teacher(tmp_path)
    common = TINY + [f"teacher_load_parameters_path={teacher}", "distill_teacher_top_k=16"]
    logits, ref = tmp_path / "topk", tmp_path / "ref"
    write = common + ["teacher_logits_shard_size=4"]           # 19 train shards, 6 held-out
    kill_at(_cmd_of("maxpost.distill_logits", *write, f"teacher_logits_path={logits}"), env,
            logits / "train" / "shard-00001.npz", 300, cheap=False)   # its shards are compared with this process's
    before = {p.name: p.stat().st_mtime_ns for p in (logits / "train").glob("shard-*.npz")}
    assert 2 <= len(before) < 19, sorted(before)
    rc, out, err = _main("maxpost.distill_logits", write + [f"teacher_logits_path={logits}"], capsys)
    assert rc == 0, err
    res = json.loads(out)
    assert (res["shards"], res["skipped"], res["written"]) == (25, len(before), 25 - len(before)), res
    assert all((logits / "train" / n).stat().st_mtime_ns == t for n, t in before.items())     # not rewritten
    write_logits(load_config(DistillConfig, write + [f"teacher_logits_path={ref}"], base_yaml=default_config()))
    for split, n in (("train", 19), ("eval", 6)):
        names = sorted(p.name for p in (logits / split).iterdir())
        assert names == [f"shard-{i:05d}.npz" for i in range(n)], names          # no temporary file left
        for name in names:
            with np.load(logits / split / name) as a, np.load(ref / split / name) as b:
                for k in ("ids", "logprobs", "offsets"): assert np.array_equal(a[k], b[k]), (split, name, k)
    rc, out, err = _main("maxpost.train_distill", TINY + [f"teacher_logits_path={logits}", "steps=20", "eval_interval=20",
                         "save_model=false", f"base_output_directory={tmp_path}", "run_name=off"], capsys)
    assert rc == 0, err
    off = json.loads(out)
    assert off["eval_distill_loss"] < 0.5 * off["eval_distill_loss_initial"], off
    assert off["eval_sft_loss"] < off["eval_sft_loss_initial"], off
    assert [m["step"] for m in _metrics(off["run_dir"])] == list(range(1, 21))
    # bad input: each one line naming the key, before any compute, nothing written
    other = _teacher(tmp_path, vocab_size=64)
    write_logits(load_config(DistillConfig, TINY + [f"teacher_load_parameters_path={other}", "distill_teacher_top_k=4",
                                                    f"teacher_logits_path={tmp_path / 'v64'}"], base_yaml=default_config()))
    run = [f"base_output_directory={tmp_path}", "run_name=bad"]
    for module, args, start, says in [
            ("maxpost.train_distill", [f"teacher_logits_path={logits}", f"teacher_load_parameters_path={other}"],
             "error: teacher_load_parameters_path=", "another teacher"),
            ("maxpost.train_distill", [f"teacher_logits_path={tmp_path / 'v64'}"], "error: teacher_logits_path=",
             "another tokenizer"),
            ("maxpost.train_distill", [f"teacher_logits_path={logits}", "max_target_length=24"],
             "error: max_target_length=24", "max_target_length=32"),
            ("maxpost.distill_logits", [common[2], "distill_teacher_top_k=129", f"teacher_logits_path={tmp_path / 'big'}"],
             "error: distill_teacher_top_k=129", "exceeds the vocabulary (128 tokens)")]:
        rc, _, line = _main(module, TINY + args + run, capsys)
        assert rc == 2 and line.startswith(start) and says in line, (args, rc, line)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "big").exists()

def test_on_policy_resumes_exactly_after_sigkill(tmp_path):
    """On-policy distillation in TRL's spelling (`lmbda=0.5`, `max_new_tokens=4`; rollout_seed 0 makes steps 3 and 6
    the student's samples, the others the dataset's), LoRA student, random tiny-llama teacher, 6 steps: a run killed
    after its checkpoint at step 3 and restarted logs the same 6 losses and the same sampled batches (prompt and
    token counts) as an uninterrupted run; on the student's steps the loss is on the sampled tokens alone."""
    env = _env(tmp_path)
    common = TINY + ["steps=6", "checkpoint_period=3", "eval_interval=6", "save_model=false", "use_lora=true",
                     "lora_rank=4", "teacher_model_name=tiny-llama", "lmbda=0.5", "max_new_tokens=4",
                     f"base_output_directory={tmp_path}"]
    ref = _run(common + ["run_name=ref"], env)
    ref_m = _metrics(ref["run_dir"])
    assert [m["on_policy"] for m in ref_m] == [0, 0, 1, 0, 0, 1], ref_m
    for m in ref_m:
        if m["on_policy"]: assert m["loss_tokens"] == m["sampled_tokens"] > 0 and m["hard_loss"] == 0, m
        else: assert m["sampled_prompts"] == 0 and m["hard_loss"] > 0, m
    run_dir = tmp_path / "killed"
    kill_at(_cmd(*common, "run_name=killed"), env, run_dir / "checkpoints" / "3", 300)
    res = _run(common + ["run_name=killed"], env)
    assert 3 <= res["start_step"] < 6 and res["steps"] == 6, res
    got = _metrics(run_dir)
    assert [m["step"] for m in got] == list(range(1, 7))
    for k in ("loss", "soft_loss", "hard_loss", "grad_norm", "on_policy", "sampled_prompts", "sampled_tokens"):
        assert [m[k] for m in got] == [m[k] for m in ref_m], k
    assert got[-1]["eval_distill_loss"] == ref_m[-1]["eval_distill_loss"]
