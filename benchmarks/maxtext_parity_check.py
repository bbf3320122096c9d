"""MaxText side of the parity check (benchmarks/RESULTS_convert.md, "Against real MaxText"): MaxText's own loader
(`model_creation_utils.from_pretrained`) restores the checkpoints maxpost wrote, MaxText's forward pass runs on the
same 16 tokens, and its logits are compared with maxpost's. Runs in a separate Python 3.12 environment with the
`maxtext` wheel (see the results file for how it is built):

    JAX_PLATFORMS=cpu /tmp/mtvenv/bin/python benchmarks/maxtext_parity_check.py /tmp/mt/work

Each layout runs twice: as MaxText ships (its tied-embedding logits use a bfloat16 copy of the table,
`layers/embeddings.py: attend_on_embedding`), then with that one cast removed (float32 table).

The MaxText → maxpost direction (qwen3-0.6b, random weights) uses the same environment to dump MaxText's HF config of
the preset, and afterwards runs MaxText's forward pass on the checkpoints its own converter wrote, against HF's logits:

    JAX_PLATFORMS=cpu /tmp/mtvenv/bin/python benchmarks/maxtext_parity_check.py /tmp/mt/qwen qwen3-config
    JAX_PLATFORMS=cpu /tmp/mtvenv/bin/python benchmarks/maxtext_parity_check.py /tmp/mt/qwen qwen3
"""
import os, sys
import numpy as np, jax.numpy as jnp
from maxtext.configs import pyconfig
from maxtext.layers import nnx_decoders
from maxtext.utils import model_creation_utils

work = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "smollm2"
if mode == "qwen3-config":  # MaxText's own HF config of its qwen3-0.6b preset, for the random-weight HF folder
    from maxtext.checkpoint_conversion.utils.hf_model_configs import HF_MODEL_CONFIGS
    HF_MODEL_CONFIGS["qwen3-0.6b"].to_json_file(f"{work}/maxtext_qwen3-0.6b_config.json")
    sys.exit()
tok = np.load(f"{work}/tokens.npy")
ref = np.load(f"{work}/maxpost_logits.npy" if mode == "smollm2" else f"{work}/hf_logits.npy")
pos = np.arange(tok.shape[1], dtype=np.int32)[None]
base = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")
as_shipped = nnx_decoders.attend_on_embedding
f32_head = lambda q, table, dt, config, out_sharding=None: jnp.dot(q, jnp.asarray(table, dt).T, preferred_element_type=dt)

SMOLLM2 = [  # SmolLM2-135M's config.json as MaxText keys (MaxText has no preset of it): a Llama with tied embeddings
        "decoder_block=llama2", "base_emb_dim=576", "base_num_query_heads=9", "base_num_kv_heads=3", "head_dim=64",
        "base_mlp_dim=1536", "base_num_decoder_layers=30", "vocab_size=49152", "mlp_activations=['silu','linear']",
        "normalization_layer_epsilon=1e-5", "enable_dropout=false",
        "rope_max_timescale=100000", "rope_type=llama3.1", "rope_use_scale=false",   # interleaved RoPE, no 3.1 scaling
        "logits_via_embedding=true", "normalize_embedding_logits=false", "logits_dot_in_fp32=true"]

def maxtext_logits(items: str, scan: bool, model_keys: list[str]) -> np.ndarray:
    cfg = pyconfig.initialize([
        "x", base, "run_name=parity", f"base_output_directory={work}/out", f"load_parameters_path={items}",
        f"scan_layers={str(scan).lower()}", "skip_jax_distributed_system=true", "hardware=cpu",
        "enable_checkpointing=false", f"per_device_batch_size={tok.shape[0]}", f"max_target_length={tok.shape[1]}",
        "dtype=float32", "weight_dtype=float32", "matmul_precision=highest", "attention=dot_product", *model_keys])
    model = model_creation_utils.from_pretrained(cfg)
    model, mesh = model if isinstance(model, tuple) else (model, model.mesh)
    with mesh:
        out = model(jnp.asarray(tok), jnp.asarray(np.broadcast_to(pos, tok.shape)),
                    decoder_segment_ids=jnp.ones_like(jnp.asarray(tok)),
                    enable_dropout=False)
    return np.asarray(out[0] if isinstance(out, tuple) else out, np.float32)

for head, fn in (("bfloat16 (as shipped)", as_shipped), ("float32", f32_head)):
    nnx_decoders.attend_on_embedding = fn
    for scan in (True, False):
        if mode == "smollm2": got, other = maxtext_logits(f"{work}/smol-scan-{scan}/0/items", scan, SMOLLM2), "maxpost"
        else:  # the checkpoints MaxText's converter wrote (RESULTS_convert.md has the command)
            got, other = maxtext_logits(f"{work}/mt-scan-{str(scan).lower()}/0/items", scan, ["model_name=qwen3-0.6b"]), "HF"
        d = np.abs(got - ref)
        print(f"logits head {head:22s} scan_layers={scan!s:5s}: max|MaxText - {other}| {d.max():.2e}, mean {d.mean():.1e} "
              f"(max |logit| {np.abs(ref).max():.1f}); argmax agrees at {int((got.argmax(-1) == ref.argmax(-1)).sum())}"
              f"/{tok.shape[0] * tok.shape[1]} positions")
