"""Issue 28 on a chip: maxpost's SFT step against Tunix 0.1.7's at the same shapes, in one process, with XLA's attention
and with the splash kernel (`MAXPOST_ATTENTION=splash`), and where the step's device time goes: an XLA profile of
the compiled step, each op's time summed by class (projections, LoRA, attention, head and loss, optimizer, copies,
other), forward / backward / recomputed, and the host's share (wall time minus device busy time).

    python benchmarks/tpu_speed.py --probe-dir .tpu --out $OUT lora:2:1024:none lora:16:1024:full full:8:1024:full
    python benchmarks/tpu_speed.py --probe-dir ../shared/tpu --model tiny-gemma3 --no-tunix lora:2:64:none   # CPU dry run

Config: mode:B:T:remat, mode one of full, lora, lora-int8, lora-nf4 (QLoRA: the frozen base stored quantized,
`lora_weight_qtype`; no splash, Tunix or profile for those). For each: maxpost with XLA attention, maxpost with splash (TPU only), then Tunix (remat
`none` configs only: Tunix's PeftTrainer runs without remat there) and a profile of each maxpost variant. maxpost runs
as `../shared/tpu/sft_sweep.py`'s `run_config` builds it (SFTTrainer, bfloat16 weights and compute, LoRA rank 16 on
the five projections); Tunix as its `sft_vs_tunix.py` does. Every record is a JSON line in OUT/tpu_speed.jsonl.
"""
from __future__ import annotations
import argparse, collections, gc, glob, gzip, json, os, re, statistics, sys, tempfile, time

import numpy as np

t_start = time.perf_counter()

# op_name fragments (the einsum specs of maxpost.model / matmul / head_loss / lora) → class
CLASSES = [
    ("attention", ("btkgh,bskh", "bkgts,bskh", "softmax", "splash", "pallas", "flash", "mosaic")),
    ("head+loss", ("cd,vd", "cv,cd", "cv,vd", "nd,nd", "...d,dv", "head_loss", "log_softmax", "logsumexp")),
    ("lora", ("ni,nr", "nr,no", "lir,lro", "ir,ro", ",r->", "r,r")),
    ("optimizer", ("adam", "optax", "clip", "global_norm", "apply_updates", "scale_by")),
    ("projection", ("ni,no", "no,io", "btd,dnh", "btnh,nhd", "dot_general", "einsum", "matmul")),
]


def op_class(inst: str, op_name: str, body: str) -> str:
    """Class of one HLO instruction from its op_name metadata and its text, `body` including the computation a
    fusion calls: a fusion that holds a dot or convolution is a matmul, whatever its root op's name says."""
    c = next((c for c, keys in CLASSES if any(k in op_name for k in keys)), None)
    if re.search(r"\b(dot|convolution)\(", body) and c not in ("attention", "head+loss", "lora"):
        c = "projection"
    if c is None:
        if "custom-call" in body or "custom_call" in body: c = "attention"      # a Mosaic kernel is the only one here
        elif inst.startswith(("copy", "transpose")) or " copy(" in body: c = "copy/transpose"
        elif re.search(r"all-reduce|all-gather|reduce-scatter|collective", body): c = "collective"
        else: c = "elementwise/other"
    phase = ("recompute" if "rematted_computation" in op_name else
             "bwd" if "transpose(" in op_name else "fwd")
    return f"{c} {phase}"


def hlo_index(text: str) -> dict:
    "instruction name → (op_name, the instruction's line plus the body of the computation it calls) of a module's text"
    comps, cur, lines = {}, None, []
    for line in text.splitlines():
        m = re.match(r"\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and "=" not in line.split("{")[0]: cur, lines = m.group(1), []; comps[cur] = lines; continue
        if cur is not None: lines.append(line)
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+) = ", line)
        if not m: continue
        op = re.search(r'op_name="([^"]*)"', line)
        called = re.search(r"calls=%?([\w.\-]+)", line)
        body = line + ("\n" + "\n".join(comps.get(called.group(1), [])) if called else "")
        out[m.group(1)] = (op.group(1) if op else "", body)
    return out


def trace_ops(d: str) -> list[tuple[str, float, float]]:
    "(name, start, microseconds) of every complete event in the profile written under d (perfetto or trace.json)."
    files = glob.glob(f"{d}/**/*perfetto_trace.json.gz", recursive=True) + glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)
    if not files: raise FileNotFoundError(f"no trace json under {d}: {glob.glob(f'{d}/**/*', recursive=True)[:10]}")
    ev = json.load(gzip.open(files[0]))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    return [(e["name"], float(e.get("ts", 0)), float(e.get("dur", 0))) for e in ev if e.get("ph") == "X" and "name" in e]


