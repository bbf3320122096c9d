"""`benchmarks/tpu.py`'s records as a markdown section, and the rule that writes it into RESULTS_tpu.md: one block per
device kind and date (the run key), between HTML comment markers; a new key is appended at the end, the same key's
block is replaced, and every other block (another device's, another date's) is left byte for byte."""
from __future__ import annotations
from pathlib import Path

COMMAND = "python benchmarks/tpu.py"


def _begin(key: str) -> str: return f"<!-- tpu.py: {key} -->"
def _end(key: str) -> str: return f"<!-- /tpu.py: {key} -->"


def _f(x, nd=1) -> str:
    return "–" if x is None else f"{x:,.{nd}f}"


def _train_row(r: dict) -> str:
    shape = (f"{r['pairs']} pairs × ({r['prompt']} + {r['response']})" if "pairs" in r else f"B = {r['B']} × {r['T']}")
    if r.get("layout") == "shared": shape += f", one row of {r['row_slots']} slots per pair"
    return (f"{r['tokens_per_s']:,.0f} tokens/s, step {r['step_s_median']:.4f} s, MFU {_f(r.get('mfu_6N'), 3)}, "
            f"step-1 loss {r['loss_step1']:.4f}, first steps {r['first_steps_s']} s"), shape


def rows(recs: list[dict]) -> list[str]:
    "One markdown table row per record that holds a measurement, a skip or an error."
    out = []
    for r in recs:
        w = r.get("what", "")
        if r.get("event") == "skipped":
            out.append(f"| {w} | – | skipped: {r.get('why')}" + (f" ({r['left_s']} s left)" if "left_s" in r else "") + " |")
        elif "error" in r: out.append(f"| {w} | – | error: {r['error'][:300].replace('|', '/')} |")
        elif r.get("event") == "compare" and "shared_over_two_row" in r:
            out.append(f"| {w} | same weights, pairs, LoRA A, optimizer | speed ×{r['shared_over_two_row']}; step-1 loss "
                       f"{r['loss_step1_shared']:.5f} vs {r['loss_step1_two_row']:.5f} (rel. diff "
                       f"{r['loss_step1_rel_diff']:.1e}); step-1 Σ log π(chosen) {r['logps_chosen_step1_shared']:.3f} vs "
                       f"{r['logps_chosen_step1_two_row']:.3f} |")
        elif r.get("event") == "compare":
            out.append(f"| {w}: maxpost / Tunix | {r.get('same', 'same weights, batch, optimizer')} | speed ×{r['maxpost_over_tunix']}; "
                       f"step-1 loss {r['loss_step1_maxpost']:.5f} vs {r['loss_step1_tunix']:.5f} "
                       f"(rel. diff {r['loss_step1_rel_diff']:.1e})" + (
                           f"; step-1 Σ log π(chosen) {r['logps_chosen_step1_maxpost']:.3f} vs "
                           f"{r['logps_chosen_step1_tunix']:.3f}" if "logps_chosen_step1_tunix" in r else "") + " |")
        elif "framework" in r:
            res, shape = _train_row(r)
            out.append(f"| {w} | {r['model']}, {r['mode']}, {shape}, remat {r.get('remat', 'none')} | {res} |")
        elif "rows" in r and "hbm_bound_tokens_per_s" in r:
            att = f", {r['decode_attention']} attention" if r.get("decode_attention", "auto") != "auto" else ""
            out.append(f"| {w} | {r['model']}, {r['rows']} rows × ({r['prompt']} + {r['new_tokens']}){att} | "
                       f"{r['tokens_per_s']:,.0f} tokens/s = {r['fraction_of_bound']:.2f} of the HBM bound "
                       f"{r['hbm_bound_tokens_per_s']:,.0f} ({r['hbm_bw_gbps']} GB/s, {r['hbm_bw_source']}); bound at the "
                       f"measured bandwidth {_f(r.get('bound_at_measured_bw_tokens_per_s'), 0)} |")
        elif "by_class_share" in r:
            top = ", ".join(f"{k} {v:.2f}" for k, v in list(r["by_class_share"].items())[:5])
            out.append(f"| {w} | {r['tag']}, {r['attention']} attention | device busy {r['device_busy_s']:.4f} s of a "
                       f"{r['profile_wall_step_s']:.4f} s step (host or idle {r['host_or_idle_share']}); shares: {top} |")
        elif "step" in r and "first_step" in r:
            s = r["step"]
            out.append(f"| {w} | {r['model']}, LoRA, {r['prompts']} prompts × {r['G']}, {r['prompt']} + "
                       f"{r['completion']} tokens, remat {r['remat']} | step {s['step']:.2f} s: rollout "
                       f"{s['rollout']:.2f} s (share {s['rollout_share']:.2f}), reward {s['reward']:.2f}, reference "
                       f"{s['reference']:.2f}, update {s['update']:.2f}, sync {s['sync']:.2f}; first step "
                       f"{r['first_step']['step']:.1f} s |")
    return out


def block_key(recs: list[dict]) -> str:
    """The block's key: device kind and date, plus the items when the run chose some (`--items`), so that two runs of
    different items on one day keep both blocks and a rewrite of the same run replaces its own."""
    s = next((r for r in recs if r.get("event") == "start"), None)
    if s is None: raise ValueError("the records hold no start record (event 'start'): not a tpu.py run")
    argv = list(s.get("argv", []))
    items = next((a.split("=", 1)[1] for a in argv if a.startswith("--items=")), None)
    if "--items" in argv and argv.index("--items") + 1 < len(argv): items = argv[argv.index("--items") + 1]
    return s["run"] + (f" [{items}]" if items else "")


def section(recs: list[dict]) -> str:
    "The markdown block of one run (its first record names the device and the versions)."
    key = block_key(recs)
    s = next(r for r in recs if r.get("event") == "start")
    head = (f"### `{COMMAND}` on {s['device_kind']}, {s['run'].rsplit(' ', 1)[1]}\n\n"
            f"`{COMMAND} {' '.join(s.get('argv', []))}`; jax {s['jax']}, jaxlib {s['jaxlib']}, "
            f"{s.get('libtpu') or 'no libtpu package'} ({s.get('platform_version')}); bf16 matmul peak "
            f"{s['bf16_matmul_tflops']} TFLOP/s, elementwise HBM pass {s['hbm_bw_measured_gbps']} GB/s, both "
            f"measured in the same process; budget {s['budget_s']:.0f} s.\n\n"
            "| item | configuration | measured |\n|---|---|---|\n")
    return f"{_begin(key)}\n{head}" + "\n".join(rows(recs)) + f"\n{_end(key)}\n"


def write_results(path, recs: list[dict]) -> Path:
    "Put this run's block into markdown file `path`: replace the block of the same `block_key`, else append."
    p = Path(path)
    block, key = section(recs), block_key(recs)
    text = p.read_text() if p.exists() else ""
    b, e = _begin(key), _end(key)
    if b in text:
        i = text.index(b)
        j = text.index(e, i) + len(e)
        if j < len(text) and text[j] == "\n": j += 1
        text = text[:i] + block + text[j:]
    else:
        text = text + ("" if text.endswith("\n\n") or not text else "\n" if text.endswith("\n") else "\n\n") + block
    p.write_text(text)
    return p
