"""One benchmark command for an accelerator: maxpost against Tunix 0.1.7 side by side, the native sampler against its
HBM bound, and one GRPO step split into its parts, in one process, within a time budget.

    python benchmarks/tpu.py --out $OUT                       # on the chip (after .tpu/setup.sh's installs)
    python benchmarks/tpu.py --write-results --from-jsonl OUT/tpu.jsonl   # later, here: rows into RESULTS_tpu.md
    python benchmarks/tpu.py --model tiny-gemma3 --llama tiny-llama --B 2 --T 32 --T2 64 --sampler 4,8:8:8 \
        --grpo 2:4:8:8 --dpo 2:16:16 --steps 2 --out /tmp/tpu_dry [--no-tunix]        # CPU dry run

It prints the device kind and the jax / jaxlib / libtpu versions, measures the bf16 matmul peak and the HBM bandwidth
(an elementwise pass), draws random weights once (bfloat16, on the device), then runs its items in this order,
checking the budget before each part and printing `skipped: budget` for what it cannot start:
1. SFT LoRA (rank 16 on q, o, gate, up, down) at B × T: maxpost, then Tunix's PeftTrainer on the same weights, batch,
   LoRA A and optimizer; speed ratio and step-1 losses.  2. the native sampler at each row count (prompt + new
   tokens): tokens/s against the HBM bound (`--decode-attention xla,pallas`: each row count with both attentions).  3. one GRPO step (LoRA) split into rollout, reference log-probs, update,
   sync.  4. DPO (LoRA, pairs of prompt + response) against Tunix's DPOTrainer, then maxpost's one-row-per-pair
   layout (`dpo.share_prompt`) against its two-row step (skipped where the model's sliding window is shorter than
   the shared row).  5. full fine-tuning against Tunix.
6. SFT LoRA at T2 (maxpost).  7. SFT LoRA of `--llama` (maxpost; Tunix's Llama is not compared).  8. `dpo_llama`:
   item 4 on `--llama` without Tunix (no sliding window: the shared layout at the `--dpo` shape).
Each part is estimated (on a TPU) before it starts: a Tunix part 200 s (it compiles twice), a maxpost part 40 s.
Output: one JSON line per measurement in OUT/tpu.jsonl, the readable log in OUT/tpu.log, and the markdown section
in OUT/tpu_results.md; `--write-results` appends it to benchmarks/RESULTS_tpu.md (`write_results`).
"""
from __future__ import annotations
import argparse, datetime, gc, json, os, sys, time, traceback
from pathlib import Path

t_start = time.perf_counter()
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RESULTS = HERE / "RESULTS_tpu.md"
ITEMS = ["sft_lora", "sampler", "grpo", "dpo", "sft_full", "sft_lora_t2", "llama", "dpo_llama", "profile"]   # profile: opt-in
# dpo_llama: the dpo item on the --llama model (no sliding window: its shared layout runs at any length), no Tunix