def traced(run, idx: dict, steps: int, n_top: int = 30) -> dict:
    """Profile `run()` (which runs `steps` steps of the compiled program whose `hlo_index` is idx and waits for them):
    wall and device-busy time per step, op time by class, and the `n_top` slowest ops per step."""
    import jax
    d = tempfile.mkdtemp()
    t0 = time.perf_counter()
    with jax.profiler.trace(d, create_perfetto_trace=True): run()
    wall = (time.perf_counter() - t0) / steps
    by, n_ops, spans, per_op = collections.Counter(), 0, [], collections.Counter()
    container = re.compile(r"\b(while|conditional|call|async-start|async-done)\(")
    for name, ts, us in trace_ops(d):
        if name not in idx or container.search(idx[name][1]): continue     # a loop's event spans its body's ops
        by[op_class(name, *idx[name])] += us / 1e6 / steps; n_ops += 1; spans.append((ts, ts + us))
        per_op[name] += us / 1e3 / steps
    shape = lambda body: (re.match(r"\s*(?:ROOT\s+)?%?[\w.\-]+ = ([^ ]+)", body) or [None, ""])[1][:60]
    top = [{"op": k, "class": op_class(k, *idx[k]), "ms_per_step": round(v, 4), "shape": shape(idx[k][1]),
            "op_name": idx[k][0][-120:]} for k, v in per_op.most_common(n_top)]
    busy, end = 0.0, -1.0                                                  # the union of the ops' intervals
    for a, b in sorted(spans):
        if b > end: busy += b - max(a, end); end = b
    busy = busy / 1e6 / steps
    return {"profile_wall_step_s": round(wall, 4), "device_busy_s": round(busy, 4),
            "host_or_idle_share": round(1 - busy / wall, 3) if wall else None, "ops_traced": n_ops,
            "by_class_s": {k: round(v, 4) for k, v in by.most_common()},
            "by_class_share": {k: round(v / busy, 3) for k, v in by.most_common()} if busy else {}, "top_ops": top}


