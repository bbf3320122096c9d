"""Where the native sampler's decode time goes on an accelerator (issue 28, item 1): an XLA profile of one
`NativeEngine.generate` call, each device op's time charged to the op's HLO instruction (the trace events name their
module and op), summed by class and listed by op.

    python benchmarks/tpu_decode_profile.py --out $OUT 64 256                      # on the TPU host, Gemma 3 1B
    python benchmarks/tpu_decode_profile.py --decode-attention xla,pallas --samples 4 --out $OUT 256   # both attentions
    python benchmarks/tpu_decode_profile.py --model tiny-gemma3 --prompt 16 --new 16 --out /tmp/dp 8   # CPU dry run
    python benchmarks/tpu_decode_profile.py --model tiny-gemma3 --prompt 16 --new 16 --decode scan \
        --decode-attention xla,interpret --samples 2 --out /tmp/dp 8                  # CPU dry run of both attentions

For each row count (rows / `--samples` prompts × `--samples` samples each) and each `--decode-attention`
(`NativeEngine(decode_attention=…)`: auto, xla, pallas — the Pallas kernel of `maxpost.decode_attention` —, or
interpret, side by side in one run): the engine as `benchmarks/tpu.py`'s sampler item builds it (random bf16 weights, prompts of
`--prompt` tokens, `--new` new tokens, temperature 1), one call to compile, one traced call. HLO text comes from an
XLA dump of this process (`--xla_dump_to`), so every traced op is matched to its instruction, its `op_name`
metadata (the JAX source path) and its shape. Per decode step: device time by class, and the 25 costliest ops, with
the bytes the HBM bound charges a step (weights + the KV cache read) and the time they take at the nominal bandwidth.
Records: OUT/decode_profile.jsonl (one JSON line per row count and attention), OUT/decode_profile.log; with several
attentions, each record after the first has its draw (the untraced call's tokens and log-probs) compared with the
first's: `agreement_with_<first>` (the same seed and weights; bfloat16 rounding may flip a token, and then the rest).
"""
from __future__ import annotations
import argparse, collections, glob, json, os, re, shutil, sys, tempfile, time
from pathlib import Path

DUMP = tempfile.mkdtemp(prefix="decode_hlo_")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*generate.*").strip()

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

# class of a decode op: first match on its op_name (JAX source path) or its HLO text
CLASSES = [
    ("sampling", ("sample_tokens", "inverse_cdf", "truncate_logits", "logsumexp", "random_", "threefry", "argmax",
                  "cumsum", "sort")),
    ("head", ("...d,dv->...v", "logits")),
    ("attention", ("ukmh,", "ukmt,", "bkgh,", "bkgn,", "btkgh,", "bkgts,", "cached_attention", "attend", "softmax",
                   "reduce_max", "pallas_call", "decode_attention")),
    ("cache write", ("dynamic_update_slice", "scatter")),
]


def hlo_modules(d: str) -> dict[str, dict]:
    "module name → {instruction name → (op_name, instruction line + the body of the computation it calls)}"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tpu_speed import hlo_index
    out = {}
    for f in sorted(glob.glob(f"{d}/*after_optimizations.txt")):
        text = open(f).read()
        m = re.search(r"^HloModule\s+([\w.\-]+)", text, re.M)
        if m: out[m.group(1)] = hlo_index(text)
    return out


def op_class(op_name: str, body: str) -> str:
    c = next((c for c, keys in CLASSES if any(k in op_name for k in keys)), None)
    has_dot = re.search(r"\b(dot|convolution)\(", body)
    if c is None and has_dot: c = "weights matmul"
    if c is None:
        if "custom-call" in body: c = "kernel"
        elif re.search(r"\b(copy|transpose)\(", body.split("\n")[0]) or " copy(" in body: c = "copy/transpose"
        elif re.search(r"all-reduce|all-gather|reduce-scatter|collective", body): c = "collective"
        else: c = "elementwise/other"
    return c


def events(d: str) -> list[dict]:
    import gzip
    files = glob.glob(f"{d}/**/*perfetto_trace.json.gz", recursive=True) + glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)
    if not files: raise FileNotFoundError(f"no trace under {d}")
    ev = json.load(gzip.open(files[0]))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    return [e for e in ev if e.get("ph") == "X" and "name" in e]


