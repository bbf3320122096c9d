"Compile maxpost's LoRA SFT step on Gemma 3 270M shapes (random weights), write the optimized HLO, print XLA's cost analysis and every dot. Usage: python benchmarks/sft_hlo.py B T TAG [JSON of extra SFTConfig keys]"
import os, re, sys, collections, json
import numpy as np, jax
from maxpost.sft import SFTConfig, SFTTrainer, model_config, random_params
B, T = int(sys.argv[1]), int(sys.argv[2]); tag = sys.argv[3] if len(sys.argv) > 3 else "base"
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
mcfg = model_config("gemma3-270m")
cfg = SFTConfig(model_name="gemma3-270m", use_lora=True, lora_rank=16, lora_alpha=32.0,
                lora_module_path="wq|wo|w_gate|w_up|w_down", per_device_batch_size=B, max_target_length=T, **extra)
tr = SFTTrainer(cfg, mcfg, random_params(mcfg)); st = tr.init_state()
tok = np.random.default_rng(0).integers(10, 262144, (B, T), dtype=np.int32)
hb = dict(inputs=tok, targets=tok, positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
          segment_ids=np.ones((B, T), np.int32), loss_mask=np.ones((B, T), np.float32))
c = tr._step.lower(st, tr.frozen, tr.put_batch(hb)).compile()
txt = c.as_text(); open(f"{os.environ.get('OUT_DIR', '/tmp')}/sft_step_{tag}.hlo", "w").write(txt)
ca = c.cost_analysis(); ca = ca[0] if isinstance(ca, list) else ca
print("cost analysis flops", ca.get("flops"), "bytes", ca.get("bytes accessed"))
ops = collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", txt))
print({k: ops[k] for k in ("dot", "convolution", "transpose", "copy", "fusion", "while", "custom-call")})
# every dot with its shape
for m in re.finditer(r"(%\S+) = (\S+) dot\(([^)]*)\)(.*)", txt):
    print("DOT", m.group(2), m.group(3)[:160], re.search(r"lhs_contracting_dims=\{[^}]*\}, rhs_contracting_dims=\{[^}]*\}|lhs_batch.*?\}", m.group(4)).group(0) if re.search(r"contracting", m.group(4)) else "")
