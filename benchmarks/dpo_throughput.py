"""DPO throughput on a CPU: maxpost's DPOTrainer against Tunix's DPOTrainer (google-tunix, `tunix.sft.dpo`) with
Tunix's own Gemma 3 model, LoRA, on the same weights (the embedded Gemma 3 270M, loaded by each framework from the same
HF folder), the same preference pairs and shapes, and the same optimisation.

    python benchmarks/dpo_throughput.py [--pairs 2] [--prompt 64] [--response 64] [--steps 5] [--dtype float32]
    python benchmarks/dpo_throughput.py --baseline /tmp/base   # + maxpost imported from another tree (before a change)
    python benchmarks/dpo_throughput.py --share --skip-tunix   # + maxpost's one-row-per-pair layout (dpo.share_prompt)

Each trainer runs in its own subprocess (its peak RSS is its own); the parent sets both up one after the other, runs
one compiling step of each, then alternates them step by step over the timed steps so that both see the same load.
It prints the CPU and its matmul flags, jax, the load average before and after, tokens/s as median (min, max) of the
timed steps, the ratio maxpost / Tunix, each trainer's peak RSS, and each step's loss and log-probs.

What a step is, in each:
- Tunix: `DPOTrainer.train([batch])` on B pairs: the reference model's forward on the 2B rows (Tunix computes the
  reference log-probs inside every step, `_prepare_inputs`), then the policy's forward + backward and AdamW.
- maxpost: the reference log-probs of the same B pairs (the base model with the adapters off, `DPOTrainer._plain`;
  like the train step it projects only the response positions onto the vocabulary, `maxpost.dpo.response_window`;
  `maxpost.dpo.train` computes them once per pair before training, so with each pair seen once this is the same
  work), then `DPOTrainer.step`. The timed figure is the sum of the two; the step alone is printed too.
Tokens per step: 2B rows × (prompt + response), every token real (no padding), as in both frameworks' batches.
With --share a third trainer, `maxpost-share`, runs the same pairs and config with `dpo.share_prompt=true`: one row
per pair, the prompt once and both responses reading it (`maxpost.dpo_data.collate_shared`, max_target_length +
response slots). Its tokens/s counts the same 2B × (prompt + response) pair tokens, so the ratio maxpost-share /
maxpost is the ratio of step times; its step-1 loss equals the two-row one up to float rounding.

Like for like (as in `sft_throughput.py`, whose helpers this script uses): LoRA rank 16, α 32 on q, o, gate, up and
down (Tunix's Gemma 3 computes k and v in one einsum that Qwix would give one shared A, so k and v are frozen in both);
Tunix's Qwix A factors start from maxpost's A (copied), B = 0 in both; both get maxpost's schedule (constant lr 1e-4
here, no warmup), AdamW and global-norm clipping from one DPOConfig; β = 0.1, no label smoothing. The reference in
Tunix is a second copy of the base model (its `ref_model` argument: the policy with LoRA is a separate module); in
maxpost it is the same frozen weights with the adapters off.
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sft_throughput as st   # cpu_info, machine_kind, jax_info, matmul_peak, tunix_optimizer, LoRA targets

ROOT = Path(__file__).resolve().parents[1]
TAG = st.TAG            # the workers' protocol lines on stdout (sft_throughput.Worker reads them)
BETA = 0.1
SHARE = "maxpost-share"   # the extra trainer of --share: dpo.share_prompt (one row per pair)

def make_pairs(vocab: int, B: int, P: int, R: int) -> dict:
    "Random token ids: prompt [B, P], chosen [B, R], rejected [B, R] (no padding, no special ids below 10)."
    rng = np.random.default_rng(0)
    ids = lambda *s: rng.integers(10, vocab, s, dtype=np.int32)
    return {"prompt": ids(B, P), "chosen": ids(B, R), "rejected": ids(B, R)}

def dpo_config(hf_dir, B: int, T: int, dtype: str):
    "The one DPOConfig both trainers take their LoRA, optimizer and β from."
    from maxpost.dpo import DPOConfig
    return DPOConfig(model_name="gemma3-270m", load_parameters_path=str(hf_dir), dataset_type="synthetic",
                     use_lora=True, lora_rank=st.LORA_RANK, lora_alpha=st.LORA_ALPHA, lora_module_path=st.MAXPOST_TARGETS,
                     learning_rate=st.LR, warmup_steps_fraction=0.0, steps=100, per_device_batch_size=B,
                     max_target_length=T, dtype=dtype, dpo={"dpo_beta": BETA})

def maxpost_batch(p: dict) -> dict:
    "maxpost's host pair batch: rows [chosen 0..B-1, rejected 0..B-1] = prompt + response; the loss on response tokens."
    P = p["prompt"].shape[1]
    rows = np.concatenate([np.concatenate([p["prompt"], p[k]], 1) for k in ("chosen", "rejected")])   # [2B, T]
    R2, T = rows.shape
    targets = np.concatenate([rows[:, 1:], np.zeros((R2, 1), np.int32)], 1)
    mask = np.zeros((R2, T), np.float32); mask[:, P - 1:T - 1] = 1          # predictions of the response tokens
    return dict(inputs=rows, targets=targets, positions=np.tile(np.arange(T, dtype=np.int32), (R2, 1)),
                segment_ids=np.ones((R2, T), np.int32), loss_mask=mask)

def shared_batch(p: dict, L: int) -> dict:
    "maxpost's shared host batch (`dpo.share_prompt`): one [L]-slot row per pair, the prompt once, then both responses."
    from maxpost.data import SFTExample
    from maxpost.dpo_data import PreferencePair, collate_shared
    P, R = p["prompt"].shape[1], p["chosen"].shape[1]
    mask = np.r_[np.zeros(P, bool), np.ones(R, bool)]
    side = lambda b, k: SFTExample(np.concatenate([p["prompt"][b], p[k][b]]), mask, b)
    return collate_shared([PreferencePair(side(b, "chosen"), side(b, "rejected"), b) for b in range(len(p["prompt"]))],
                          L, len(p["prompt"]))

def setup_maxpost(hf_dir, pairs: dict, dtype: str, lora_out: str, share: bool = False):
    """A function running one maxpost DPO step (reference pass of the batch + train step); its LoRA A saved for Tunix.
    share: the one-row-per-pair layout (`dpo.share_prompt`, rows of max_target_length + response slots)."""
    import jax
    from maxpost.dpo import DPOTrainer, with_window
    from maxpost.trainer import load_base
    B, T = pairs["prompt"].shape[0], pairs["prompt"].shape[1] + pairs["chosen"].shape[1]
    cfg = dpo_config(hf_dir, B, T, dtype)
    if share: cfg = cfg.model_copy(update={"dpo": cfg.dpo.model_copy(update={
        "share_prompt": True, "max_response_length": pairs["chosen"].shape[1]})})
    mcfg, base, _ = load_base(cfg)
    tr = DPOTrainer(cfg, mcfg, base); del base
    hb = with_window(shared_batch(pairs, cfg.share_length) if share else maxpost_batch(pairs), tr.window_width)   # head:
    # the response positions only
    box = {"state": tr.init_state()}
    if lora_out: np.savez(lora_out, **{k: np.asarray(v["a"]) for k, v in box["state"]["params"].items()})
    def step():
        t = time.perf_counter()
        x = {k: jax.device_put(hb[k], tr.batch2_sh) for k in hb}
        ref, _ = tr._plain(tr.frozen, x)
        ref = np.asarray(ref, np.float32)
        t_ref = time.perf_counter() - t
        box["state"], m = tr.step(box["state"], dict(hb, ref_logps=ref))
        m = {k: float(v) for k, v in m.items()}
        return {"loss": m["loss"], "logps_chosen": m["logps/chosen"], "logps_rejected": m["logps/rejected"],
                "ref_chosen": float(ref[:B].mean()), "ref_rejected": float(ref[B:].mean()), "ref_s": t_ref}
    return step, tr.mcfg.num_params()

def setup_tunix(hf_dir, pairs: dict, dtype: str, lora_in: str, model: str = "gemma3-270m"):
    """A function running one Tunix DPOTrainer step (its own train loop on one batch, reference forward included);
    `model` names Tunix's config (`sft_throughput.tunix_model_config`) for the weights in `hf_dir`."""
    import jax, jax.numpy as jnp, qwix
    from flax import nnx
    from tunix.models.gemma3 import model as gm, params_safetensors as gp
    from tunix.sft import utils as su
    from tunix.sft.dpo import dpo_trainer as dt
    B, P = pairs["prompt"].shape; R = pairs["chosen"].shape[1]
    cfg0 = dpo_config(hf_dir, B, P + R, dtype)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    mcfg = st.tunix_model_config(model); mcfg.param_dtype = jnp.dtype(dtype)
    ones = lambda a: jnp.ones(a.shape, jnp.int32)
    ex = dt.TrainingInput(prompt_ids=jnp.asarray(pairs["prompt"]), prompt_mask=ones(pairs["prompt"]),
                          chosen_ids=jnp.asarray(pairs["chosen"]), chosen_mask=ones(pairs["chosen"]),
                          rejected_ids=jnp.asarray(pairs["rejected"]), rejected_mask=ones(pairs["rejected"]))
    with mesh:
        model = gp.create_model_from_safe_tensors(str(hf_dir), mcfg, mesh, dtype=jnp.dtype(dtype))
        ref_model = gp.create_model_from_safe_tensors(str(hf_dir), mcfg, mesh, dtype=jnp.dtype(dtype))
        prov = qwix.LoraProvider(module_path=st.TUNIX_TARGETS, rank=cfg0.lora_rank, alpha=cfg0.lora_alpha)
        toks = jnp.concatenate([ex.prompt_ids, ex.chosen_ids], 1); m = jnp.ones(toks.shape, bool)
        model = qwix.apply_lora_to_model(model, prov, toks, su.build_positions_from_mask(m), None,
                                         su.make_causal_attn_mask(m), rngs=nnx.Rngs(0))
        lst = nnx.state(model, nnx.LoRAParam)
        assert jax.tree.leaves(lst), "qwix created no LoRA params"
        a0 = np.load(lora_in)
        for k, (blk, mod, name) in st.TUNIX_A.items():
            for l, layer in lst["layers"].items():
                v = layer[blk][mod][name]
                assert v.value.shape == a0[k][l].shape, (k, v.value.shape, a0[k][l].shape)
                v.value = jnp.asarray(a0[k][l], v.value.dtype)
        nnx.update(model, lst)
        tr = dt.DPOTrainer(model, ref_model, st.tunix_optimizer(cfg0),
                           dt.DPOTrainingConfig(eval_every_n_steps=10**9, algorithm="dpo", beta=BETA))
    tr.is_managed_externally = True          # one call of train() per batch; no max_steps, no close()
    losses, auxes, orig_b, orig_p = [], [], tr._buffer_metrics, tr._post_process_train_step
    def spy(buf, loss, step, additional_metrics=None):
        losses.append(loss); return orig_b(buf, loss=loss, step=step, additional_metrics=additional_metrics)
    def spy_aux(aux):
        auxes.append(aux); return orig_p(aux)
    tr._buffer_metrics, tr._post_process_train_step = spy, spy_aux
    def step():
        with mesh: tr.train([ex])
        a = auxes[-1]
        return {"loss": float(jax.block_until_ready(losses[-1])), "logps_chosen": float(a["log_probs/chosen"]),
                "logps_rejected": float(a["log_probs/rejected"])}
    return step

