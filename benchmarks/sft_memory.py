"""Memory of the compiled SFT train step without running it: XLA's memory analysis (arguments, outputs, aliased
(donated) bytes, temporaries) of Gemma 3 270M's jitted step for each `remat_policy`, from abstract state (only the
zero base weights are materialised, ~1 GiB).

    python benchmarks/sft_memory.py [--batch 4] [--seq 512] [--lora] [--remat none full dots] [--set key=value ...]

Add XLA_FLAGS=--xla_dump_to=DIR to see the buffer assignment (`*memory-usage-report.txt`: the largest buffers and
the values that share them)."""
import argparse, json, os
import numpy as np, jax, jax.numpy as jnp
from maxpost.model import param_shapes
from maxpost.sft import SFTConfig, SFTTrainer, model_config

def step_memory(batch: int, seq: int, lora: bool, **keys) -> dict:
    "GiB of XLA's memory analysis of the compiled SFT step, and args + outputs − aliased + temporaries."
    mcfg = model_config("gemma3-270m")
    base = {k: np.zeros(s, np.float32) for k, s in param_shapes(mcfg).items()}
    cfg = SFTConfig(model_name="gemma3-270m", use_lora=lora, per_device_batch_size=batch, max_target_length=seq,
                    steps=100, **keys)
    tr = SFTTrainer(cfg, mcfg, base); del base
    if lora: params = jax.eval_shape(tr.init_lora, jax.random.key(0))
    else: params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tr._base)
    st = {"step": jax.ShapeDtypeStruct((), jnp.int32), "params": params, "opt_state": jax.eval_shape(tr.opt.init, params),
          "rng": jax.ShapeDtypeStruct((2,), jnp.uint32)}
    b = {k: jax.ShapeDtypeStruct((1, batch, seq), jnp.float32 if k == "loss_mask" else jnp.int32)
         for k in ("inputs", "targets", "positions", "segment_ids", "loss_mask")}
    m = tr._step.lower(st, tr.frozen, b).compile().memory_analysis()
    out = {k: m.__getattribute__(k + "_size_in_bytes") / 2**30 for k in ("argument", "output", "alias", "temp")}
    out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return {k: round(v, 3) for k, v in out.items()}

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4); ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--remat", nargs="+", default=["none", "full", "dots"])
    ap.add_argument("--set", nargs="*", default=[], help="other SFTConfig keys, key=value (JSON values)")
    a = ap.parse_args()
    extra = {k: json.loads(v) if v[:1] in "[{0123456789-tf" else v for k, v in (s.split("=", 1) for s in a.set)}
    print(f"jax {jax.__version__}; {'LoRA' if a.lora else 'full'} SFT step, Gemma 3 270M, {a.batch} x {a.seq}, {extra}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    for r in a.remat:
        print(f"  remat_policy={r:5s} GiB: " + json.dumps(step_memory(a.batch, a.seq, a.lora, remat_policy=r, **extra)))
