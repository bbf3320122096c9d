"""Compile Tunix 0.1.7's PeftTrainer train step for a TPU topology on the CPU (libtpu's compiler, no chip), as
`maxpost.aot` does for maxpost's programs: its memory and its optimized HLO, for `benchmarks/hlo_traffic.py`.

    python benchmarks/tunix_hlo.py OUT_PREFIX [--model gemma3-1b] [--mode full|lora] [--batch 2] [--seq 1024]
                                   [--topology v5e-1]

The step is PeftTrainer's own `_train_step` (its default loss, `nnx.value_and_grad`, `optax.global_norm`,
`optimizer.update`) with maxpost's optimizer over Tunix's tree (`sft_throughput.tunix_optimizer`, as the chip
benchmarks give it), jitted as PeftTrainer jits it (the optimizer donated), on abstract bfloat16 weights placed on the
topology's devices. LoRA: rank 16 on the five projections (`sft_throughput.TUNIX_TARGETS`). Writes OUT_PREFIX.hlo and
prints the memory in maxpost.aot's format.
"""
import argparse, sys
from pathlib import Path
import maxpost.aot as aot                  # first: it puts libtpu on the path before jax is imported
import jax, jax.numpy as jnp, numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sft_throughput as st


def build(model: str, mode: str, B: int, T: int, topology: str | None):
    """(jitted step, its abstract arguments) of Tunix's train step on `topology`'s devices; topology None: on this
    process's devices, with real arguments (Tunix's random weights, random tokens; benchmarks/tunix_profile.py)."""
    import qwix
    from flax import nnx
    from tunix.models.gemma3 import model as gm
    from tunix.sft import peft_trainer, utils as su
    devs = aot.topology_devices(topology) if topology else jax.devices()
    mesh = jax.sharding.Mesh(np.array(devs).reshape(len(devs), 1), ("fsdp", "tp"))
    cfg = st.tunix_model_config(model); cfg.param_dtype = jnp.bfloat16
    scfg = st.sft_config("unused", mode, B, T, "bfloat16")
    toks = jax.ShapeDtypeStruct((B, T), jnp.int32)
    def make():
        m = gm.Gemma3(cfg, rngs=nnx.Rngs(0))
        if mode == "lora":
            prov = qwix.LoraProvider(module_path=st.TUNIX_TARGETS, rank=scfg.lora_rank, alpha=scfg.lora_alpha)
            x = jnp.zeros((B, T), jnp.int32); mask = jnp.ones((B, T), bool)
            m = qwix.apply_lora_to_model(m, prov, x, su.build_positions_from_mask(mask), None,
                                         su.make_causal_attn_mask(mask), rngs=nnx.Rngs(0))
        opt = nnx.Optimizer(m, st.tunix_optimizer(scfg), wrt=nnx.LoRAParam if mode == "lora" else nnx.Param)
        return m, opt
    with mesh:
        graphdef, state = nnx.split(nnx.eval_shape(make) if topology else make())
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    place = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep)
    if topology: state = jax.tree.map(place, state)
    trainer = peft_trainer.PeftTrainer.__new__(peft_trainer.PeftTrainer)   # only its step's pieces, no weights
    trainer.loss_fn, trainer._has_aux, trainer._lora_enabled = peft_trainer._default_loss_fn, False, mode == "lora"
    def gen_input(x):
        tokens, mask = x
        return dict(input_tokens=tokens, input_mask=mask, positions=su.build_positions_from_mask(mask),
                    attention_mask=su.make_causal_attn_mask(mask))
    trainer.gen_model_input_fn = gen_input
    def step(state, tokens, mask):
        m, opt = nnx.merge(graphdef, state)
        loss, _, gnorm = trainer._train_step(m, opt, (tokens, mask))
        return nnx.state((m, opt)), loss, gnorm
    f = jax.jit(step, donate_argnums=0)
    if not topology:
        tokens = jax.device_put(jnp.asarray(np.random.default_rng(0).integers(0, cfg.num_embed, (B, T)), jnp.int32), rep)
        return f, (jax.device_put(state, rep), tokens, jax.device_put(jnp.ones((B, T), bool), rep))
    return f, (state, place(toks), jax.ShapeDtypeStruct((B, T), jnp.bool_, sharding=rep))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out_prefix")
    ap.add_argument("--model", default="gemma3-1b"); ap.add_argument("--mode", default="full", choices=["full", "lora"])
    ap.add_argument("--batch", type=int, default=2); ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--topology", default="v5e-1")
    a = ap.parse_args(argv)
    f, args = build(a.model, a.mode, a.batch, a.seq, a.topology)
    orig = aot.memory
    def memory(compiled):                        # as benchmarks/hlo_dump.py: keep the compiled program's text
        Path(f"{a.out_prefix}.hlo").write_text(compiled.as_text())
        ca = compiled.cost_analysis(); ca = ca[0] if isinstance(ca, list) else ca
        print(f"cost analysis: {ca.get('flops', 0) / 1e12:.3f} TFLOP, {ca.get('bytes accessed', 0) / 2**30:.2f} GiB accessed")
        return orig(compiled)
    aot.memory = memory
    rec = aot.compile_program("tunix train step", f, *args)
    print(f"Tunix {a.model} {a.mode} B={a.batch} T={a.seq} on {a.topology}: {rec}")


if __name__ == "__main__":
    main()
