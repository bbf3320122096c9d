"Trace one LoRA SFT step (Gemma 3 270M shapes, random weights) with jax.profiler; sum XLA op time by class. Usage: python benchmarks/sft_trace.py B T f32|bf16 (a tag containing bf16 sets bf16_matmuls)"
import sys, json, gzip, glob, collections, re, os, shutil, time
import numpy as np, jax
from maxpost.sft import SFTConfig, SFTTrainer, model_config, random_params
B, T, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]; bf = "bf16" in tag
mcfg = model_config("gemma3-270m")
cfg = SFTConfig(model_name="gemma3-270m", use_lora=True, lora_rank=16, lora_alpha=32.0, bf16_matmuls=bf,
                lora_module_path="wq|wo|w_gate|w_up|w_down", per_device_batch_size=B, max_target_length=T)
tr = SFTTrainer(cfg, mcfg, random_params(mcfg)); st = tr.init_state()
tok = np.random.default_rng(0).integers(10, 262144, (B, T), dtype=np.int32)
hb = dict(inputs=tok, targets=tok, positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
          segment_ids=np.ones((B, T), np.int32), loss_mask=np.ones((B, T), np.float32))
st, m = tr.step(st, hb); jax.block_until_ready(m)
OUT = os.environ.get("OUT_DIR", "/tmp"); d = f"{OUT}/sft_trace_{tag}"; shutil.rmtree(d, ignore_errors=True)
t = time.perf_counter()
with jax.profiler.trace(d):
    st, m = tr.step(st, hb); jax.block_until_ready(m)
print("step s", time.perf_counter() - t)
open(f"{OUT}/sft_trace_{tag}.hlo", "w").write(hlo := tr._step.lower(st, tr.frozen, tr.put_batch(hb)).compile().as_text())
_ = tr._step.lower(st, tr.frozen, tr.put_batch(hb)).compile().as_text()
meta = {}
for mm in re.finditer(r"%(\S+) = .*?metadata=\{op_name=\"([^\"]*)\"", hlo): meta[mm.group(1)] = mm.group(2)
f = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)[0]
ev = [e for e in json.load(gzip.open(f))["traceEvents"] if e.get("ph") == "X"]
names = collections.Counter(); cls = collections.Counter()
def klass(name):
    op = meta.get(name, "")
    bwd = "transpose(jvp" in op
    if any(k in op for k in ("cv,vd", "cd,vd", "cv,cd", "reduce_sum", "/exp", "log", "convert_element_type")) or \
            name.startswith(("subtract_exponential", "wrapped_convert")): c = "loss/head (+ weight cast)"
    elif any(s in op for s in ("adam", "clip", "optax", "global_norm", "apply_updates", "scale_by")): c = "optimizer"
    elif any(s in op for s in ("btkgh,bskh", "bkgts,bskh", "softmax", "attention", "reduce_max", "exp")): c = "attention"
    elif re.search(r",\w*r->|r,r\w*->|\w*r,r", op): c = "LoRA"
    elif "dot_general" in op or "einsum" in op or "lowp" in op: c = "dense matmul"
    elif name.startswith(("copy", "transpose")) or "copy" in name: c = "copy/transpose"
    else: c = "elementwise/other"
    return c + (" bwd" if bwd else " fwd")
tot = 0
for e in ev:
    n = e["name"]
    if n in meta:
        names[n] += e["dur"]; cls[klass(n)] += e["dur"]; tot += e["dur"]
print("XLA op time traced (ms, summed over threads)", tot / 1e3)
for k, v in sorted(cls.items(), key=lambda kv: -kv[1]): print(f"  {k:28s} {v / 1e3:9.1f} ms {v / tot:6.1%}")
print("top ops:")
for k, v in names.most_common(15): print(f"  {k:40s} {v / 1e3:8.1f} ms  {meta.get(k, '')[-90:]}")
