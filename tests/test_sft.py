"""`python -m maxpost.train_sft` end to end on a tiny random model: learning a synthetic task, exact resume after
SIGKILL, and the same losses on an 8-device (fsdp=4, tensor=2) CPU mesh as on one device. Three LoRA steps of Gemma 3
270M on a GSM8K batch lowering its loss are checked once, by the slow cell of nbs/05_sft.ipynb."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest
from conftest import cli_env as _env, kill_at, read_metrics as _metrics, run_json, xla_cache

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model_name=tiny-gemma3", "enable_tqdm=false", "save_model=false"]

def _cmd(*args) -> list[str]:
    return [sys.executable, "-m", "maxpost.train_sft", *args]

def _run(args, env, timeout=300) -> dict: return run_json(_cmd(*args), env, timeout)

def test_learns_and_resumes_exactly_after_sigkill(tmp_path):
    """A tiny Gemma learns the copy task (eval loss < 2.0 after 200 steps), and a run killed with SIGKILL after its
    first checkpoint, then restarted with the same command, logs the same 200 losses as an uninterrupted run.

    Threshold: a model that ignores the prompt can do no better than ln(124) ≈ 4.82 nats on each of the n copied ids
    (uniform over 124 ids) and 0 on <eos>, ≈ 4.4 on average for n uniform in [4, 12]; measured after 200 steps:
    eval loss ≈ 1.3 (learning rate 2e-2, batch 8 × 64; the tiny-gemma3 section of sft.yml). 2.0 leaves margin for float differences, not for a model
    that does not copy."""
    env = _env(tmp_path)
    common = TINY + ["steps=200", "checkpoint_period=25", "eval_interval=200", f"base_output_directory={tmp_path}"]
    ref = _run(common + ["run_name=ref"], env)
    assert ref["steps"] == 200 and ref["eval_loss"] < 2.0, ref
    ref_m = _metrics(ref["run_dir"])
    assert [m["step"] for m in ref_m] == list(range(1, 201))
    run_dir = tmp_path / "killed"
    for f in ("config.yml", "metrics.jsonl", "tensorboard"): assert (Path(ref["run_dir"]) / f).exists(), f

    kill_at(_cmd(*common, "run_name=killed"), env, run_dir / "checkpoints" / "25", 240)
    done = sorted(int(d.name) for d in (run_dir / "checkpoints").iterdir() if d.name.isdigit())
    assert 200 not in done, "the run finished before it was killed"
    killed_at = _metrics(run_dir)[-1]["step"] if (run_dir / "metrics.jsonl").exists() else 0

    res = _run(common + ["run_name=killed"], env)
    assert res["start_step"] >= 25 and res["steps"] == 200, res
    got = _metrics(run_dir)
    assert [m["step"] for m in got] == list(range(1, 201))          # no step twice, none missing
    assert [m["loss"] for m in got] == [m["loss"] for m in ref_m], "losses differ from the uninterrupted run"
    assert [m["grad_norm"] for m in got] == [m["grad_norm"] for m in ref_m]
    assert got[-1]["eval_loss"] == ref_m[-1]["eval_loss"]
    print(f"killed after step {killed_at}, resumed from {res['start_step']}; 200 losses identical")

MESH_SCRIPT = """
import json, numpy as np, jax
from maxpost.data import SFTDataIterator
from maxpost.sft import SFTConfig, SFTTrainer, model_config, random_params, synthetic_examples
from maxpost.sharding import make_mesh
assert len(jax.devices()) == 8
mcfg = model_config("tiny-gemma3"); base = random_params(mcfg, 0)
batches = [b for _, b in zip(range(4), SFTDataIterator(synthetic_examples(256, mcfg.vocab_size, "copy"), 8, 64, seed=0))]
out = {}
for mode in ("full", "lora"):
    cfg = SFTConfig(model_name="tiny-gemma3", max_target_length=64, per_device_batch_size=1, learning_rate=3e-3,
                    loss_chunk_size=128, use_lora=mode == "lora", lora_rank=4)
    for name, mesh in (("one", make_mesh(1, 1, jax.devices()[:1])), ("eight", make_mesh(4, 2))):
        tr = SFTTrainer(cfg, mcfg, base, mesh); st = tr.init_state(); res = []
        for b in batches:
            st, m = tr.step(st, b); res.append([float(m["loss"]), float(m["grad_norm"])])
        w = st["params"]["wq"]["a"] if cfg.use_lora else st["params"]["wq"]
        out[mode, name] = res; out[mode, name, "spec"] = str(w.sharding.spec)
