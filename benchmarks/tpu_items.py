"""The measurements of `benchmarks/tpu.py`, one function per item; each returns a list of JSON-able records.

maxpost runs from random weights drawn once (`Bench.base`, bfloat16 on the host); Tunix, where it is compared, loads
the very same weights from an HF folder written from them (`write_hf`, read by Tunix's own safetensors loader) and
starts its LoRA A factors from maxpost's (B = 0 in both), so the step-1 losses are comparable. Tunix is set up as
`sft_throughput.setup_tunix` / `dpo_throughput.setup_tunix` build it (PeftTrainer, DPOTrainer; LoRA rank 16 α 32 on
q, o, gate, up, down; maxpost's AdamW, clipping and schedule); the maxpost side as `.tpu/sft_vs_tunix.py` does
(SFTTrainer / DPOTrainer, bfloat16 weights and compute, the same LoRA targets).
Timing: every step blocks on its loss; the first steps (compiles; Tunix recompiles at step 2) are reported apart and
the step time is the median of the steps after them.
"""
from __future__ import annotations
import dataclasses, gc, json, statistics, sys, tempfile, time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sft_throughput as st      # Tunix's PeftTrainer (setup_tunix), LoRA targets, the optimizer both share
import dpo_throughput as dt      # Tunix's DPOTrainer (setup_tunix), the random preference pairs

GIB = 2 ** 30
NOMINAL_HBM_BW = {"TPU v5 lite": 819e9, "TPU v5e": 819e9, "TPU v6 lite": 1640e9, "TPU v5": 2765e9, "TPU v4": 1228e9}


def hbm() -> dict:
    "bytes_in_use / peak_bytes_in_use of device 0 in GiB ({} on a CPU)."
    import jax
    s = jax.devices()[0].memory_stats() or {}
    return {k: round(s[k] / GIB, 3) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if k in s}


def model_config(name: str):
    """maxpost's ModelConfig of `name`; `tiny-gemma3` here has Tunix's 5 : 1 layer pattern (all 4 layers sliding),
    so that Tunix's tiny config (`sft_throughput.tunix_model_config('tiny-gemma3-all-sliding')`) is the same model."""
    from maxpost.model import gemma3_layer_types, model_config as mc, tiny_config
    return tiny_config("gemma3", layer_types=gemma3_layer_types(4)) if name == "tiny-gemma3" else mc(name)


def tunix_name(model: str) -> str | None:
    "The name `sft_throughput.tunix_model_config` knows for maxpost model `model`, or None (no Tunix comparison)."
    return {"tiny-gemma3": "tiny-gemma3-all-sliding", "gemma3-270m": "gemma3-270m", "gemma3-1b": "gemma3-1b",
            "gemma3-4b": "gemma3-4b"}.get(model)


def random_base(mcfg, seed: int = 0) -> dict:
    """Random weights by the Decoder's rule as host bf16: drawn on the accelerator (`maxpost.trainer.device_params`;
    numpy takes about 25 s for Gemma 3 1B), by numpy on a CPU (`maxpost.model.random_params`: no compile)."""
    import jax, jax.numpy as jnp, ml_dtypes
    from maxpost.model import random_params
    from maxpost.trainer import device_params
    from maxpost.sft import SFTConfig
    if jax.default_backend() == "cpu":
        return {k: v.astype(ml_dtypes.bfloat16) for k, v in random_params(mcfg, seed).items()}
    mesh = SFTConfig().mesh()                     # maxpost's own mesh over the device(s)
    p = device_params(mcfg, seed, mesh, jnp.bfloat16)
    out = {k: np.asarray(jax.device_get(v)) for k, v in p.items()}
    del p
    return out


def write_hf(base: dict, mcfg, out_dir) -> Path:
    "An HF folder (model.safetensors, config.json) holding `base`, for Tunix's safetensors loader."
    from maxpost.checkpoint import HF_GLOBAL, config_to_hf, hf_layer_names, maxpost_to_hf_layer, write_safetensors
    out = Path(out_dir); out.mkdir(parents=True, exist_ok=True)
    names = {k: ([HF_GLOBAL[k]] if k in HF_GLOBAL else [t.format(i=i) for i in range(mcfg.num_layers)])
             for k, t in {**HF_GLOBAL, **hf_layer_names(mcfg)}.items() if k in base}
    def pieces():
        for k, ns in names.items():
            w = base[k]
            if k in HF_GLOBAL: yield ns[0], (w.T if k == "lm_head" else w)
            else:
                for i, n in enumerate(ns): yield n, np.ascontiguousarray(maxpost_to_hf_layer(k, w[i], mcfg))
    specs = {n: (w.shape, w.dtype) for n, w in pieces()}            # views: no copy of the weights
    write_safetensors(out / "model.safetensors", specs, pieces(), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config_to_hf(mcfg, torch_dtype="bfloat16")))
    return out


