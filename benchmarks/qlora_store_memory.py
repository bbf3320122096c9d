"""Peak RSS of a QLoRA run's start, side by side in one run: quantizing the base at start (`quantized_base_path=""`:
the source loaded in full precision, placed and quantized) against reading the stored quantized base
(`maxpost.quant_store`, `quantized_base_path=auto`), each in a fresh subprocess, next to the interpreter's own baseline
(python with jax and maxpost imported). A first subprocess writes the store. Each child then takes one SFT step on
a fixed synthetic batch, so the first losses of the two roads can be compared bit for bit.

    .venv/bin/python benchmarks/qlora_store_memory.py [--source ~/.cache/maxpost/hf/smollm2-135m] [--model-name smollm2-135m]
        [--qtype nf4]
        [--double-quant] [--json out.json]
"""
import argparse, json, os, subprocess, sys, tempfile, textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import maxpost.quant as mq
    from maxpost.data import SFTDataIterator
    from maxpost.sft import SFTConfig, SFTTrainer, synthetic_examples
    from maxpost.trainer import load_base
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    what, keys = sys.argv[1], json.loads(sys.argv[2])
    out = {"imported": peak()}
    if what != "baseline":
        calls, orig = [], mq.quantize
        mq.quantize = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
        cfg = SFTConfig(**keys)
        mcfg, base, _ = load_base(cfg)
        tr = SFTTrainer(cfg, mcfg, base); del base
        out["loaded"] = peak()                   # the base loaded, on the devices, quantized (or read)
        b = next(SFTDataIterator(synthetic_examples(64, mcfg.vocab_size, "copy"), int(cfg.per_device_batch_size), cfg.max_target_length, seed=0))
        _, m = tr.step(tr.init_state(), b)
        out |= {"stepped": peak(), "loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]), "quantize_calls": len(calls)}
    print(json.dumps(out))
""")

def run(what, keys):
    r = subprocess.run([sys.executable, "-c", CHILD, what, json.dumps(keys)], capture_output=True, text=True)
    if r.returncode: raise SystemExit(f"{what} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]) | {"stderr": [l for l in r.stderr.splitlines() if "quantiz" in l]}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=str(Path.home() / ".cache/maxpost/hf/smollm2-135m"))
    ap.add_argument("--model-name", default="smollm2-135m")
    ap.add_argument("--qtype", default="nf4"); ap.add_argument("--double-quant", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    out_dir = Path(tempfile.mkdtemp(prefix="qlora_store_"))
    keys = dict(model_name=a.model_name, load_parameters_path=a.source, base_output_directory=str(out_dir), use_lora=True, lora_rank=8,
                lora_weight_qtype=a.qtype, lora_double_quant=a.double_quant, per_device_batch_size=1,
                max_target_length=64, learning_rate=1e-4)
    res = {"baseline": run("baseline", {}), "write": run("write", keys),
           "quantize_at_start": run("quantize", keys | {"quantized_base_path": ""}), "read_stored": run("read", keys)}
    store = next((out_dir / "quantized_base").iterdir())
    du = lambda p: sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file())
    res["bytes"] = {"source": du(a.source), "store": du(store)}
    base, G = res["baseline"]["imported"], 2**30
    print(f"source {a.source}: {res['bytes']['source'] / 2**20:.1f} MiB; store {store.name}: {res['bytes']['store'] / 2**20:.1f} MiB")
    print(f"baseline (python + jax + maxpost imported): peak RSS {base / G:.2f} GiB")
    print("| road | quantizer calls | peak RSS after load (GiB) | over baseline | peak RSS after step 1 (GiB) | step-1 loss | grad norm |")
    print("|---|---|---|---|---|---|---|")
    for k in ("write", "quantize_at_start", "read_stored"):
        r = res[k]
        print(f"| {k} | {r['quantize_calls']} | {r['loaded'] / G:.2f} | {(r['loaded'] - base) / G:.2f} | {r['stepped'] / G:.2f} "
              f"| {r['loss']!r} | {r['grad_norm']!r} |")
    q, s = res["quantize_at_start"], res["read_stored"]
    print(f"read/quantize peak over baseline after load: {(s['loaded'] - base) / (q['loaded'] - base):.2f}x; "
          f"step-1 loss bit-identical: {q['loss'] == s['loss'] and q['grad_norm'] == s['grad_norm']}")
    for k in ("write", "read_stored"): print(k, res[k]["stderr"])
    if a.json: Path(a.json).write_text(json.dumps(res, indent=1))

if __name__ == "__main__":
    main()
