"""Where the decoder's forward + backward spends its time, per compiled XLA op: Gemma 3 270M (the embedded
checkpoint), 2 × 256 random token ids, maxpost's SFT trainer inputs, the gradient of <hidden, random cotangent> with
respect to the trained parameters (LoRA factors, or every weight under full fine-tuning). Runs it under
`jax.profiler` and sums the XLA CPU runtime's per-op events by op name and by op class (`ynn_fusion` = the matmuls
handed to YNNPACK; the rest are XLA's own loop fusions, copies and broadcasts), with each op's shape and the ops it
fuses, from the compiled HLO.

    python benchmarks/decoder_op_profile.py --mode full [--bf16-matmuls] [--tree /tmp/base] [--top 30]

`--tree` imports maxpost from another tree (e.g. `git archive <commit> maxpost | tar -x -C /tmp/base`), for a
before/after comparison on the same machine. Event times are per thread: a matmul spread over both cores appears
once, with its wall time; small ops on the two threads may overlap, so the sum can exceed the wall time.
"""
import argparse, collections, glob, re, statistics, sys, tempfile, time
from pathlib import Path

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["lora", "full"], default="full")
    ap.add_argument("--bf16-matmuls", action="store_true")
    ap.add_argument("--tree", help="import maxpost from this tree instead of the checkout")
    ap.add_argument("--top", type=int, default=30, help="ops to list")
    ap.add_argument("--reps", type=int, default=2, help="profiled calls")
    a = ap.parse_args()
    if a.tree: sys.path.insert(0, str(Path(a.tree).resolve()))
    sys.path.insert(1, str(Path(__file__).resolve().parent))
    import jax, jax.numpy as jnp
    import maxpost
    from sft_throughput import maxpost_trainer, make_tokens, cpu_info, machine_kind
    from maxpost.convert.from_gguf import embedded_hf
    B, T = 2, 256
    tr, hb = maxpost_trainer(embedded_hf("gemma3-270m"), make_tokens(262_144, B, T), a.mode, "float32", a.bf16_matmuls)
    st = tr.init_state(); mb = jax.tree.map(lambda x: x[0], tr.put_batch(hb))
    def hidden(p, fz):
        model, lora = tr.model_inputs(p, fz)
        return model(mb["inputs"], mb["positions"], mb["segment_ids"], return_hidden=True, lora=lora)[0]
    ct = jax.random.normal(jax.random.key(1), (B, T, tr.mcfg.hidden_size), jnp.float32)
    args = (st["params"], tr.frozen)
    f = jax.jit(jax.grad(lambda p, fz: jnp.vdot(hidden(p, fz), ct))).lower(*args).compile()
    hlo = f.as_text()
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(3):
        t = time.perf_counter(); jax.block_until_ready(f(*args)); ts.append(time.perf_counter() - t)
    trace = tempfile.mkdtemp()
    with jax.profiler.trace(trace):
        for _ in range(a.reps): jax.block_until_ready(f(*args))
    pd = jax.profiler.ProfileData.from_file(glob.glob(f"{trace}/**/*.xplane.pb", recursive=True)[0])
    per_op, calls = collections.Counter(), collections.Counter()
    for plane in pd.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLAEigen"): continue      # the runtime's worker threads
            for ev in line.events:
                if ev.name in ("ThunkExecutor::Execute", "SlinkyThreadPool::Await"): continue
                per_op[ev.name] += ev.duration_ns / a.reps / 1e9; calls[ev.name] += 1
    comps = dict(re.findall(r"^%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.M | re.S))
    def describe(name):
        m = re.search(r"^\s*%?" + re.escape(name) + r" = (\S+) (.*)$", hlo, re.M)
        if not m: return ""
        calls = re.search(r"calls=%?([\w.\-]+)", m.group(2))
        body = comps.get(calls.group(1), "") if calls else ""
        ops = sorted(set(re.findall(r"= \S+ ([a-z][\w\-]*)\(", body)) - {"parameter", "bitcast", "constant"})
        dims = re.findall(r"lhs_contracting_dims=\{([\d,]*)\}, rhs_contracting_dims=\{([\d,]*)\}", body)
        return f"{m.group(1)}  [{','.join(ops)}]" + (f"  contracting lhs {{{dims[0][0]}}} rhs {{{dims[0][1]}}}" if dims else "")
    klass = collections.Counter()
    for k, v in per_op.items(): klass["matmul (ynn_fusion)" if k.startswith("ynn") else re.sub(r"[.\d]+$", "", k)] += v
    ci = cpu_info()
    print(f"CPU {machine_kind(ci)}; jax {jax.__version__}; maxpost from {Path(maxpost.__file__).parent}")
    print(f"decoder forward + backward, Gemma 3 270M, {B} x {T}, {a.mode}{', bf16_matmuls' if a.bf16_matmuls else ''}: "
          f"{statistics.median(ts):.3f} s (median of 3); op events sum to {sum(per_op.values()):.3f} s per call")
    for k, v in klass.most_common(10): print(f"  {k:42s} {v:7.3f} s")
    print(f"top {a.top} ops (s per call, events per call, output shape [fused ops]):")
    for k, v in per_op.most_common(a.top):
        print(f"  {v:7.4f} s  x{calls[k] // a.reps:3d}  {k:36s} {describe(k)[:150]}")

if __name__ == "__main__":
    main()