def worker(name: str, a):
    "One trainer in this process: set up, then answer 'step' and 'done' (peak RSS) on stdin/stdout."
    from maxpost.convert.from_gguf import embedded_hf
    hf_dir = embedded_hf("gemma3-270m")
    pairs = make_pairs(262_144, a.pairs, a.prompt, a.response)
    t = time.perf_counter()
    if name.startswith("maxpost"):      # (BASE: the same code, maxpost imported from --baseline; it reads the A file)
        step, n = setup_maxpost(hf_dir, pairs, a.dtype, a.lora_file if name == "maxpost" else None, name == SHARE)
    else: step, n = setup_tunix(hf_dir, pairs, a.dtype, a.lora_file), None
    say = lambda d: print(TAG + json.dumps(d), flush=True)
    say({"setup_s": time.perf_counter() - t, "n_params": n, "rss_after_setup_gib": st._peak_rss_gib()})
    for line in sys.stdin:
        if line.strip() == "step":
            t = time.perf_counter(); r = step(); say(r | {"s": time.perf_counter() - t})
        elif line.strip() == "done":
            say({"peak_rss_gib": st._peak_rss_gib()}); return

class Worker(st.Worker):
    "`sft_throughput.Worker` (its read/ask protocol) running this script's worker."
    def __init__(self, name: str, a, lora_file: str):
        args = [sys.executable, __file__, "--worker", name, "--pairs", str(a.pairs), "--prompt", str(a.prompt),
                "--response", str(a.response), "--dtype", a.dtype, "--lora-file", lora_file]
        env = os.environ | {"PYTHONUNBUFFERED": "1"} | ({"PYTHONPATH": a.baseline} if name == st.BASE else {})
        self.name, self.p = name, subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                                   cwd=ROOT, env=env)