def shape_of(body: str) -> str:
    m = re.match(r"\s*(?:ROOT\s+)?%?[\w.\-]+ = ([^ ]+(?: [^ ]+)?) ", body)
    return m.group(1)[:80] if m else ""


def profile_rows(b, rows: int, prompt: int, new: int, log, attention: str = "auto", samples: int = 1,
                 decode: str = "auto") -> dict:
    import jax, jax.numpy as jnp
    import dataclasses
    from maxpost.checkpoint import empty_decoder
    from maxpost.engine import SamplingParams
    from maxpost.generate import NativeEngine
    m = b["mcfg"]
    for f in glob.glob(f"{DUMP}/*"):                 # this program's HLO only (every variant's module has one name)
        shutil.rmtree(f) if os.path.isdir(f) else os.remove(f)
    eng = NativeEngine(empty_decoder(m, jnp.bfloat16, jnp.bfloat16), None, max_batch=rows, max_prefill=prompt,
                       max_len=prompt + new, stop_token_ids=(), decode=decode, decode_attention=attention)
    eng.sync_weights({k: jnp.asarray(v) for k, v in b["base"].items()})
    ids = np.random.default_rng(0).integers(10, m.vocab_size, (rows // samples, prompt)).tolist()
    sp = SamplingParams(temperature=1.0, max_tokens=new, n=samples, seed=0, stop_token_ids=())
    t0 = time.perf_counter(); eng.generate(ids, sp); first = time.perf_counter() - t0
    out = eng.generate(ids, dataclasses.replace(sp, seed=2)); plain = dict(eng.stats)
    drawn = [(r.token_ids, np.asarray(r.logprobs, np.float64)) for r in out]   # compared across attentions in main
    d = tempfile.mkdtemp(prefix="decode_trace_")
    t0 = time.perf_counter()
    with jax.profiler.trace(d, create_perfetto_trace=True):
        eng.generate(ids, dataclasses.replace(sp, seed=1))
    wall = time.perf_counter() - t0
    steps = int(sum(eng.stats["steps"]))
    mods = hlo_modules(DUMP)
    container = re.compile(r"\b(while|conditional|call|async-start|async-done)\(")
    by, per_op, spans, unmatched, n = collections.Counter(), collections.defaultdict(lambda: [0.0, 0, "", "", ""]), [], 0, 0
    for e in events(d):
        a = e.get("args") or {}
        mod, op = a.get("hlo_module"), a.get("hlo_op") or e["name"]
        idx = mods.get(mod) if mod else None
        if idx is None:
            cands = [mm for mm in mods.values() if op in mm]
            idx = cands[0] if len(cands) == 1 else None
        if idx is None or op not in idx:
            if mod: unmatched += 1
            continue
        op_name, body = idx[op]
        if container.search(body.split("\n")[0]): continue
        us = float(e.get("dur", 0)); ts = float(e.get("ts", 0))
        n += 1; spans.append((ts, ts + us))
        r = per_op[(mod, op)]; r[0] += us; r[1] += 1; r[2] = op_class(op_name, body); r[3] = op_name[-110:]
        r[4] = shape_of(body)
    for v in per_op.values():      # an op of the decode loop runs once per step (or per layer and step), others once
        by[v[2] + ("" if v[1] >= max(steps - 1, 2) else " (prefill/outside the loop)")] += v[0]
    busy, end = 0.0, -1.0
    for a_, b_ in sorted(spans):
        if b_ > end: busy += b_ - max(a_, end); end = b_
    kv_tok = m.num_layers * 2 * m.num_kv_heads * m.head_dim * 2
    step_bytes = m.num_params() * 2 + (rows // samples * prompt + rows * (new - 1) / 2) * kv_tok   # prompt once
    loop_us = sum(v for k, v in by.items() if "outside" not in k)
    steps = max(steps, 1)
    rec = {"model": b["model"], "rows": rows, "samples": samples, "decode": decode, "decode_attention": attention, "prompt": prompt,
           "new_tokens": new, "decode_steps": steps,
           "first_call_s": round(first, 2), "untraced_call_s": round(plain["seconds"], 4),
           "untraced_tokens_per_s": round(plain["tokens_per_s"], 1), "traced_call_s": round(wall, 4),
           "device_busy_s": round(busy / 1e6, 4), "ops_traced": n, "events_unmatched": unmatched,
           "loop_device_ms_per_step": round(loop_us / 1e3 / max(steps, 1), 4),
           "by_class_ms_per_step": {k: round(v / 1e3 / max(steps, 1), 4) for k, v in by.most_common()},
           "bound_bytes_per_step_gb": round(step_bytes / 1e9, 4),
           "bound_ms_per_step_at_819gbps": round(step_bytes / 819e9 * 1e3, 4),
           "top_ops": [{"module": k[0], "op": k[1], "class": v[2], "ms_per_step": round(v[0] / 1e3 / max(steps, 1), 4),
                        "count": v[1], "shape": v[4], "op_name": v[3]}
                       for k, v in sorted(per_op.items(), key=lambda kv: -kv[1][0])[:25]]}
    log(json.dumps(rec))
    del eng
    jax.clear_caches()
    rec["_drawn"] = drawn
    return rec


def agreement(a: list, b: list) -> dict:
    "Two variants' draws (same prompts, seed): the share of rows with the same tokens, and of same first tokens."
    same = [x[0] == y[0] for x, y in zip(a, b)]
    first = [x[0][:1] == y[0][:1] for x, y in zip(a, b)]
    d = [abs(x[1][0] - y[1][0]) for x, y in zip(a, b) if x[0][:1] == y[0][:1] and len(x[1]) and len(y[1])]
    return {"rows_same_tokens": round(float(np.mean(same)), 4), "rows_same_first_token": round(float(np.mean(first)), 4),
            "max_abs_diff_first_logprob": round(float(max(d)), 6) if d else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-1b")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--decode", default="auto", help="NativeEngine(decode=…): auto, scan, unrolled (a CPU dry run of "
                    "the attentions needs scan: auto runs the unrolled program on a CPU)")
    ap.add_argument("--samples", type=int, default=1, help="samples per prompt (rows / samples prompts)")
    ap.add_argument("--decode-attention", default="auto", help="comma list, each run in turn: auto, xla, pallas, interpret")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("rows", nargs="+", type=int)
    a = ap.parse_args()
    atts = a.decode_attention.split(",")
    bad = sorted(set(atts) - {"auto", "xla", "pallas", "interpret"})
    if bad: ap.error(f"--decode-attention: unknown {bad[0]!r}; one or more of auto, xla, pallas, interpret")
    if a.samples < 1 or any(r % a.samples for r in a.rows): ap.error(f"--samples {a.samples}: must divide every row count")
    os.makedirs(a.out, exist_ok=True)
    logf = open(f"{a.out}/decode_profile.log", "a")
    def log(s):
        print(s, flush=True); logf.write(s + "\n"); logf.flush()
    import jax
    from tpu_items import model_config, random_base
    log(f"device {jax.devices()[0].device_kind}; jax {jax.__version__}; dump {DUMP}")
    mcfg = model_config(a.model)
    t0 = time.perf_counter(); base = random_base(mcfg); log(f"weights {time.perf_counter() - t0:.1f} s")
    b = {"model": a.model, "mcfg": mcfg, "base": base}
    with open(f"{a.out}/decode_profile.jsonl", "a") as f:
        for r in a.rows:
            first = None
            for att in atts:
                rec = profile_rows(b, r, a.prompt, a.new, log, att, a.samples, a.decode)
                drawn = rec.pop("_drawn")
                if first is None: first = (att, drawn)
                else:
                    rec[f"agreement_with_{first[0]}"] = agreement(first[1], drawn)
                    log(f"rows {r}, {att} against {first[0]}: {rec[f'agreement_with_{first[0]}']}")
                f.write(json.dumps(rec) + "\n"); f.flush()
                top = "\n".join(f"  {o['ms_per_step']:8.4f} ms  {o['class']:<16} {o['shape']:<40} {o['op_name']}" for o in rec["top_ops"][:15])
                log(f"rows {r} ({a.samples} per prompt), {att} attention: {rec['loop_device_ms_per_step']} ms/step device in "
                    f"the loop, bound {rec['bound_ms_per_step_at_819gbps']} ms; by class {rec['by_class_ms_per_step']}\n{top}")


if __name__ == "__main__":
    main()