def short(e: BaseException, n: int = 400) -> str:
    s = f"{type(e).__name__}: {e}".replace("\n", " ")
    return s if len(s) <= n else s[:n // 2] + " … " + s[-n // 2:]


class Bench:
    "The run's shared state: model, weights, peak, budget, and the record log."
    def __init__(self, a):
        self.a, self.model, self.steps, self.tunix = a, a.model, a.steps, not a.no_tunix
        os.makedirs(a.out, exist_ok=True)
        self.jsonl, self.log_f = Path(a.out) / "tpu.jsonl", open(Path(a.out) / "tpu.log", "a")
        self.records, self._hf, self._bw, self.peak, self.on_tpu = [], None, None, None, False

    def say(self, line: str):
        print(line, flush=True); self.log_f.write(line + "\n"); self.log_f.flush()

    def record(self, rec: dict) -> dict:
        rec = {"run": self.run, "device_kind": self.kind, **rec, "t_s": round(time.perf_counter() - t_start, 1)}
        self.records.append(rec)
        with open(self.jsonl, "a") as f: f.write(json.dumps(rec, default=str) + "\n")
        from tpu_results import rows             # the log's line: the record's markdown row, else its fields
        row = rows([rec])
        self.say(row[0] if row else f"{rec['what']}: " + ", ".join(
            f"{k}={v}" for k, v in rec.items() if k not in ("run", "device_kind", "what", "argv")))
        return rec

    def left(self) -> float: return self.a.budget - (time.perf_counter() - t_start)

    def attempt(self, what: str, need: float, fn) -> dict | None:
        "Run part `what` if the budget leaves `need` seconds (on a TPU; elsewhere any time left); record its result."
        if self.left() < (need if self.on_tpu else 0):
            self.record({"what": what, "event": "skipped", "why": "budget", "left_s": round(self.left(), 1)})
            self.say(f"skipped: budget ({what}, {self.left():.0f} s left, needs about {need} s)")
            return None
        self.say(f"-- {what} ({self.left():.0f} s left)")
        t0 = time.perf_counter()
        try: rec = fn()
        except Exception as e:   # out of HBM, or anything else: recorded, and the next part runs
            traceback.print_exc(); rec = {"error": short(e)}
            from tpu_items import hbm
            rec["hbm"] = hbm()
        gc.collect()
        return self.record({"what": what, **rec, "wall_s": round(time.perf_counter() - t0, 1)})

    def hf_dir(self) -> str:
        "The HF folder of the weights (written once), for Tunix's loader."
        if self._hf is None:
            from tpu_items import write_hf
            t0 = time.perf_counter()
            self._hf = str(write_hf(self.base, self.mcfg, Path(self.a.tmp) / f"hf_{self.model}"))
            self.say(f"wrote the weights as an HF folder for Tunix in {time.perf_counter() - t0:.1f} s")
        return self._hf

    def hbm_bw(self) -> tuple[float, str]:
        from tpu_items import NOMINAL_HBM_BW, hbm_bandwidth
        if self._bw is None: self._bw = hbm_bandwidth()
        nominal = NOMINAL_HBM_BW.get(self.kind)
        return (nominal, "nominal") if nominal else (self._bw, "measured (elementwise pass)")

    def load(self, model: str):
        "Switch to `model`: its config and random bf16 weights (the previous ones freed)."
        from tpu_items import model_config, random_base
        self.model, self.base, self._hf = model, None, None; gc.collect()
        self.mcfg = model_config(model)
        t0 = time.perf_counter(); self.base = random_base(self.mcfg)
        self.record({"what": f"weights {model}", "event": "weights", "N": self.mcfg.num_params(),
                     "seconds": round(time.perf_counter() - t0, 1)})


def start(b: Bench):
    "Device, versions, peak, bandwidth: the run's first record."
    import importlib.metadata as md
    import jax, jaxlib
    d = jax.devices()[0]
    b.kind, b.on_tpu = d.device_kind, jax.default_backend() == "tpu"
    b.run = f"{b.kind} {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"
    libtpu = next((f"{n} {md.version(n)}" for n in ("libtpu", "libtpu-nightly") if _has(md, n)), None)
    try: platform = d.client.platform_version
    except Exception: platform = None  # noqa: E701
    import sft_throughput as st
    b.peak = st.matmul_peak("bfloat16", n=8192 if b.on_tpu else 1024)
    from tpu_items import hbm_bandwidth
    b._bw = hbm_bandwidth(1 << 30 if b.on_tpu else 1 << 26)
    b.record({"what": "device", "event": "start", "backend": jax.default_backend(), "devices": len(jax.devices()),
              "jax": jax.__version__, "jaxlib": jaxlib.__version__, "libtpu": libtpu, "platform_version": platform,
              "bf16_matmul_tflops": round(b.peak / 1e12, 2), "hbm_bw_measured_gbps": round(b._bw / 1e9, 1),
              "budget_s": b.a.budget, "argv": sys.argv[1:], "import_s": round(time.perf_counter() - t_start, 1)})


def _has(md, name) -> bool:
    try: md.version(name); return True
    except md.PackageNotFoundError: return False


def run(a):
    import tpu_items as ti
    b = Bench(a)
    start(b)
    b.say(f"device {b.kind}; budget {a.budget:.0f} s")
    b.load(a.model)
    want = set(a.items.split(",")) if a.items else set(ITEMS[:-1]) | ({"profile"} if a.profile else set())
    go = lambda name: name in want
    rows_list, (s_prompt, s_new) = a.sampler[0], a.sampler[1:]
    P, G, Lp, Lc = a.grpo
    pairs, dp, dr = a.dpo
    if go("sft_lora"): ti.sft_pair(b, "lora", a.B, a.T)
    if go("sampler"):
        for r in rows_list:
            for att in a.decode_attention.split(","):       # side by side: the same rows with each attention
                b.attempt(f"sampler {r} rows" + ("" if att == "auto" else f" {att}"), 60,
                          lambda: ti.sampler(b, r, s_prompt, s_new, att))
    if go("grpo"): b.attempt(f"grpo step {P}x{G}", 120, lambda: ti.grpo_split(b, P, G, Lp, Lc))
    if go("dpo"): ti.dpo_pair(b, pairs, dp, dr)
    if go("sft_full"): ti.sft_pair(b, "full", a.B, a.T)
    if go("sft_lora_t2"): ti.sft_pair(b, "lora", a.B, a.T2, tunix=a.tunix_t2)
    if go("profile"):
        import tpu_speed
        b.attempt("profile sft lora", 60, lambda: tpu_speed.profile(
            b.mcfg, b.base, b.model, "lora", a.B, a.T, "none", 3, f"lora:{a.B}:{a.T}:none",
            lambda B, T, V: ti.sft_batch(B, T, V), ti.st.MAXPOST_TARGETS))
    if a.llama and go("llama"):
        if b.left() < (60 if b.on_tpu else 0):
            b.record({"what": f"sft lora {a.llama}", "event": "skipped", "why": "budget", "left_s": round(b.left(), 1)})
            b.say("skipped: budget (llama)")
        else:
            b.load(a.llama); ti.sft_pair(b, "lora", a.B, a.T, tunix=False)
    if a.llama and go("dpo_llama"):
        if b.model != a.llama: b.load(a.llama)
        ti.dpo_pair(b, pairs, dp, dr, tunix=False)
    b.record({"what": "end", "event": "end", "total_s": round(time.perf_counter() - t_start, 1)})
    return b.records


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3-1b")
    ap.add_argument("--llama", default="llama3.2-1b", help="the second model's preset ('' skips it)")
    ap.add_argument("--B", type=int, default=2, help="SFT rows per step")
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--T2", type=int, default=2048, help="the long-sequence SFT LoRA row")
    ap.add_argument("--steps", type=int, default=5, help="timed steps after the warm-up steps")
    ap.add_argument("--sampler", default="64,256:128:256", help="rows,rows,…:prompt tokens:new tokens")
    ap.add_argument("--decode-attention", default="auto",
                    help="comma list of the sampler item's NativeEngine(decode_attention=…): auto, xla, pallas, interpret")
    ap.add_argument("--grpo", default="8:8:256:256", help="prompts:generations:prompt tokens:completion tokens")
    ap.add_argument("--dpo", default="2:512:512", help="pairs:prompt tokens:response tokens")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds; no part starts that would not fit")
    ap.add_argument("--items", default="", help="comma list to run only these, in the fixed order: " + ", ".join(ITEMS))
    ap.add_argument("--no-tunix", action="store_true")
    ap.add_argument("--tunix-t2", action="store_true", help="compare Tunix at T2 too")
    ap.add_argument("--profile", action="store_true", help="add item `profile`: tpu_speed.profile of the SFT LoRA step (after item 6)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/tpu_bench"))
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/tmp"), help="where Tunix's HF folder is written")
    ap.add_argument("--write-results", nargs="?", const=str(RESULTS), default=None, metavar="MD",
                    help="append the rows to this markdown file (default benchmarks/RESULTS_tpu.md)")
    ap.add_argument("--from-jsonl", help="measure nothing: the rows of this tpu.jsonl (for --write-results)")
    a = ap.parse_args(argv)
    bad = sorted(set(a.items.split(",")) - set(ITEMS)) if a.items else []
    if bad: ap.error(f"--items: unknown item {bad[0]!r}; known: {', '.join(ITEMS)}")
    bad = sorted(set(a.decode_attention.split(",")) - {"auto", "xla", "pallas", "interpret"})
    if bad: ap.error(f"--decode-attention: unknown {bad[0]!r}; one or more of auto, xla, pallas, interpret")
    for key, n in (("sampler", 3), ("grpo", 4), ("dpo", 3)):       # "a:b:…" of positive integers
        parts = getattr(a, key).split(":")
        try:
            vals = [[int(x) for x in parts[0].split(",")] if key == "sampler" else int(parts[0])] + [int(x) for x in parts[1:]]
            ok = len(parts) == n and all(v > 0 for v in (vals[0] if key == "sampler" else [vals[0]]) + vals[1:])
        except ValueError: ok = False
        if not ok: ap.error(f"--{key}: {getattr(a, key)!r} is not {ap.get_default(key)!r}'s form (positive integers)")
        setattr(a, key, vals)
    from tpu_results import section, write_results
    if a.from_jsonl and not Path(a.from_jsonl).is_file(): ap.error(f"--from-jsonl: no file {a.from_jsonl}")
    if not a.from_jsonl:
        from tpu_items import model_config
        for key in ("model", "llama"):
            try:
                if getattr(a, key): model_config(getattr(a, key))
            except ValueError as e: ap.error(f"--{key}: {e}")
    if a.from_jsonl:
        recs = [json.loads(l) for l in Path(a.from_jsonl).read_text().splitlines() if l.strip()]
    else:
        recs = run(a)
    md = section(recs)
    if not a.from_jsonl: Path(a.out, "tpu_results.md").write_text(md)
    print(md)
    if a.write_results: print(f"wrote {write_results(a.write_results, recs)}")


if __name__ == "__main__":
    main()
