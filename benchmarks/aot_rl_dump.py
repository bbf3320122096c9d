"""The RL update of `python -m maxpost.aot train_rl …` compiled for v5e-1 with XLA's dumps kept: its memory figures,
the optimized HLO (OUT/update.hlo) and XLA's buffer assignment and memory-usage report (OUT/dump/*update_fn*), to
see which buffers make the temporaries.

    PYTHONPATH=$PWD python benchmarks/aot_rl_dump.py OUT model_name=gemma3-1b use_lora=true lora_weight_qtype=nf4 …

The update is built as `maxpost.aot.rl_programs` builds it (the sampler is not compiled).
"""
import os, sys, time
out = sys.argv[1]; argv = sys.argv[2:]
os.makedirs(out, exist_ok=True)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={out}/dump --xla_dump_hlo_as_text"
                           " --xla_dump_hlo_module_re=.*update.*")
from maxpost import aot
aot._prepare_libtpu(cli=True)
import jax.numpy as jnp
from maxpost import train_rl
from maxpost.config import load_config
from maxpost.rl.config import loss_config
from maxpost.rl.trainer import RLTrainer
from maxpost.sharding import make_mesh

cfg = load_config(train_rl.RLConfig, argv, base_yaml=train_rl.default_config()).for_backend("tpu")
mesh = make_mesh(cfg.ici_fsdp_parallelism, cfg.ici_tensor_parallelism, aot.topology_devices("v5e-1"))
mcfg = aot.shape_config(cfg)
tr = RLTrainer(cfg, loss_config(cfg), mcfg, aot.abstract_base(mcfg), mesh)
st = aot.abstract_state(tr, aot.trained_params(tr))
R = cfg.batch_size * cfg.num_generations // cfg.num_minibatches
T = cfg.max_prefill_predict_length + cfg.max_completion_length
keys = dict(aot.SFT_BATCH, completion_mask=jnp.float32, engine_logps=jnp.float32); del keys["loss_mask"]
if tr.recompute_old or cfg.use_engine_logprobs: keys["old_logps"] = jnp.float32
if tr.use_ref: keys["ref_logps"] = jnp.float32
mb = aot.rows((R, T), tr.rows_sh, keys) | {"advantages": aot.SDS((R,), jnp.float32, sharding=tr.rows_sh)}
t0 = time.time()
c = tr._update.lower(st, tr.frozen, mb).compile()
print(" ".join(argv), {k: round(v, 3) for k, v in aot.memory(c).items()}, f"compiled in {time.time() - t0:.1f} s", flush=True)
open(f"{out}/update.hlo", "w").write(c.as_text())