def timed_steps(step, warm: int, steps: int) -> dict:
    "Run `warm` + `steps` calls of `step` (each returns a loss, blocking); first-steps' seconds apart, median after."
    t_first, losses, times = [], [], []
    for i in range(warm + steps):
        t0 = time.perf_counter(); loss = step(); dt_ = time.perf_counter() - t0
        (t_first if i < warm else times).append(dt_); losses.append(loss)
    med = statistics.median(times)
    return {"first_steps_s": [round(x, 2) for x in t_first], "step_s_median": round(med, 4),
            "step_s_min": round(min(times), 4), "step_s_max": round(max(times), 4), "loss_step1": losses[0],
            "losses": [round(float(x), 5) for x in losses]}


def sft_batch(B: int, T: int, vocab: int) -> dict:
    "Random ids, every next-token prediction in the loss (the rows `sft_throughput.maxpost_trainer` builds)."
    tokens = st.make_tokens(vocab, B, T)
    targets = np.concatenate([tokens[:, 1:], np.zeros((B, 1), np.int32)], 1)
    mask = np.ones((B, T), np.float32); mask[:, -1] = 0
    return dict(inputs=tokens, targets=targets, positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
                segment_ids=np.ones((B, T), np.int32), loss_mask=mask)


def sft_maxpost(b, mode: str, B: int, T: int, remat: str, lora_out: str | None) -> dict:
    "maxpost's SFTTrainer step (bfloat16, LoRA rank 16 on the five projections or full), timed."
    from maxpost.sft import SFTConfig, SFTTrainer
    cfg = SFTConfig(model_name=b.model, use_lora=mode == "lora",
                    lora_rank=st.LORA_RANK, lora_alpha=st.LORA_ALPHA, lora_module_path=st.MAXPOST_TARGETS,
                    learning_rate=st.LR, warmup_steps_fraction=0.0, steps=100, per_device_batch_size=B,
                    max_target_length=T, dtype="bfloat16", weight_dtype="bfloat16", remat_policy=remat)
    tr = SFTTrainer(cfg, b.mcfg, b.base)
    state = {"s": tr.init_state()}
    if lora_out and mode == "lora":
        np.savez(lora_out, **{k: np.asarray(v["a"], np.float32) for k, v in state["s"]["params"].items()})
    batch = sft_batch(B, T, b.mcfg.vocab_size)
    def step():
        state["s"], m = tr.step(state["s"], batch)
        return float(m["loss"])
    rec = timed_steps(step, 1, b.steps) | {"compiles": tr._step._cache_size(), "hbm": hbm()}
    del tr, state; gc.collect()
    return rec


def tokens_rec(rec: dict, tokens: int, b) -> dict:
    "tokens/s and MFU (6·N·tokens/s over the measured bf16 matmul peak) of a timed record."
    tps = tokens / rec["step_s_median"]
    return rec | {"tokens_per_step": tokens, "tokens_per_s": round(tps, 1),
                  "mfu_6N": round(6 * b.mcfg.num_params() * tps / b.peak, 4) if b.peak else None}


