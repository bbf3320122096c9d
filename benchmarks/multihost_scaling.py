"""Weak scaling of SFT over processes on this CPU: the same per-process batch on 1 process and on 2 processes
(`maxpost.launch`, gloo collectives over localhost), step time 2 ÷ 1, and the share of the 2-process step spent in the
cross-process all-reduce of the gradients (timed alone on the same mesh).

    python benchmarks/multihost_scaling.py [--devices_per_process 2] [--steps 12] [--rounds 2] [--model tiny-gemma3]

Runs alternate (1, 2, 1, 2, …) so that load from other jobs hits both alike; medians over steps after the first
(which compiles). Prints one JSON line."""
import argparse, json, os, re, subprocess, sys, tempfile
from pathlib import Path
import numpy as np

ROOT = Path(__file__).resolve().parents[1]

ALLREDUCE = r"""
import json, sys, time, numpy as np, jax, jax.numpy as jnp
from maxpost.distributed import initialize, DistributedKeys
initialize(DistributedKeys())
from jax.sharding import NamedSharding, PartitionSpec as P
from maxpost.model import model_config
from maxpost.model import param_shapes
from maxpost.sharding import make_mesh
mesh = make_mesh()
n = sum(int(np.prod(s)) for s in param_shapes(model_config(sys.argv[1])).values())
f = mesh.shape["fsdp"]; n = -(-n // f) * f
# each process holds its own gradient, split over its fsdp devices: [data, n], summed over the data (process) axis
g = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data", "fsdp")), np.ones((1, n), np.float32), (mesh.shape["data"], n))
red = jax.jit(lambda x: jnp.sum(x, axis=0), out_shardings=NamedSharding(mesh, P("fsdp")))
red(g).block_until_ready(); ts = []
for _ in range(30):
    t = time.perf_counter(); red(g).block_until_ready(); ts.append(time.perf_counter() - t)
if jax.process_index() == 0: print("ALLREDUCE", json.dumps({"params": n, "seconds": float(np.median(ts))}))
"""

def step_times(run_dir: Path) -> list[float]:
    m = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return [r["step_time"] for r in m[1:]]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices_per_process", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="tiny-gemma3")
    ap.add_argument("--per_device_batch_size", type=int, default=4)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="multihost_"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))     # no compilation cache: every run compiles its own step
    args = [f"model_name={a.model}", "enable_tqdm=false", "save_model=false", "enable_checkpointing=false",
            "eval_interval=0", f"steps={a.steps}", f"per_device_batch_size={a.per_device_batch_size}",
            f"base_output_directory={tmp}"]
    launch = lambda n, *rest: [sys.executable, "-m", "maxpost.launch", f"--num_processes={n}",
                               f"--devices_per_process={a.devices_per_process}", "--", *rest]
    times = {1: [], 2: []}
    for r in range(a.rounds):
        for n in (1, 2):
            cmd = launch(n, sys.executable, "-m", "maxpost.train_sft", *args, f"run_name=p{n}_r{r}")
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            if p.returncode: sys.exit(p.stdout[-3000:])
            times[n] += step_times(tmp / f"p{n}_r{r}")
    p = subprocess.run(launch(2, sys.executable, "-c", ALLREDUCE, a.model), capture_output=True, text=True, env=env,
                       cwd=ROOT)
    if p.returncode: sys.exit(p.stdout[-3000:])
    ar = json.loads(re.search(r"ALLREDUCE (\{[^}]*\})", p.stdout).group(1))   # other output may share the line
    t1, t2 = float(np.median(times[1])), float(np.median(times[2]))
    print(json.dumps({"model": a.model, "devices_per_process": a.devices_per_process,
                      "per_process_batch": a.per_device_batch_size * a.devices_per_process,
                      "step_s_1proc": t1, "step_s_2proc": t2, "ratio_2_over_1": t2 / t1,
                      "allreduce_s": ar["seconds"], "allreduce_params": ar["params"],
                      "allreduce_share_of_2proc_step": ar["seconds"] / t2, "steps_timed": [len(times[1]), len(times[2])]}))

if __name__ == "__main__": main()