print(json.dumps({"|".join(k): v for k, v in out.items()}))
"""

def _on_devices(script: str, n: int, tmp_path) -> dict:
    "The JSON that `script` prints last, run in a subprocess with n virtual CPU devices."
    flags = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                       timeout=600, env=_env(tmp_path, XLA_FLAGS=flags))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(out)
    return out

def test_fsdp_tensor_mesh_matches_one_device(tmp_path):
    """4 steps on 8 virtual CPU devices (fsdp=4 × tensor=2, one row per device) give the losses and gradient norms of
    one device with the same 8-row batches, for a full fine-tune and for LoRA."""
    out = _on_devices(MESH_SCRIPT, 8, tmp_path)
    for mode in ("full", "lora"):
        assert "fsdp" in out[f"{mode}|eight|spec"], out             # the weights really are split
        for (l1, g1), (l8, g8) in zip(out[f"{mode}|one"], out[f"{mode}|eight"]):
            assert abs(l1 - l8) <= 1e-5 * l1 and abs(g1 - g8) <= 1e-4 * g1, (mode, out)

QLORA_SCRIPT = """
import json, jax
from maxpost.aot import per_chip_bytes
from maxpost.data import SFTDataIterator
from maxpost.sft import SFTConfig, SFTTrainer, model_config, random_params, synthetic_examples
from maxpost.sharding import make_mesh
assert len(jax.devices()) == 4
mcfg = model_config("tiny-gemma3"); base = random_params(mcfg, 0)
batches = [b for _, b in zip(range(3), SFTDataIterator(synthetic_examples(128, mcfg.vocab_size, "copy"), 4, 64, seed=0))]
out = {}
for qt, dq in (("int8", False), ("nf4", True)):
    cfg = SFTConfig(model_name="tiny-gemma3", max_target_length=64, per_device_batch_size=1, learning_rate=3e-3,
                    loss_chunk_size=128, use_lora=True, lora_rank=4, lora_weight_qtype=qt, lora_double_quant=dq)
    for name, mesh in (("one", make_mesh(1, 1, jax.devices()[:1])), ("four", make_mesh(2, 2))):
        tr = SFTTrainer(cfg, mcfg, base, mesh); st = tr.init_state(); res = []
        for b in batches:
            st, m = tr.step(st, b); res.append([float(m["loss"]), float(m["grad_norm"])])
        q = tr.frozen["w_up"]
        out[qt, name] = res
        out[qt, name, "spec"] = [str(q.codes.sharding.spec), str(q.scale.sharding.spec), str(tr.frozen_sh["w_up"].codes.spec)]
        out[qt, name, "bytes"] = per_chip_bytes(tr.frozen)
print(json.dumps({"|".join(map(str, k)): v for k, v in out.items()}))
"""

def test_qlora_mesh_matches_one_device(tmp_path):
    """QLoRA (int8; nf4 double-quantized) on 4 virtual CPU devices (fsdp=2 × tensor=2): the quantized base is split
    over the devices (fewer bytes per chip, the codes sharded as `maxpost.quant.quant_sharding` says) and 3 steps give
    the losses and gradient norms of one device."""
    out = _on_devices(QLORA_SCRIPT, 4, tmp_path)
    for qt in ("int8", "nf4"):
        codes, scale, planned = out[f"{qt}|four|spec"]
        assert codes == planned and "fsdp" in codes, out
        assert out[f"{qt}|four|bytes"] < 0.6 * out[f"{qt}|one|bytes"], out
        for (l1, g1), (l4, g4) in zip(out[f"{qt}|one"], out[f"{qt}|four"]):
            assert abs(l1 - l4) <= 1e-5 * l1 and abs(g1 - g4) <= 1e-4 * g1, (qt, out)

HEAD_SHARD_SCRIPT = """
import json, re
from maxpost.data import SFTDataIterator
from maxpost.model import tiny_config
from maxpost.sft import SFTConfig, SFTTrainer, random_params, synthetic_examples
mcfg = tiny_config("gemma3", vocab_size=32768); base = random_params(mcfg, 0)
b = next(SFTDataIterator(synthetic_examples(64, 128, "copy"), 8, 64, seed=0))
out = {}
for tp in (1, 2):
    cfg = SFTConfig(model_name="tiny-gemma3", max_target_length=64, per_device_batch_size=4, use_lora=True,
                    lora_rank=4, ici_tensor_parallelism=tp, ici_fsdp_parallelism=-1)
    tr = SFTTrainer(cfg, mcfg, base); st = tr.init_state()
    txt = tr._step.lower(st, tr.frozen, tr.put_batch(b)).compile().as_text()
    out[tp] = dict(tiles=tr.tiles, gathered_head=len(re.findall(r"f32\\[32768,32\\][^=]*= .*all-gather|all-gather\\(", txt)),
                   logit_shapes=sorted(set(re.findall(r"f32\\[(\\d+),(8192|16384|32768)\\]", txt))))
