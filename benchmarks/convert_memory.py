"""Converter memory and time, side by side in one run.

For each embedded model: peak RSS and wall time of `to_maxpost` and `to_huggingface`, each in a fresh subprocess,
next to (a) the interpreter's own baseline (python with jax and maxpost imported) and (b) a plain read of every
safetensors tensor. The limit the foundation issue sets: peak RSS <= baseline + 1.3 x checkpoint bytes.

    .venv/bin/python benchmarks/convert_memory.py [--models smollm2-135m,gemma3-270m] [--json out.json]
"""
import argparse, json, resource, subprocess, sys, tempfile, textwrap, time
from pathlib import Path

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    import jax, maxpost.checkpoint as ck, maxpost.convert.to_maxpost as tm, maxpost.convert.to_huggingface as th
    what, src, dst = sys.argv[1:4]
    t = time.perf_counter()
    if what == "baseline": pass
    elif what == "read":
        f = ck.HFCheckpoint(src)
        for k in f.keys(): f.read(k)
    elif what == "to_maxpost": tm.to_maxpost(src, dst)
    elif what == "to_huggingface": th.to_huggingface(src, dst)
    print(json.dumps(dict(seconds=time.perf_counter() - t, peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))
""")

def run(what, src="", dst=""):
    out = subprocess.run([sys.executable, "-c", CHILD, what, str(src), str(dst)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])

def measure(model_name):
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.checkpoint import HFCheckpoint
    hf = embedded_hf(model_name)
    nbytes = HFCheckpoint(hf).nbytes
    work = Path(tempfile.mkdtemp())
    r = dict(model=model_name, checkpoint_bytes=nbytes, baseline=run("baseline"), read=run("read", hf),
             to_maxpost=run("to_maxpost", hf, work / "mp"), to_huggingface=run("to_huggingface", work / "mp", work / "hf"))
    base = r["baseline"]["peak_rss"]
    for k in ("read", "to_maxpost", "to_huggingface"):
        r[k]["rss_over_baseline_per_ckpt_byte"] = (r[k]["peak_rss"] - base) / nbytes
    return r

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--models", default="smollm2-135m,gemma3-270m"); ap.add_argument("--json")
    a = ap.parse_args()
    rows = [measure(m) for m in a.models.split(",")]
    print(f"{'model':14} {'ckpt MB':>8} {'step':15} {'seconds':>8} {'peak RSS MB':>12} {'(RSS-base)/ckpt':>16} {'time/read':>10}")
    for r in rows:
        for k in ("baseline", "read", "to_maxpost", "to_huggingface"):
            x = r[k]; ratio = x.get("rss_over_baseline_per_ckpt_byte")
            ratio_s = "" if ratio is None else f"{ratio:.2f}"
            tr = "" if k == "baseline" else f"{x['seconds'] / r['read']['seconds']:.2f}"
            print(f"{r['model']:14} {r['checkpoint_bytes'] / 2**20:8.0f} {k:15} {x['seconds']:8.2f} "
                  f"{x['peak_rss'] / 2**20:12.0f} {ratio_s:>16} {tr:>10}")
    if a.json: Path(a.json).write_text(json.dumps(rows, indent=1))