def sft_pair(b, mode: str, B: int, T: int, remat: str = "none", tunix: bool = True) -> list[dict]:
    "maxpost's SFT step and (Gemma 3 only, unless --no-tunix) Tunix's PeftTrainer's, same weights, batch and A."
    lora = str(Path(tempfile.mkdtemp()) / "lora_a.npz")
    shape = {"model": b.model, "mode": mode, "B": B, "T": T, "remat": remat}
    out = [b.attempt(f"sft {mode} {b.model} B={B} T={T} maxpost", 40, lambda: {"framework": "maxpost", **shape} |
                     tokens_rec(sft_maxpost(b, mode, B, T, remat, lora), B * T, b))]
    if tunix and b.tunix and tunix_name(b.model):
        def run():
            import jax
            step = st.setup_tunix(b.hf_dir(), st.make_tokens(b.mcfg.vocab_size, B, T), mode, "bfloat16", lora,
                                  tunix_name(b.model))
            rec = timed_steps(step, 2, b.steps) | {"hbm": hbm()}
            del step; gc.collect(); jax.clear_caches()
            return {"framework": "tunix", **shape, "remat": "none (Tunix's default)"} | tokens_rec(rec, B * T, b)
        out.append(b.attempt(f"sft {mode} {b.model} B={B} T={T} tunix", 200, run))
        c = compare(f"sft {mode} {b.model} B={B} T={T}", *out[-2:])
        if c: out.append(b.record(c))
    return out


def compare(what: str, m: dict | None, t: dict | None) -> dict | None:
    "maxpost over Tunix: the speed ratio and the step-1 losses (same weights, data and LoRA A)."
    if not (m and t and "tokens_per_s" in m and "tokens_per_s" in t): return None
    same = "same weights, batch, " + ("LoRA A, " if m.get("mode") == "lora" else "") + "optimizer"
    return {"what": what, "event": "compare", "same": same, "maxpost_over_tunix": round(m["tokens_per_s"] / t["tokens_per_s"], 3),
            "loss_step1_maxpost": m["loss_step1"], "loss_step1_tunix": t["loss_step1"],
            "loss_step1_rel_diff": abs(m["loss_step1"] - t["loss_step1"]) / max(abs(t["loss_step1"]), 1e-12),
            **({"logps_chosen_step1_maxpost": m["logps_chosen_step1"], "logps_chosen_step1_tunix": t["logps_chosen_step1"]}
               if "logps_chosen_step1" in m and "logps_chosen_step1" in t else {})}


def dpo_pair(b, pairs: int, prompt: int, response: int, tunix: bool = True) -> list[dict]:
    """maxpost's DPO step (reference log-probs + update) and Tunix's DPOTrainer step (reference inside), LoRA; then
    maxpost's one-row-per-pair layout (`dpo.share_prompt`) on the same pairs, compared with the two-row step (speed,
    step-1 loss), or a `skipped` record where the model's sliding window is shorter than the shared row."""
    lora = str(Path(tempfile.mkdtemp()) / "lora_a.npz")
    P = dt.make_pairs(b.mcfg.vocab_size, pairs, prompt, response)
    shape = {"model": b.model, "mode": "lora", "pairs": pairs, "prompt": prompt, "response": response}
    tokens = 2 * pairs * (prompt + response)      # pair tokens, in either layout (the shared row runs the prompt once)
    def ours(share: bool = False):
        import jax
        from maxpost.dpo import DPOConfig, DPOTrainer, with_window
        cfg = DPOConfig(model_name=b.model, use_lora=True, lora_rank=st.LORA_RANK, lora_alpha=st.LORA_ALPHA,
                        lora_module_path=st.MAXPOST_TARGETS, learning_rate=st.LR, warmup_steps_fraction=0.0, steps=100,
                        per_device_batch_size=pairs, max_target_length=prompt + response, dtype="bfloat16",
                        weight_dtype="bfloat16", remat_policy="none",
                        dpo={"dpo_beta": dt.BETA, "share_prompt": share, "max_response_length": response if share else -1})
        tr = DPOTrainer(cfg, b.mcfg, b.base)
        box = {"s": tr.init_state()}
        if not share: np.savez(lora, **{k: np.asarray(v["a"], np.float32) for k, v in box["s"]["params"].items()})
        hb = with_window(dt.shared_batch(P, cfg.share_length) if share else dt.maxpost_batch(P), tr.window_width)
        def step():      # as dpo_throughput.setup_maxpost: the pairs' reference log-probs, then the update
            x = {k: jax.device_put(hb[k], tr.batch2_sh) for k in hb}
            ref = np.asarray(tr._plain(tr.frozen, x)[0], np.float32)
            box["s"], m = tr.step(box["s"], dict(hb, ref_logps=ref))
            box.setdefault("logps_chosen_step1", float(m["logps/chosen"]))
            return float(m["loss"])
        rec = timed_steps(step, 1, b.steps) | {"hbm": hbm(), "logps_chosen_step1": box["logps_chosen_step1"]}
        del tr, box; gc.collect()
        return {"framework": "maxpost", "layout": "shared" if share else "two-row", **shape,
                **({"row_slots": cfg.share_length} if share else {})} | tokens_rec(rec, tokens, b)
    out = [b.attempt(f"dpo lora {pairs} pairs maxpost", 40, ours)]
    two = out[0]
    if tunix and b.tunix and tunix_name(b.model):
        def theirs():
            import jax
            step = dt.setup_tunix(b.hf_dir(), P, "bfloat16", lora, tunix_name(b.model))
            first = []
            def one():
                r = step(); first.append(r["logps_chosen"]); return r["loss"]
            rec = timed_steps(one, 2, b.steps) | {"hbm": hbm(), "logps_chosen_step1": first[0]}
            del step; gc.collect(); jax.clear_caches()
            return {"framework": "tunix", **shape} | tokens_rec(rec, tokens, b)
        out.append(b.attempt(f"dpo lora {pairs} pairs tunix", 200, theirs))
        c = compare(f"dpo lora {pairs} pairs", *out[-2:])
        if c: out.append(b.record(c))
    win, L = b.mcfg.sliding_window, prompt + 2 * response
    if win and L > win:
        out.append(b.record({"what": f"dpo lora {pairs} pairs maxpost shared", "event": "skipped", "why":
                             f"the shared row ({L} slots) is longer than {b.model}'s sliding window ({win})"}))
        return out
    sh = b.attempt(f"dpo lora {pairs} pairs maxpost shared", 40, lambda: ours(share=True))
    out.append(sh)
    if two and sh and "tokens_per_s" in two and "tokens_per_s" in sh:
        out.append(b.record({"what": f"dpo lora {pairs} pairs shared vs two-row", "event": "compare",
                             "shared_over_two_row": round(sh["tokens_per_s"] / two["tokens_per_s"], 3),
                             "loss_step1_two_row": two["loss_step1"], "loss_step1_shared": sh["loss_step1"],
                             "loss_step1_rel_diff": abs(sh["loss_step1"] - two["loss_step1"]) / max(abs(two["loss_step1"]), 1e-12),
                             "logps_chosen_step1_two_row": two["logps_chosen_step1"],
                             "logps_chosen_step1_shared": sh["logps_chosen_step1"]}))
    return out


