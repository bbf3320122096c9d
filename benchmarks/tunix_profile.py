"""Where Tunix 0.1.7's PeftTrainer step spends the device's time, op by op, as `tpu_speed.profile` shows it for
maxpost's step: the step that `benchmarks/tunix_hlo.py` builds (PeftTrainer's own `_train_step`, maxpost's optimizer
over Tunix's tree), here on this process's devices with Tunix's random bfloat16 weights and random tokens, compiled,
warmed up, then `--steps` steps traced; its op time by class and its slowest ops, in tpu_speed's format.

    python benchmarks/tunix_profile.py --out $OUT [--model gemma3-1b] [--mode full] [--batch 2] [--seq 1024]
    python benchmarks/tunix_profile.py --out /tmp/tp --model tiny-gemma3-all-sliding --seq 64     # CPU dry run

Writes OUT/tunix_profile.jsonl (one JSON line) and prints it.
"""
import argparse, json, os, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tunix_hlo                              # first: maxpost.aot puts libtpu on the path before jax is imported
import tpu_speed


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--model", default="gemma3-1b"); ap.add_argument("--mode", default="full", choices=["full", "lora"])
    ap.add_argument("--batch", type=int, default=2); ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3); ap.add_argument("--top", type=int, default=60)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    f, args = tunix_hlo.build(a.model, a.mode, a.batch, a.seq, None)
    comp = f.lower(*args).compile()
    rec = {"what": f"tunix profile {a.model} {a.mode} B={a.batch} T={a.seq}", "build_compile_s": round(time.perf_counter() - t0, 1)}
    idx = tpu_speed.hlo_index(comp.as_text())
    state, toks, mask = args
    for _ in range(2): state, loss, _ = comp(state, toks, mask); float(loss)
    box = [state]
    def run():
        for _ in range(a.steps): box[0], loss, _ = comp(box[0], toks, mask)
        float(loss)
    rec |= {"loss": float(loss), **tpu_speed.traced(run, idx, a.steps, a.top)}
    os.makedirs(a.out, exist_ok=True)
    with open(Path(a.out) / "tunix_profile.jsonl", "a") as fh: fh.write(json.dumps(rec) + "\n")
    print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
