"""What fits a TPU, by preset × mode × topology × sequence length: the largest power-of-two batch at which
`python -m maxpost.aot` says `fits`, at maxpost's TPU defaults (bfloat16, remat full). No TPU needed (libtpu's compiler);
on a TPU host's CPUs it runs with JAX kept off the chip.

Each task halves the batch from --cap until a compile fits (a program that does not fit fails in seconds, one that
fits takes the full compile), so a task costs a few quick refusals and one real compile. Tasks run in parallel
processes; every result is appended to OUT/aot_table.jsonl as it arrives, and OUT/aot_table.md is the table.

    python benchmarks/aot_table.py --out benchmarks/results/aot --workers 2
    python benchmarks/aot_table.py --out /tmp/aot --presets gemma3-1b --modes full,lora --topologies v5e-1 --seqs 1024
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PRESETS = ["gemma3-270m", "gemma3-1b", "gemma3-4b", "llama3.2-1b", "qwen3-0.6b"]
MODES = {   # name → (aot mode, batch key, fixed keys at sequence length T)
    "full": ("train_sft", "per_device_batch_size", lambda T: [f"max_target_length={T}"]),
    "lora": ("train_sft", "per_device_batch_size", lambda T: ["use_lora=true", f"max_target_length={T}"]),
    "dpo": ("train_dpo", "per_device_batch_size", lambda T: [f"max_target_length={T}"]),
    "rl_lora": ("train_rl", "batch_size", lambda T: ["use_lora=true", "num_generations=8",
                                                    f"max_prefill_predict_length={T // 2}", f"max_completion_length={T // 2}"]),
    "sampler": ("sample", "per_device_batch_size", lambda T: [f"max_prefill_predict_length={T // 2}", f"max_target_length={T}"]),
}


def task(preset: str, mode: str, topology: str, T: int, cap: int) -> dict:
    "Halve the batch from `cap` until it fits; the record of the largest fitting power of two (or none)."
    from maxpost import aot          # before jax: libtpu on the path
    amode, key, fixed = MODES[mode]
    argv = [f"model_name={preset}", *fixed(T)]
    b, tried, t0 = cap, [], time.perf_counter()
    while b >= 1:
        r = aot.check(amode, argv + [f"{key}={b}"], topology, quiet=True)
        peak = max((p["hbm"]["total"] + p.get("resident_gib", 0) for p in r["programs"] if p["fits"]), default=None)
        tried.append({"batch": b, "fits": r["fits"], "why": r["why"], "peak_gib": peak})
        if r["fits"]: break
        b //= 2
    best = next((t for t in tried if t["fits"]), None)
    return {"preset": preset, "mode": mode, "topology": topology, "T": T, "key": key, "cap": cap,
            "largest": best["batch"] if best else 0, "peak_gib": best["peak_gib"] if best else None,
            "tried": tried, "seconds": round(time.perf_counter() - t0, 1)}


def table(recs: list) -> str:
    "A markdown table: one row per preset × mode, one column per topology × T."
    cols = sorted({(r["topology"], r["T"]) for r in recs})
    out = ["| preset | mode | batch key | " + " | ".join(f"{t}, T = {T}" for t, T in cols) + " |",
           "|---|---|---|" + "---|" * len(cols)]
    by = {(r["preset"], r["mode"], r["topology"], r["T"]): r for r in recs}
    for p in PRESETS:
        for m in MODES:
            if not any((p, m, *c) in by for c in cols): continue
            cells = []
            for c in cols:
                r = by.get((p, m, *c))
                if r is None: cells.append("–")
                elif not r["largest"]: cells.append("none fits")
                else: cells.append(f"{'≥ ' if r['largest'] == r['cap'] else ''}{r['largest']} ({r['peak_gib']:.1f} GiB)")
            out.append(f"| {p} | {m} | {MODES[m][1]} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--topologies", default="v5e-1,v6e-8")
    ap.add_argument("--seqs", default="1024,2048")
    ap.add_argument("--cap", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=0, help="seconds; tasks not started by then are skipped")
    ap.add_argument("--task", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.task:
        p, m, t, T = a.task.split(":")
        print("TASK " + json.dumps(task(p, m, t, int(T), a.cap)), flush=True); return
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    jl = out / "aot_table.jsonl"
    done = {(r["preset"], r["mode"], r["topology"], r["T"]) for r in map(json.loads, jl.read_text().splitlines())} \
        if jl.exists() else set()
    todo = [(p, m, t, T) for T in map(int, a.seqs.split(",")) for t in a.topologies.split(",")
            for p in a.presets.split(",") for m in a.modes.split(",") if (p, m, t, T) not in done]
    t_end = time.time() + a.deadline if a.deadline else None
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")

    def run(tk):
        if t_end and time.time() > t_end: return None
        cap = a.cap * (4 if tk[1] == "sampler" else 1)
        r = subprocess.run([sys.executable, __file__, "--out", a.out, "--cap", str(cap), "--task", ":".join(map(str, tk))],
                           capture_output=True, text=True, env=env)
        lines = [l for l in r.stdout.splitlines() if l.startswith("TASK ")]
        rec = json.loads(lines[-1][5:]) if lines else {"task": tk, "error": r.stderr[-800:]}
        if lines:
            with open(jl, "a") as f: f.write(json.dumps(rec) + "\n")
        print(json.dumps({k: rec.get(k) for k in ("preset", "mode", "topology", "T", "largest", "peak_gib", "seconds", "error")}),
              flush=True)
        return rec

    with ThreadPoolExecutor(a.workers) as ex: list(ex.map(run, todo))
    recs = [json.loads(l) for l in jl.read_text().splitlines()] if jl.exists() else []
    (out / "aot_table.md").write_text(table(recs) + "\n")
    print(table(recs))


if __name__ == "__main__":
    main()
