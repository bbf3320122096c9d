"""What `jax_cache_dir` saves: one training command run three times, side by side in one process tree:
without a cache (`jax_cache_dir=""`), with an empty cache folder (it compiles and writes), and again with that
folder (it reads). Wall time of each process, and the first step's time from its metrics.jsonl (the step that
compiles the training program), as ratios to the run without a cache.

    python benchmarks/compile_cache.py [--rounds 2] [--command train_sft] [-- key=value …]

The default command is LoRA SFT of SmolLM2-135M-Instruct (the embedded model, `make models`) on the arithmetic task,
4 steps of 2 × 256 tokens, with the held-out evaluation at the end. Keys after `--` are added to it (on a TPU:
`-- model_name=gemma3-1b load_parameters_path=… scan_layers=false`). Rounds repeat the three runs in the same order,
each round with a fresh folder; medians over rounds. JAX_COMPILATION_CACHE_DIR is removed from the runs' environment,
and JAX writes only programs that took at least 1 s to compile (its default), as in a user's run. Prints a table and
one JSON line."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from sft_throughput import cpu_info, machine_kind

def default_args(extra: list[str]) -> list[str]:
    "The default command's keys; the embedded model only when `extra` names no checkpoint of its own."
    from maxpost.convert.from_gguf import embedded_hf
    own = any(a.startswith("load_parameters_path=") for a in extra)
    return ([] if own else [f"load_parameters_path={embedded_hf('smollm2-135m')}"]) + ["model_name=smollm2-135m", "dataset_type=arithmetic",
            "steps=4", "per_device_batch_size=2", "max_target_length=256", "use_lora=true", "eval_interval=4",
            "num_eval_rows=8", "enable_checkpointing=false", "save_model=false"]

def run(command: str, args: list[str], out: Path, name: str, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    cmd = [sys.executable, "-m", f"maxpost.{command}", *args, f"base_output_directory={out}", f"run_name={name}",
           f"jax_cache_dir={cache}"]
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode: sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    recs = [json.loads(l) for l in (out / name / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = [x for x in recs if "step_time" in x]
    return {"wall": wall, "first_step": steps[0]["step_time"],
            "files": sum(1 for _ in Path(cache).iterdir()) if cache else 0}

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--command", default="train_sft")
    ap.add_argument("extra", nargs="*", help="key=value added to the command (after --)")
    a = ap.parse_args()
    args = (default_args(a.extra) if a.command == "train_sft" else []) + a.extra
    print(f"machine: {machine_kind(cpu_info())}", flush=True)
    rows = {"none": [], "cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            cache = Path(tmp) / f"cache{r}"; cache.mkdir()
            for kind, folder in (("none", ""), ("cold", str(cache)), ("warm", str(cache))):
                rec = run(a.command, args, Path(tmp) / "runs", f"{kind}{r}", folder)
                rows[kind].append(rec)
                print(f"round {r} {kind:4s}: wall {rec['wall']:6.1f} s, first step {rec['first_step']:6.2f} s, "
                      f"cache files {rec['files']}", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("wall", "first_step")} for k, v in rows.items()}
    out = {"command": a.command, "args": args, "rounds": a.rounds, "median": med,
           "wall_ratio": {k: med[k]["wall"] / med["none"]["wall"] for k in ("cold", "warm")},
           "first_step_ratio": {k: med[k]["first_step"] / med["none"]["first_step"] for k in ("cold", "warm")}}
    print("| run | wall (median) | ÷ no cache | first step | ÷ no cache |\n|---|---|---|---|---|")
    for k in rows:
        print(f"| {k} | {med[k]['wall']:.1f} s | {med[k]['wall'] / med['none']['wall']:.3f} | "
              f"{med[k]['first_step']:.2f} s | {med[k]['first_step'] / med['none']['first_step']:.3f} |")
    print(json.dumps(out))

if __name__ == "__main__":
    main()
