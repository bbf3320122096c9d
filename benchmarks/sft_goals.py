"""Issue 17's SFT goals on this machine, in one command: the runs of `sft_throughput.py` that decide them, one after
the other, and a table of each goal with its measured figure, met or missed.

    python benchmarks/sft_goals.py [--out benchmarks/results] [--tunix-4x512] [--steps 7]

Runs (each a `sft_throughput.py` call in its own process; its JSON and summary are kept under --out):
1. LoRA, float32, 2 × 256, maxpost and Tunix alternating (plus maxpost with `bf16_matmuls=true` as a third trainer
   where the CPU has AVX512_BF16 or AMX): LoRA ≥ 1.5× Tunix's tokens/s, and MFU(6N) ≥ 0.7.
2. Full fine-tuning, float32, 4 × 256, one trainer after the other, maxpost with `remat_policy=dots`: ≥ 1.25× Tunix,
   and peak RSS ≤ 0.5× Tunix's, at the largest batch Tunix fits in 24 GiB.
3. Full fine-tuning at 4 × 512, maxpost alone (Tunix too with --tunix-4x512: on a 24 GiB machine it is OOM-killed,
   which costs minutes, and its peak RSS is then known only as a lower bound).

A figure is printed only from a run that completed; a run that failed prints why and its goal reads "not measured".
About 15 minutes on a 2-core EPYC (AVX-512), idle. The output file names carry the CPU kind, so that the results of
one machine kind are never overwritten by another's.
"""
from __future__ import annotations
import argparse, json, re, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sft_throughput import cpu_info, machine_kind

def run(args: list[str], out: Path, name: str) -> dict | None:
    "One sft_throughput.py call: its result dict (None when it failed), printout kept in out/name.txt."
    cmd = [sys.executable, str(HERE / "sft_throughput.py"), *args]
    print(f"$ python benchmarks/sft_throughput.py {' '.join(args)}", flush=True)
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    (out / f"{name}.txt").write_text(f"$ python benchmarks/sft_throughput.py {' '.join(args)}\n{r.stdout}\n{r.stderr[-4000:]}")
    m = re.search(r"^\{\n.*?^\}$", r.stdout, re.M | re.S)          # the indented JSON block
    if r.returncode or not m:
        print(f"  FAILED (exit {r.returncode}) after {time.time() - t:.0f} s; see {out / name}.txt", flush=True)
        return None
    res = json.loads(m.group(0))
    print("  " + r.stdout[m.end():].strip().replace("\n", "\n  ") + f"\n  ({time.time() - t:.0f} s)", flush=True)
    return res