def hbm_bandwidth(n_bytes: int = 1 << 29, reps: int = 5) -> float:
    "Bytes/s of a jitted elementwise pass over an `n_bytes` bf16 array (it reads and writes each byte): best of `reps`."
    import jax, jax.numpy as jnp
    x = jnp.ones((n_bytes // 2,), jnp.bfloat16)
    f = jax.jit(lambda v: v * 2)
    f(x).block_until_ready()
    best = min(st._timed(lambda: f(x).block_until_ready()) for _ in range(reps))
    del x
    return 2 * n_bytes / best


def sampler(b, rows: int, prompt: int, new: int, attention: str = "auto") -> dict:
    """The native engine's tokens/s (its own stats: generated tokens over the second generate() call's wall time,
    prefill included; `NativeEngine(decode_attention=attention)`: auto, xla or pallas) against the HBM bound: each
    decode step reads every weight once (N · 2 bytes, bf16) plus the KV cache of every row up to its current length,
    at the chip's nominal bandwidth where known, else the measured one."""
    import jax, jax.numpy as jnp
    from maxpost.checkpoint import empty_decoder
    from maxpost.engine import SamplingParams
    from maxpost.generate import NativeEngine
    m = b.mcfg
    eng = NativeEngine(empty_decoder(m, jnp.bfloat16, jnp.bfloat16), None, max_batch=rows, max_prefill=prompt,
                       max_len=prompt + new, stop_token_ids=(), decode_attention=attention)
    eng.sync_weights({k: jnp.asarray(v) for k, v in b.base.items()})
    ids = np.random.default_rng(0).integers(10, m.vocab_size, (rows, prompt)).tolist()
    sp = SamplingParams(temperature=1.0, max_tokens=new, n=1, seed=0, stop_token_ids=())
    t0 = time.perf_counter(); eng.generate(ids, sp); first = time.perf_counter() - t0
    eng.generate(ids, dataclasses.replace(sp, seed=1)); s = eng.stats
    kv_tok = m.num_layers * 2 * m.num_kv_heads * m.head_dim * 2
    step_bytes = m.num_params() * 2 + rows * (prompt + (new - 1) / 2) * kv_tok
    bw, src = b.hbm_bw()
    bound = rows / (step_bytes / bw)
    rec = {"model": b.model, "rows": rows, "prompt": prompt, "new_tokens": new, "decode_attention": attention,
           "first_call_s": round(first, 2),
           "tokens": s["tokens"], "seconds": round(s["seconds"], 3), "tokens_per_s": round(s["tokens_per_s"], 1),
           "decode_steps": int(sum(s["steps"])), "step_bytes_gb": round(step_bytes / 1e9, 3),
           "hbm_bw_gbps": round(bw / 1e9, 1), "hbm_bw_source": src, "hbm_bound_tokens_per_s": round(bound, 1),
           "fraction_of_bound": round(s["tokens_per_s"] / bound, 4),
           "bound_at_measured_bw_tokens_per_s": round(rows / (step_bytes / b._bw), 1), "hbm": hbm()}
    del eng; gc.collect(); jax.clear_caches()
    return rec


def synthetic_reward(prompts, completions, completion_ids=None, **kw):
    "The share of even token ids in each completion: a cheap reward that varies within a group."
    return [float(np.mean(np.asarray(c) % 2 == 0)) if len(c) else 0.0 for c in completion_ids]


def grpo_split(b, prompts: int, G: int, prompt: int, completion: int, steps: int = 2) -> dict:
    """`maxpost.rl.trainer.rl_step` (GRPO, LoRA, β = 0.04 so the reference log-probs are computed) on random prompts
    with `synthetic_reward`, the native engine with no stop token (every completion runs to its budget): the wall
    time of the rollout, the reference (and old-policy) log-probs, the update and the weight sync, per step."""
    import jax
    from maxpost.checkpoint import empty_decoder
    from maxpost.config import load_config
    from maxpost.engine import make_engine
    from maxpost.rl import RLConfig
    from maxpost.rl.config import loss_config
    from maxpost.rl.rollout import PromptStream
    from maxpost.rl.trainer import RLTrainer, rl_step
    from maxpost.train_rl import default_config
    argv = [f"model_name={b.model}", "use_lora=true", f"lora_rank={st.LORA_RANK}", f"lora_alpha={st.LORA_ALPHA}",
            f"lora_module_path={st.MAXPOST_TARGETS}", "loss_algo=grpo", "beta=0.04", f"batch_size={prompts}",
            f"num_generations={G}", f"max_prefill_predict_length={prompt}", f"max_completion_length={completion}",
            "dtype=bfloat16", "weight_dtype=bfloat16", "eval_before_after=false", "enable_tqdm=false"]
    cfg = load_config(RLConfig, argv, base_yaml=default_config()).for_backend()
    tr = RLTrainer(cfg, loss_config(cfg), b.mcfg, b.base)
    state = tr.init_state()
    T = prompt + completion
    eng = make_engine("native", empty_decoder(b.mcfg, tr.dtype, tr.wdtype), None, max_batch=prompts * G, max_len=T,
                      max_prefill=prompt, stop_token_ids=())
    eng.sync_weights(tr.host_engine_params(state))
    rng = np.random.default_rng(0)
    rows = [{"prompt_ids": rng.integers(10, b.mcfg.vocab_size, prompt).tolist(), "prompt": f"p{i}", "answer": "",
             "dataset_index": i} for i in range(4 * prompts)]
    stream, recs = PromptStream(rows, 0), []
    for i in range(steps):
        t0 = time.perf_counter()
        state, m, _ = rl_step(tr, state, eng, stream, [synthetic_reward], [1.0])
        wall = time.perf_counter() - t0
        t = {k[5:]: round(v, 3) for k, v in m.items() if k.startswith("time/")}
        recs.append(t | {"wall_s": round(wall, 3), "rollout_share": round(t["rollout"] / t["step"], 3),
                         "loss": m["loss"], "kl": m.get("kl"), "reward_mean": m["reward_mean"]})
    rec = {"model": b.model, "prompts": prompts, "G": G, "prompt": prompt, "completion": completion,
           "remat": cfg.remat_policy, "first_step": recs[0], "step": recs[-1], "hbm": hbm()}
    del tr, state, eng; gc.collect(); jax.clear_caches()
    return rec