def bench(a) -> dict:
    "maxpost set up first (Tunix starts from its LoRA A), then Tunix; a compile step each; then alternation."
    lora_file = str(Path(tempfile.mkdtemp()) / "lora_a.npz")
    names = ["maxpost"] + ([st.BASE] if a.baseline else []) + ([SHARE] if a.share else []) + ([] if a.skip_tunix else ["tunix"])
    ws, out = {}, {}
    for k in names:                       # one at a time: the second starts after the first has loaded
        ws[k] = Worker(k, a, lora_file); out[k] = ws[k].read() | {"steps": []}
    for i in range(a.steps + 1):
        for k in names: out[k]["steps"].append(ws[k].ask("step"))
    for k in names:
        out[k] |= ws[k].ask("done"); ws[k].p.wait()
    return out

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=2, help="preference pairs per step (2× as many rows)")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    ap.add_argument("--response", type=int, default=64, help="tokens of each response")
    ap.add_argument("--steps", type=int, default=5, help="timed steps after the compile step (at least 5)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--skip-tunix", action="store_true")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--baseline", help="also run maxpost imported from this tree (`git archive <commit> maxpost`)")
    ap.add_argument("--share", action="store_true", help="also run maxpost with dpo.share_prompt (one row per pair)")
    ap.add_argument("--worker", choices=["maxpost", st.BASE, SHARE, "tunix"], help=argparse.SUPPRESS)
    ap.add_argument("--lora-file", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker: return worker(a.worker, a)
    if a.steps < 5: ap.error("--steps must be at least 5")
    res = {"config": {k: v for k, v in vars(a).items() if k not in ("worker", "lora_file")}, "cpu": st.cpu_info(),
           "jax": st.jax_info(), "load_avg_start": os.getloadavg(),
           "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    res |= bench(a)
    res["load_avg_end"] = os.getloadavg()
    res["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    ntok = 2 * a.pairs * (a.prompt + a.response)
    for k in ("maxpost", st.BASE, SHARE, "tunix"):
        if k not in res: continue
        r = res[k]; s = [x["s"] for x in r["steps"][1:]]
        r |= {"first_step_s": r["steps"][0]["s"], "step_s": s, "tokens_per_s": ntok / statistics.median(s),
              "tokens_per_s_min": ntok / max(s), "tokens_per_s_max": ntok / min(s)}
        if k.startswith("maxpost"):
            r["train_step_only_tokens_per_s"] = ntok / statistics.median([x["s"] - x["ref_s"] for x in r["steps"][1:]])
    if "tunix" in res:
        m, t = res["maxpost"], res["tunix"]
        res["ratio_maxpost_over_tunix"] = m["tokens_per_s"] / t["tokens_per_s"]
        res["ratio_paired_median"] = statistics.median(y / x for x, y in zip(m["step_s"], t["step_s"]))
        res["rss_ratio"] = m["peak_rss_gib"] / t["peak_rss_gib"]
        res["max_loss_diff"] = max(abs(x["loss"] - y["loss"]) for x, y in zip(m["steps"], t["steps"]))
    if st.BASE in res:
        m, b = res["maxpost"], res[st.BASE]
        res["ratio_maxpost_over_baseline"] = m["tokens_per_s"] / b["tokens_per_s"]
        res["ratio_baseline_paired"] = statistics.median(y / x for x, y in zip(m["step_s"], b["step_s"]))
        res["baseline_max_loss_diff"] = max(abs(x["loss"] - y["loss"]) for x, y in zip(m["steps"], b["steps"]))
    if SHARE in res:
        m, h = res["maxpost"], res[SHARE]
        res["ratio_share_over_two_row"] = h["tokens_per_s"] / m["tokens_per_s"]
        res["ratio_share_paired"] = statistics.median(x / y for x, y in zip(m["step_s"], h["step_s"]))
        res["share_max_loss_diff"] = max(abs(x["loss"] - y["loss"]) for x, y in zip(m["steps"], h["steps"]))
        res["share_loss_step1"] = [m["steps"][0]["loss"], h["steps"][0]["loss"]]
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps(res, indent=1, default=str))
    ci = res["cpu"]
    print(f"\nCPU: {ci['model']}, {ci['cores']} cores; " + " ".join(f"{k}={'y' if v else 'n'}" for k, v in ci["isa"].items()))
    print(f"jax {res['jax']['jax']}; {res['uptime_start']}  ->  {res['uptime_end']}")
    print(f"LoRA DPO, Gemma 3 270M, {a.pairs} pairs x (prompt {a.prompt} + response {a.response}) = {ntok} tokens/step, "
          f"{a.dtype}; {a.steps} timed steps, alternating")
    for k in ("maxpost", st.BASE, SHARE, "tunix"):
        if k in res:
            r = res[k]
            print(f"  {k:13s} {r['tokens_per_s']:6.1f} tok/s (min {r['tokens_per_s_min']:.1f}, max {r['tokens_per_s_max']:.1f})"
                  f"  first step {r['first_step_s']:.1f} s  peak RSS {r['peak_rss_gib']:.2f} GiB  losses "
                  f"{[round(x['loss'], 5) for x in r['steps']]}  logps/chosen {[round(x['logps_chosen'], 3) for x in r['steps']]}")
    if "tunix" in res:
        print(f"  maxpost / Tunix = {res['ratio_maxpost_over_tunix']:.2f} (median of per-round ratios "
              f"{res['ratio_paired_median']:.2f}); maxpost train step alone {res['maxpost']['train_step_only_tokens_per_s']:.1f} "
              f"tok/s; peak RSS maxpost / Tunix = {res['rss_ratio']:.2f}; max |loss difference| = {res['max_loss_diff']:.2e}")
    if st.BASE in res:
        print(f"  maxpost / {st.BASE} = {res['ratio_maxpost_over_baseline']:.2f} (median of per-round ratios "
              f"{res['ratio_baseline_paired']:.2f}); max |loss difference| = {res['baseline_max_loss_diff']:.2e}")
    if SHARE in res:
        print(f"  {SHARE} / maxpost = {res['ratio_share_over_two_row']:.2f} (median of per-round ratios "
              f"{res['ratio_share_paired']:.2f}); step-1 losses {res['share_loss_step1']}; max |loss difference| = "
              f"{res['share_max_loss_diff']:.2e}")

if __name__ == "__main__":
    main()