def goals(lora: dict | None, full: dict | None, big: dict | None) -> list[tuple[str, str, str]]:
    "(goal, measured, verdict) rows."
    verdict = lambda ok: "met" if ok else "MISSED"
    rows = []
    if lora and "tunix" in lora:
        r = lora["ratio_maxpost_over_tunix"]
        rows.append(("LoRA SFT float32 >= 1.5x Tunix (2 x 256)",
                     f"{lora['maxpost']['tokens_per_s']:.1f} vs {lora['tunix']['tokens_per_s']:.1f} tok/s = {r:.2f}x "
                     f"(per round {lora['ratio_paired_median']:.2f}); max |loss diff| {lora['max_loss_diff']:.1e}",
                     verdict(r >= 1.5)))
        if "ratio_bf16mm_over_tunix" in lora:
            r = lora["ratio_bf16mm_over_tunix"]
            rows.append(("LoRA SFT bf16_matmuls >= 1.5x Tunix float32",
                         f"{r:.2f}x; max |loss diff| to float32 maxpost {lora['bf16mm_max_loss_diff']:.1e}", verdict(r >= 1.5)))
        m = lora["maxpost"]["mfu_6N"]
        rows.append(("MFU(6N) >= 0.7 (LoRA float32)", f"{m:.2f} of {lora['peak_flops'] / 1e9:.0f} GFLOP/s", verdict(m >= 0.7)))
    else: rows.append(("LoRA SFT >= 1.5x Tunix; MFU >= 0.7", "not measured (run failed)", "-"))
    if full and "tunix" in full:
        r, q = full["ratio_maxpost_over_tunix"], full["rss_ratio"]
        rows.append(("full FT >= 1.25x Tunix (4 x 256, remat dots)",
                     f"{full['maxpost']['tokens_per_s']:.1f} vs {full['tunix']['tokens_per_s']:.1f} tok/s = {r:.2f}x; "
                     f"max |loss diff| {full['max_loss_diff']:.1e}", verdict(r >= 1.25)))
        rows.append(("full FT peak RSS <= 0.5x Tunix (4 x 256)",
                     f"{full['maxpost']['peak_rss_gib']:.2f} vs {full['tunix']['peak_rss_gib']:.2f} GiB = {q:.2f}x", verdict(q <= 0.5)))
    else: rows.append(("full FT >= 1.25x Tunix, RSS <= 0.5x (4 x 256)", "not measured (run failed)", "-"))
    if big:
        m = big["maxpost"]["peak_rss_gib"]
        if "tunix" in big:
            q = big["rss_ratio"]
            rows.append(("full FT peak RSS <= 0.5x Tunix (4 x 512)", f"{m:.2f} vs {big['tunix']['peak_rss_gib']:.2f} GiB = {q:.2f}x "
                         f"({big['ratio_maxpost_over_tunix']:.2f}x Tunix's speed)", verdict(q <= 0.5)))
        elif "tunix" in big.get("failed", {}):
            lo = big["failed"]["tunix"]["vm_hwm_gib_before_last_step"]
            rows.append(("full FT peak RSS <= 0.5x Tunix (4 x 512)",
                         f"{m:.2f} GiB; Tunix failed ({big['failed']['tunix']['failed']}) after reaching {lo:.2f} GiB: "
                         f"ratio < {m / lo:.2f}", verdict(m / lo <= 0.5) if lo else "-"))
        else:
            rows.append(("full FT at 4 x 512 (maxpost alone)", f"{big['maxpost']['tokens_per_s']:.1f} tok/s, "
                         f"MFU(6N) {big['maxpost']['mfu_6N']:.2f}, peak RSS {m:.2f} GiB; Tunix not run", "-"))
    return rows

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(HERE / "results"), help="folder for the printouts and the JSON summary")
    ap.add_argument("--steps", type=int, default=7, help="timed steps of the LoRA run (at least 5)")
    ap.add_argument("--tunix-4x512", action="store_true", help="also run Tunix at 4 x 512 (OOM-killed on 24 GiB)")
    a = ap.parse_args()
    ci = cpu_info(); kind = machine_kind(ci)
    tag = re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_")
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    print(f"CPU {kind}; flags " + " ".join(f"{k}={'y' if v else 'n'}" for k, v in ci["isa"].items())
          + f"; {ci['mem_available_gib']} GiB available", flush=True)
    bf16 = ci["isa"]["avx512_bf16"] or ci["isa"]["amx_bf16"]
    lora = run(["--mode", "lora", "--steps", str(a.steps)] + (["--bf16-matmuls"] if bf16 else []), out, f"sft_goals_lora_{tag}")
    full = run(["--mode", "full", "--batch", "4", "--seq", "256", "--steps", "5", "--sequential", "--remat", "dots"],
               out, f"sft_goals_full_4x256_{tag}")
    big = run(["--mode", "full", "--batch", "4", "--seq", "512", "--steps", "5", "--sequential", "--remat", "dots"]
              + ([] if a.tunix_4x512 else ["--skip-tunix"]), out, f"sft_goals_full_4x512_{tag}")
    rows = goals(lora, full, big)
    w = max(len(g) for g, _, _ in rows)
    table = "\n".join(f"  {v:6s}  {g:{w}s}  {m}" for g, m, v in rows)
    print(f"\nIssue 17 goals on {kind}:\n{table}", flush=True)
    (out / f"sft_goals_{tag}.json").write_text(json.dumps(dict(kind=kind, cpu=ci, rows=rows), indent=1))

if __name__ == "__main__":
    main()