print(json.dumps(out))
"""

def test_vocab_sharded_head_is_not_gathered(tmp_path):
    """On a mesh whose tensor axis shards the vocabulary (2 virtual CPU devices), the loss's logits tile holds each
    device's half of the vocabulary and the head is never all-gathered (a loop over vocabulary blocks would gather
    it); with the vocabulary whole on each device (fsdp = 2) the loss runs in [c, 8192] tiles. Compiled only, tiny Gemma with a 32 768-token vocabulary."""
    out = _on_devices(HEAD_SHARD_SCRIPT, 2, tmp_path)
    assert out["1"]["tiles"] == [1024, 8192] and any(v == "8192" for _, v in out["1"]["logit_shapes"]), out
    assert out["2"]["tiles"] == [256, 0] and out["2"]["gathered_head"] == 0, out
    assert ["256", "16384"] in out["2"]["logit_shapes"] and not any(v != "16384" for _, v in out["2"]["logit_shapes"]), out

def test_bad_key_names_the_closest(tmp_path):
    r = subprocess.run(_cmd("model_name=tiny-gemma3", "lora_rnak=4", f"base_output_directory={tmp_path}"),
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "did you mean 'lora_rank'" in r.stderr, r.stderr

def _one_line_error(r, *needles):
    "Exit 2 with exactly one `error:` line, no traceback, naming each of `needles`."
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stderr[-3000:]}"
    errs = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    for n in needles: assert n in errs[0], errs[0]
    return errs[0]

def test_bad_input_is_one_line(tmp_path, hf_smol):
    """The four bad inputs that used to escape as tracebacks (issue 11) end with one `error:` line and exit 2: a YAML
    syntax error in the first-argument file, hf_path naming a missing file, a .jsonl that is not JSON, and
    learning_rate=.nan (accepted before: the run trained to a NaN loss and saved the model)."""
    from conftest import run_module
    out = [f"base_output_directory={tmp_path}", "enable_tqdm=false"]
    bad = tmp_path / "bad.yml"; bad.write_text("steps: [1, 2\nlearning_rate: 3\n")
    _one_line_error(run_module("maxpost.train_sft", bad, *TINY, *out, check=False), str(bad), "line 2")
    hf = ["model_name=tiny-gemma3", "dataset_type=hf", f"tokenizer_path={hf_smol}"]
    missing = tmp_path / "nowhere.jsonl"
    _one_line_error(run_module("maxpost.train_sft", *hf, f"hf_path={missing}", *out, check=False), "hf_path", str(missing))
    notjson = tmp_path / "rows.jsonl"; notjson.write_text('{"messages": [}\nthis is not json\n')
    _one_line_error(run_module("maxpost.train_sft", *hf, f"hf_path={notjson}", *out, check=False), "hf_path", str(notjson))
    _one_line_error(run_module("maxpost.train_sft", *TINY, "learning_rate=.nan", *out, check=False),
                    "bad value for 'learning_rate'")
    assert not any(tmp_path.glob("**/checkpoints")), "a run started"

def test_user_yaml_beats_model_section_and_text_stays_text(tmp_path):
    """Layer order (issue 11): the user's YAML beats the base YAML's model section (tiny-gemma3 sets
    max_target_length 64; the user's 96 wins), the command line beats both; run_name=2024-01-01 stays a string."""
    from maxpost.config import load_config
    from maxpost.sft import SFTConfig
    from maxpost.train_sft import default_config
    mine = tmp_path / "mine.yml"; mine.write_text("model_name: tiny-gemma3\nmax_target_length: 96\n")
    c = load_config(SFTConfig, [str(mine), "run_name=2024-01-01"], base_yaml=default_config())
    assert (c.max_target_length, c.dataset_type, c.run_name) == (96, "synthetic", "2024-01-01"), c
    c = load_config(SFTConfig, [str(mine), "max_target_length=48", "run_name=yes"], base_yaml=default_config())
    assert (c.max_target_length, c.run_name) == (48, "yes")

def test_nonfinite_loss_stops_and_saves_nothing_of_that_step(tmp_path):
    """Issue 11: a learning rate of 1e30 makes the loss non-finite after the first update. The run stops with one
    line naming the step, exit 2; no checkpoint of that step or later exists, and no model is exported (before the
    fix the run went on to the end, exit 0, and saved the model it produced)."""
    import re
    from conftest import run_module
    r = run_module("maxpost.train_sft", *TINY[:2], "save_model=true", "learning_rate=1e30", "warmup_steps_fraction=0",
                   "steps=6", "checkpoint_period=1", "eval_interval=0", f"base_output_directory={tmp_path}",
                   "run_name=nan", check=False, env={"JAX_COMPILATION_CACHE_DIR": xla_cache(tmp_path)})
    line = _one_line_error(r, "stopped without saving")
    bad = int(re.search(r"step (\d+):", line).group(1))
    run_dir = tmp_path / "nan"
    saved = sorted(int(d.name) for d in (run_dir / "checkpoints").iterdir() if d.name.isdigit())
    assert all(s < bad for s in saved), (saved, line)
    assert not (run_dir / "model").exists()

def test_cli_qlora_stores_and_reads_the_quantized_base(tmp_path):
    """`python -m maxpost.train_sft … load_parameters_path=CKPT use_lora=true lora_weight_qtype=nf4` twice: the first
    run quantizes the base and stores it (`maxpost.quant_store`, quantized_base_path=auto: under
    base_output_directory/quantized_base), the second reads that store and does not quantize, and both log the same
    first-step loss and gradient norm, bit for bit. A third run that names the store but asks for int8 exits 2 with
    one line naming lora_weight_qtype, and leaves the store as it was."""
    from conftest import run_module
    from maxpost.checkpoint import save_checkpoint
    from maxpost.model import model_config, random_params
    ckpt = save_checkpoint(tmp_path / "ckpt", random_params(model_config("tiny-gemma3"), 0), model_config("tiny-gemma3"),
                           model_name="tiny-gemma3")
    env = _env(tmp_path)
    common = TINY + [f"load_parameters_path={ckpt}", "use_lora=true", "lora_rank=4", "lora_weight_qtype=nf4",
                     "lora_double_quant=true", "steps=1", "eval_interval=0", f"base_output_directory={tmp_path}"]
    runs = [run_module("maxpost.train_sft", *common, f"run_name=r{i}", env=env) for i in (1, 2)]
    assert "quantizing the base of" in runs[0].stderr and "nothing stored yet" in runs[0].stderr, runs[0].stderr[-2000:]
    assert "quantized base read from" in runs[1].stderr and "quantizing" not in runs[1].stderr, runs[1].stderr[-2000:]
    first = [_metrics(tmp_path / f"r{i}")[0] for i in (1, 2)]
    assert (first[0]["loss"], first[0]["grad_norm"]) == (first[1]["loss"], first[1]["grad_norm"]), first
    (store,) = (tmp_path / "quantized_base").iterdir()
    assert store.name.endswith("-nf4-b64-dq-float32") and (store / "maxpost.json").exists(), store
    before = sorted((p.relative_to(store), p.stat().st_mtime_ns) for p in store.rglob("*"))
    bad = [a for a in common if not a.startswith(("lora_weight_qtype", "lora_double_quant"))]
    _one_line_error(run_module("maxpost.train_sft", *bad, "lora_weight_qtype=int8", f"quantized_base_path={store}",
                               "run_name=r3", env=env, check=False), "lora_weight_qtype", str(store))
    assert sorted((p.relative_to(store), p.stat().st_mtime_ns) for p in store.rglob("*")) == before
    print(first[0]["loss"], runs[1].stderr.strip().splitlines()[0])
