"""The foundation issue's measured claims, on the two real embedded models:
parity against transformers (fp32 and bf16), the bit-exact HF -> maxpost -> HF round trip, KV-cache decoding against
the full forward pass, the converter commands end to end, and clear errors on bad input."""
import json, shutil
from pathlib import Path
import numpy as np
import pytest

from conftest import run_module
from maxpost.checkpoint import (CheckpointError, HFCheckpoint, load_checkpoint, load_model, save_checkpoint,
                                write_safetensors)
from maxpost.convert.to_maxpost import to_maxpost
from maxpost.convert.to_huggingface import to_huggingface
from maxpost.convert.check_logits import check_logits
from maxpost.convert.from_gguf import from_gguf

MODELS = {"smollm2-135m": "hf_smol", "gemma3-270m": "hf_gemma"}

@pytest.fixture(scope="module", params=list(MODELS))
def converted(request, tmp_path_factory):
    "(model_name, hf folder, maxpost checkpoint, hf folder written back) for each real model."
    name = request.param
    hf = request.getfixturevalue(MODELS[name])
    work = tmp_path_factory.mktemp(name)
    ck = to_maxpost(hf, work / "maxpost", name)
    back = to_huggingface(ck, work / "back", name)
    return name, hf, ck, back

def test_round_trip_bit_exact(converted):
    name, hf, ck, back = converted
    a, b = HFCheckpoint(hf), HFCheckpoint(back)
    assert sorted(a.keys()) == sorted(b.keys())
    for k in a.keys():
        x, y = a.read(k), b.read(k)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x.view(np.uint8), y.view(np.uint8)), k
    cfg_a, cfg_b = (json.loads((p / "config.json").read_text()) for p in (hf, back))
    assert {k: cfg_a[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")} == \
           {k: cfg_b[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")}

def test_parity_fp32(converted):
    "transformers reads the folder maxpost wrote; maxpost reads its own checkpoint; logits agree."
    name, hf, ck, back = converted
    if name == "smollm2-135m":
        pytest.skip("asserted by nbs/90_demo.ipynb's cut-down run: the same conversions and check_logits call, same bound")
    r = check_logits(back, ck, "float32")
    print(name, r)
    assert max(r["lengths"]) > 512 and len(set(r["lengths"])) == 4
    # float32 summation-order noise between torch's and XLA's kernels, largest at the 600-token prompt: 8.2e-4 on the
    # EPYC, 1.08e-3 for Gemma 3 270M on the AMX Xeon (the same at 50143ad); a layout or mask bug moves logits by > 0.1
    assert r["max_abs_diff"] <= 2e-3, r
    assert r["top1"] == 1.0, r

def test_parity_bf16(converted):
    """bfloat16 on both sides: KL ≤ 1e-3. On a CPU without BF16 (AVX2 only) every bfloat16 op is emulated on both
    sides, so there the longest prompt is 200 tokens instead of 600; crossing Gemma's 512-token window is checked by
    test_parity_fp32 and by the KV-cache test, in float32."""
    from maxpost.sft import cpu_has_bf16
    name, hf, ck, back = converted
    if name == "smollm2-135m":      # the GGUF's HF folder against its weights in bfloat16, KL ≤ 1e-3 and top-1 ≥ 0.9
        pytest.skip("computed by test_cli_end_to_end's bfloat16 check_logits (the same weights, rounded at the store)")
    r = check_logits(hf, ck, "bfloat16", long_len=600 if cpu_has_bf16() else 200)
    print(name, r)
    assert r["kl"] <= 1e-3, r

def test_kv_cache_decode_matches_forward(converted):
    "Prefill a long prompt, then decode token by token with the cache; logits equal the full forward pass."
    import jax, jax.numpy as jnp
    from maxpost.model import init_cache, positions_from_mask, forward_fn
    name, hf, ck, back = converted
    model = load_model(ck)
    rng = np.random.default_rng(0)
    T, P = 524, 508                     # decode steps cross Gemma's 512-token sliding window
    toks = rng.integers(10, 1000, (2, T))
    mask = np.ones((2, T), np.int32); mask[1, :5] = 0          # second row left-padded
    pos = positions_from_mask(jnp.asarray(mask))
    step = forward_fn(model)
    full, _ = step(jnp.asarray(toks), pos, jnp.asarray(mask))
    cache = init_cache(model.cfg, 2, T)
    out, cache = step(jnp.asarray(toks[:, :P]), pos[:, :P], jnp.asarray(mask[:, :P]), cache)
    outs = [out]
    for t in range(P, T):
        o, cache = step(jnp.asarray(toks[:, t:t+1]), pos[:, t:t+1], jnp.asarray(mask[:, t:t+1]), cache)
        outs.append(o)
    inc = np.asarray(jnp.concatenate(outs, axis=1))
    err = np.abs(inc - np.asarray(full))[mask.astype(bool)].max()
    print(name, "max |cache - full|", err, "max |logit|", float(np.abs(np.asarray(full)).max()))
    # SmolLM2 meets the issue's 1e-4 (measured 6.9e-5). Gemma 3's logits reach ~120 and its fp32 rounding is larger
    # (measured 3.3e-4, i.e. 2.8e-6 of the largest logit): held to 5e-4 and reported as missing the 1e-4 goal.
    assert err <= (1e-4 if name == "smollm2-135m" else 5e-4), err