def profile(mcfg, base, model, mode, B, T, remat, steps, tag, sft_batch, lora_targets, n_top=30):
    "Trace `steps` steps of the compiled step after a warm-up; op time by class, per step."
    import jax
    from maxpost.sft import SFTConfig, SFTTrainer
    cfg = SFTConfig(model_name=model, use_lora=mode == "lora", lora_rank=16, lora_alpha=32.0,
                    lora_module_path=lora_targets, learning_rate=1e-4, warmup_steps_fraction=0.0, steps=100,
                    per_device_batch_size=B, max_target_length=T, dtype="bfloat16", weight_dtype="bfloat16",
                    remat_policy=remat)
    tr = SFTTrainer(cfg, mcfg, base); st = tr.init_state(); db = tr.put_batch(sft_batch(B, T, mcfg.vocab_size))
    comp = tr._step.lower(st, tr.frozen, db).compile()
    idx = hlo_index(comp.as_text())
    for _ in range(2): st, m = comp(st, tr.frozen, db); float(m["loss"])
    state = [st]
    def run():
        for _ in range(steps): state[0], m = comp(state[0], tr.frozen, db)
        float(m["loss"])
    rec = {"tag": tag, "attention": os.environ.get("MAXPOST_ATTENTION", "xla"), "variant": os.environ.get("MAXPOST_VARIANT", ""), **traced(run, idx, steps, n_top)}
    del st, state, db, comp, tr
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe-dir", default="../shared/tpu", help="folder of sft_sweep.py / sft_vs_tunix.py")
    ap.add_argument("--model", default="gemma3-1b")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--budget", type=float, default=520.0, help="no new run after this many seconds")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--no-tunix", action="store_true")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--device-params", action="store_true",
                    help="draw the random weights with the Decoder's init on the device (Gemma 3 1B: 115 s on a v5e "
                         "host, against about 25 s for the numpy draw)")
    ap.add_argument("--attention", default="xla,splash",
                    help="maxpost's variants to run on a TPU; a suffix of '+'-joined tags: kept (xla-kept) runs a "
                         "trained head's second pass with kept tiles, as on a CPU (maxpost.head_loss._fused's "
                         "outer=False); unroll (xla-unroll) runs with scan_layers=false")
    ap.add_argument("--top", type=int, default=30, help="the profile's slowest ops kept in its record")
    ap.add_argument("configs", nargs="+", help="mode:B:T:remat")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True); os.environ["OUT"] = a.out
    sys.path.insert(0, os.path.abspath(a.probe_dir))
    import jax
    from probe_common import device_random_params, hbm, log, matmul_peak, sft_batch, short_err
    from sft_sweep import LORA_TARGETS, run_config
    from maxpost.model import model_config, tpu_lowering
    import maxpost.head_loss as head_loss
    import maxpost.sft
    sft_config = maxpost.sft.SFTConfig
    tpu = jax.default_backend() == "tpu"
    log("tpu_speed", {"event": "start", "devices": str(jax.devices()), "jax": jax.__version__,
                      "import_s": round(time.perf_counter() - t_start, 1)})
    peak = matmul_peak(); log("tpu_speed", {"event": "peak", "bf16_matmul_tflops": round(peak / 1e12, 1)})
    mcfg = model_config(a.model); N = mcfg.num_params()
    if not a.device_params:
        import ml_dtypes
        from maxpost.model import random_params
        base = {k: v.astype(ml_dtypes.bfloat16) for k, v in random_params(mcfg, 0).items()}
    else: base = device_random_params(mcfg, "bfloat16")
    log("tpu_speed", {"event": "weights drawn", "on_device": a.device_params})
    left = lambda: a.budget - (time.perf_counter() - t_start)

    def attempt(what, fn):
        if left() < 0: log("tpu_speed", {"event": "skipped (budget)", "what": what}); return None
        t0 = time.perf_counter()
        try: rec = fn()
        except Exception as e:  # noqa: BLE001
            import traceback; traceback.print_exc(); rec = {"error": short_err(e, 1500), "hbm": hbm()}
        rec |= {"what": what, "wall_s": round(time.perf_counter() - t0, 1)}
        gc.collect(); log("tpu_speed", rec); return rec

    for c in a.configs:
        mode, B, T, remat = c.split(":"); B, T = int(B), int(T)
        mode, _, qtype = mode.partition("-")
        res = {}
        if qtype:                                   # QLoRA: the same run with the base quantized, XLA attention only
            orig = maxpost.sft.SFTConfig
            maxpost.sft.SFTConfig = lambda **kw: orig(**kw, lora_weight_qtype=qtype)
            try:
                res["xla"] = attempt(f"maxpost-xla {c}", lambda: run_config(mcfg, base, a.model, mode, B, T, remat,
                                                                             a.steps, peak, "bfloat16", c))
            finally: maxpost.sft.SFTConfig = orig
            continue
        for att in [v for v in a.attention.split(",") if tpu or not v.startswith("splash")]:
            kind, _, variant = att.partition("-")   # "-kept": the trained head's second pass as on a CPU
            tags = set(variant.split("+")) - {""}   # "+"-joined: kept, unroll (scan_layers=false)
            if kind == "splash": os.environ["MAXPOST_ATTENTION"] = "splash"
            else: os.environ.pop("MAXPOST_ATTENTION", None)
            head_loss.tpu_lowering = (lambda: False) if "kept" in tags else tpu_lowering
            maxpost.sft.SFTConfig = (lambda **kw: sft_config(**kw, scan_layers=False)) if "unroll" in tags else sft_config
            os.environ["MAXPOST_VARIANT"] = att
            res[att] = attempt(f"maxpost-{att} {c}", lambda: run_config(mcfg, base, a.model, mode, B, T, remat, a.steps,
                                                                         peak, "bfloat16", c))
            if not a.no_profile:
                attempt(f"profile maxpost-{att} {c}", lambda: profile(mcfg, base, a.model, mode, B, T, remat, 3, c,
                                                                       sft_batch, LORA_TARGETS, a.top))
        os.environ.pop("MAXPOST_ATTENTION", None); head_loss.tpu_lowering = tpu_lowering
        maxpost.sft.SFTConfig = sft_config
        if remat == "none" and not a.no_tunix:
            from sft_vs_tunix import run_tunix
            res["tunix"] = attempt(f"tunix {c}", lambda: run_tunix(a.model, mode, B, T, a.steps, peak, N, c))
        tps = {k: r["tokens_per_s"] for k, r in res.items() if r and "tokens_per_s" in r}
        if "tunix" in tps:
            log("tpu_speed", {"event": "ratio", "config": c,
                              **{f"maxpost_{k}_over_tunix": round(v / tps["tunix"], 3) for k, v in tps.items() if k != "tunix"}})
        if "splash" in tps and "xla" in tps:
            log("tpu_speed", {"event": "ratio", "config": c, "splash_over_xla": round(tps["splash"] / tps["xla"], 3)})
        for k in tps:
            if k.startswith("xla-") and "xla" in tps and k != "xla-kept":
                log("tpu_speed", {"event": "ratio", "config": c, f"{k}_over_xla": round(tps[k] / tps["xla"], 3)})
        if "xla-kept" in tps and "xla" in tps:
            log("tpu_speed", {"event": "ratio", "config": c, "xla_over_xla_kept": round(tps["xla"] / tps["xla-kept"], 3)})
    log("tpu_speed", {"event": "end", "total_s": round(time.perf_counter() - t_start, 1), "hbm": hbm()})


if __name__ == "__main__":
    main()