def test_cli_end_to_end(hf_smol, tmp_path):
    "from_gguf -> to_maxpost -> to_huggingface -> check_logits as commands, MaxText grammar."
    from maxpost.convert.from_gguf import fetch_gguf
    r = run_module("maxpost.convert.from_gguf", f"gguf_path={fetch_gguf('smollm2-135m')}", f"base_output_directory={tmp_path}",
                   "run_name=hf")
    assert "wrote HF folder" in r.stdout
    r = run_module("maxpost.convert.to_maxpost", "model_name=smollm2-135m", f"hf_model_path={tmp_path / 'hf'}",
                   f"base_output_directory={tmp_path}", "run_name=mp", "weight_dtype=bfloat16")
    assert f"load_parameters_path={tmp_path / 'mp'}" in r.stdout
    params, cfg, meta = load_checkpoint(tmp_path / "mp")
    assert str(params["wq"].dtype) == "bfloat16" and meta["model_name"] == "smollm2-135m"
    run_module("maxpost.convert.to_huggingface", "model_name=smollm2-135m", f"load_parameters_path={tmp_path / 'mp'}",
               f"base_output_directory={tmp_path}", "run_name=back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    r = run_module("maxpost.convert.check_logits", f"hf_model_path={tmp_path / 'hf'}", "dtype=bfloat16",
                   f"load_parameters_path={tmp_path / 'mp'}", "model_name=smollm2-135m", "min_top1=0.9")
    assert "PASS" in r.stdout
    # past the limits it fails with status 1 (short prompts: any real difference is far above 1e-12; the long prompt's
    # parity is test_parity_fp32's and the bf16 run's above)
    r = run_module("maxpost.convert.check_logits", f"hf_model_path={tmp_path / 'hf'}", "max_abs_diff=1e-12", "long_len=64",
                   check=False)
    assert r.returncode == 1 and "FAIL" in r.stdout
    # a misspelled key names the right one, before any compute
    r = run_module("maxpost.convert.to_maxpost", "model_nme=smollm2-135m", check=False)
    assert r.returncode != 0 and "did you mean 'model_name'" in (r.stdout + r.stderr)

# ---- bad input: clear errors, nothing half-written ----

@pytest.fixture
def small_hf(tmp_path):
    "An HF folder of a tiny Llama-shaped model (fast to corrupt in many ways)."
    from maxpost.model import tiny_config, param_shapes
    from maxpost.checkpoint import config_to_hf, hf_tensor_specs
    cfg = tiny_config("llama")
    d = tmp_path / "tiny-hf"; d.mkdir()
    specs = {k: (s, np.float32) for k, s in hf_tensor_specs(cfg).items()}
    rng = np.random.default_rng(0)
    write_safetensors(d / "model.safetensors", specs, ((k, rng.random(s[0], np.float32)) for k, s in specs.items()))
    (d / "config.json").write_text(json.dumps(config_to_hf(cfg)))
    return d

def test_missing_and_truncated_safetensors(small_hf, tmp_path):
    raw = (small_hf / "model.safetensors").read_bytes()
    (small_hf / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match="truncated"): to_maxpost(small_hf, tmp_path / "o")
    (small_hf / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing safetensors"): to_maxpost(small_hf, tmp_path / "o")
    assert not (tmp_path / "o").exists()

def test_never_unpickles(small_hf, tmp_path):
    (small_hf / "model.safetensors").rename(small_hf / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="never unpickles"): to_maxpost(small_hf, tmp_path / "o")

def test_unknown_architecture_and_model_name(small_hf, tmp_path):
    cfg = json.loads((small_hf / "config.json").read_text())
    (small_hf / "config.json").write_text(json.dumps(cfg | {"model_type": "mamba"}))
    with pytest.raises(CheckpointError, match="unknown architecture"): to_maxpost(small_hf, tmp_path / "o")
    (small_hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unknown model_name 'gemma4'"): to_maxpost(small_hf, tmp_path / "o", "gemma4")

def test_config_preset_mismatch_names_field(hf_smol, tmp_path):
    d = tmp_path / "hf"; shutil.copytree(hf_smol, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | {"rope_theta": 10000.0}))
    with pytest.raises(CheckpointError, match="field 'rope_theta'"): to_maxpost(d, tmp_path / "o", "smollm2-135m")

def test_tensor_shape_mismatch_names_tensor(small_hf, tmp_path):
    cfg = json.loads((small_hf / "config.json").read_text())
    (small_hf / "config.json").write_text(json.dumps(cfg | {"intermediate_size": cfg["intermediate_size"] * 2}))
    with pytest.raises(CheckpointError, match="shape mismatch for 'model.layers.0.mlp.gate_proj.weight'"):
        to_maxpost(small_hf, tmp_path / "o")

def test_refuses_existing_checkpoint_and_crash_leaves_nothing(small_hf, tmp_path, monkeypatch):
    out = to_maxpost(small_hf, tmp_path / "o")
    with pytest.raises(CheckpointError, match="already holds a checkpoint"): to_maxpost(small_hf, out)
    before = sorted(p.name for p in tmp_path.iterdir())
    import maxpost.checkpoint as ck
    def boom(*a, **k): raise RuntimeError("disk full")
    monkeypatch.setattr(ck, "save_params", boom)
    with pytest.raises(RuntimeError): to_maxpost(small_hf, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == before          # no temp folder left behind
    assert load_checkpoint(out)[1].num_layers == 4                       # the old checkpoint is intact
    with pytest.raises(CheckpointError, match="already holds a checkpoint"): to_huggingface(out, small_hf)

def test_checkpoint_of_another_model(small_hf, tmp_path):
    out = to_maxpost(small_hf, tmp_path / "o")
    with pytest.raises(CheckpointError, match="config/preset mismatch"): load_checkpoint(out, "smollm2-135m")
