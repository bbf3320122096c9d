"""SFT throughput on a CPU: maxpost's SFTTrainer against Tunix's PeftTrainer with Tunix's own Gemma 3 model, on the
same weights (the embedded Gemma 3 270M, loaded by each framework from the same HF folder), the same batch and the
same optimisation, so that the two loss sequences agree step by step.

    python benchmarks/sft_throughput.py [--mode lora|full] [--batch 2] [--seq 256] [--steps 5] [--dtype float32]
    python benchmarks/sft_throughput.py --mode full --batch 4 --seq 512 --sequential   # full FT, peak RSS of each
    python benchmarks/sft_throughput.py --remat dots --baseline /tmp/base   # maxpost's remat_policy=dots vs the tree's
    python benchmarks/sft_throughput.py --rss [--batch 4] [--seq 512]   # peak RSS of a full fine-tune (maxpost CLI)
    python benchmarks/sft_throughput.py --step-hash   # hash of the lowered tiny train step: compare two code versions
    python benchmarks/sft_throughput.py --bf16-matmuls --baseline /tmp/base   # + maxpost with bf16_matmuls=true and
        # maxpost imported from /tmp/base (`git archive <commit> maxpost | tar -x -C /tmp/base`): before/after a change

Each trainer runs in its own subprocess (so that its peak RSS is its own); the parent sets both up one after the other,
runs one compiling step of each, then alternates them step by step over the timed steps so that both see the same
load. It prints the CPU (model, AVX2 / AVX-512 / AVX512_BF16 / AMX flags), jax, jaxlib and XLA_FLAGS, the load
average, the peak of a plain jitted matmul in the same dtype, tokens/s as median (min, max) of the timed steps, the
model-flops utilisation 6·N·tokens/s ÷ peak, the ratio maxpost / Tunix, each trainer's peak RSS, and the largest
difference between the two loss sequences.

Like for like (what made the losses part after step 1 before):
- LoRA A: maxpost draws A ~ N(0, 1/fan_in); Qwix's default is he_uniform (variance 2/fan_in), a √2 larger A and so a
  √2 larger effective step under Adam. Tunix here starts from maxpost's A (copied into Qwix's `lora_a`), B = 0 in both.
- LoRA targets: Tunix's Gemma 3 computes k and v in one `kv_einsum`, so Qwix gives k and v ONE shared A; maxpost has
  one adapter per weight. The comparison adapts q, o, gate, up, down in both (k and v frozen in both).
- Optimizer: both get maxpost's own `lr_schedule` (no warmup here), AdamW b1/b2/eps/weight decay and global-norm
  clipping from the same SFTConfig; norm scales are not decayed in either (matters under --mode full only).
- Loss: both are the mean NLL over the B·(T-1) next-token predictions (every token real, no padding).
"""
from __future__ import annotations
import argparse, json, os, platform, resource, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LORA_RANK, LORA_ALPHA, LR = 16, 32.0, 1e-4
MAXPOST_TARGETS = "wq|wo|w_gate|w_up|w_down"
TUNIX_TARGETS = ".*q_einsum|.*attn_vec_einsum|.*gate_proj|.*up_proj|.*down_proj"
TUNIX_A = {"wq": ("attn", "q_einsum", "w_lora_a"), "wo": ("attn", "attn_vec_einsum", "w_lora_a"),
           "w_gate": ("mlp", "gate_proj", "kernel_lora_a"), "w_up": ("mlp", "up_proj", "kernel_lora_a"),
           "w_down": ("mlp", "down_proj", "kernel_lora_a")}
BF16MM = "maxpost-bf16mm"  # the extra trainer of --bf16-matmuls
BASE = "maxpost-baseline"  # the extra trainer of --baseline: maxpost imported from another tree (before a change)
TAG = "@@bench "          # prefix of the workers' protocol lines on stdout (anything else they print is passed over)

def cpu_info() -> dict:
    "Model name and the matmul-relevant ISA flags of /proc/cpuinfo, the core count and MemAvailable."
    txt = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((l.split(":", 1)[1].strip() for l in txt.splitlines() if l.startswith("model name")), platform.processor())
    flags = set(next((l.split(":", 1)[1].split() for l in txt.splitlines() if l.startswith("flags")), []))
    isa = {f: f in flags for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")}
    mem = {l.split(":")[0]: int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines()[:3]} \
        if Path("/proc/meminfo").exists() else {}
    return {"model": model, "cores": os.cpu_count(), "isa": isa,
            "mem_available_gib": round(mem.get("MemAvailable", 0) / 2**20, 1)}

def machine_kind(ci: dict) -> str:
    "A short name of the CPU kind for RESULTS.md rows: model + the best matmul ISA."
    i = ci["isa"]
    isa = "AMX" if i["amx_bf16"] else "AVX-512+BF16" if i["avx512_bf16"] else "AVX-512" if i["avx512f"] else \
        "AVX2" if i["avx2"] else "no AVX2"
    return f"{ci['model']}, {ci['cores']} cores, {isa}"

def jax_info() -> dict:
    import jax, jaxlib
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "default_matmul_precision": str(jax.config.jax_default_matmul_precision), "devices": str(jax.devices())}

def matmul_peak(dtype: str, n: int = 2048, reps: int = 5) -> float:
    "Best FLOP/s of a jitted n×n×n jnp.dot of `dtype` inputs with float32 accumulation (the CPU's practical peak)."
    import jax, jax.numpy as jnp
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.dtype(dtype))
    f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))   # bf16 → f32: the AVX512_BF16 path
    f(a, a).block_until_ready()
    best = min(_timed(lambda: f(a, a).block_until_ready()) for _ in range(reps))
    return 2 * n ** 3 / best

def _timed(fn) -> float:
    t = time.perf_counter(); fn(); return time.perf_counter() - t

def make_tokens(vocab: int, batch: int, seq: int) -> np.ndarray:
    "Random token ids [batch, seq] (no padding), avoiding the special ids below 10."
    return np.random.default_rng(0).integers(10, vocab, (batch, seq), dtype=np.int32)

def sft_config(hf_dir, mode: str, B: int, T: int, dtype: str, bf16_matmuls: bool = False, remat: str = "none"):
    "The one SFTConfig both trainers take their LoRA and optimizer settings from."
    from maxpost.sft import SFTConfig
    return SFTConfig(model_name="gemma3-270m", load_parameters_path=str(hf_dir), use_lora=mode == "lora",
                     **({"bf16_matmuls": True} if bf16_matmuls else {}),   # (a --baseline tree may lack the key)
                     **({"remat_policy": remat} if remat != "none" else {}),
                     lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA, lora_module_path=MAXPOST_TARGETS, learning_rate=LR,
                     warmup_steps_fraction=0.0, steps=100, per_device_batch_size=B, max_target_length=T, dtype=dtype)

def maxpost_trainer(hf_dir, tokens, mode: str, dtype: str, bf16_matmuls: bool = False, remat: str = "none"):
    "(SFTTrainer, host batch) for `tokens`: every next-token prediction of the rows in the loss."
    from maxpost.sft import SFTTrainer, load_base
    B, T = tokens.shape
    cfg = sft_config(hf_dir, mode, B, T, dtype, bf16_matmuls, remat)
    mcfg, base, _ = load_base(cfg)
    tr = SFTTrainer(cfg, mcfg, base); del base
    targets = np.concatenate([tokens[:, 1:], np.zeros((B, 1), np.int32)], 1)
    mask = np.ones((B, T), np.float32); mask[:, -1] = 0
    return tr, dict(inputs=tokens, targets=targets, positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
                    segment_ids=np.ones((B, T), np.int32), loss_mask=mask)

def setup_maxpost(hf_dir, tokens, mode: str, dtype: str, lora_out: str | None, bf16_matmuls: bool = False,
                  remat: str = "none"):
    "A function that runs one maxpost SFT step on `tokens` and returns its loss (blocking); and N."
    tr, batch = maxpost_trainer(hf_dir, tokens, mode, dtype, bf16_matmuls, remat)
    box = {"state": tr.init_state()}
    if lora_out and mode == "lora":      # the initial A factors, for Tunix to start from the same adapters
        np.savez(lora_out, **{k: np.asarray(v["a"]) for k, v in box["state"]["params"].items()})
    def step():
        box["state"], m = tr.step(box["state"], batch)
        return float(m["loss"])
    return step, tr.mcfg.num_params()

def tunix_optimizer(cfg):
    "maxpost's schedule, AdamW and clipping (from `cfg`) over Tunix's param tree: no decay of norm scales."
    import jax, optax
    from maxpost.optimizer import lr_schedule
    sched = lr_schedule(cfg.learning_rate, cfg.steps, cfg.warmup_steps_fraction,
                        cfg.cosine_learning_rate_final_fraction, cfg.learning_rate_schedule_steps)
    decay = lambda params: jax.tree_util.tree_map_with_path(
        lambda path, _: "norm" not in jax.tree_util.keystr(path), params)
    chain = [optax.clip_by_global_norm(cfg.gradient_clipping_threshold)] if cfg.gradient_clipping_threshold > 0 else []
    chain.append(optax.adamw(sched, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps,
                             weight_decay=cfg.adam_weight_decay, mask=decay))
    return optax.chain(*chain)

def tunix_model_config(model: str = "gemma3-270m"):
    """Tunix's Gemma 3 ModelConfig for maxpost preset `model` (and `tiny-gemma3-all-sliding`, the tiny model with
    Tunix's fixed 5 sliding : 1 global pattern, which on 4 layers leaves every layer sliding)."""
    from tunix.models.gemma3 import model as gm
    if model == "gemma3-270m": return gm.ModelConfig.gemma3_270m()
    if model == "gemma3-1b": return gm.ModelConfig.gemma3_1b_pt()
    if model == "gemma3-4b": return gm.ModelConfig.gemma3_4b_pt()
    if model == "tiny-gemma3-all-sliding":
        return gm.ModelConfig(num_layers=4, num_embed=128, embed_dim=32, hidden_dim=64, num_heads=4, head_dim=16,
                              num_kv_heads=2, sliding_window_size=4, global_base_frequency=1_000_000)
    raise ValueError(f"no Tunix Gemma 3 config for model {model!r}")

def setup_tunix(hf_dir, tokens, mode: str, dtype: str, lora_in: str | None, model: str = "gemma3-270m"):
    """A function that runs one Tunix PeftTrainer step (its own train loop, one batch) and returns its loss;
    `model` names Tunix's config (`tunix_model_config`) for the weights in `hf_dir`."""
    import jax, jax.numpy as jnp, qwix
    from flax import nnx
    from tunix.models.gemma3 import model as gm, params_safetensors as gp
    from tunix.sft import peft_trainer, utils as su
    B, T = tokens.shape
    scfg = sft_config(hf_dir, mode, B, T, dtype)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    cfg = tunix_model_config(model)
    cfg.param_dtype = jnp.dtype(dtype)
    def gen_input(x):
        return dict(input_tokens=x.input_tokens, input_mask=x.input_mask,
                    positions=su.build_positions_from_mask(x.input_mask),
                    attention_mask=su.make_causal_attn_mask(x.input_mask))
    ex = peft_trainer.TrainingInput(input_tokens=jnp.asarray(tokens), input_mask=jnp.ones((B, T), bool))
    with mesh:
        model = gp.create_model_from_safe_tensors(str(hf_dir), cfg, mesh, dtype=jnp.dtype(dtype))
        if mode == "lora":
            prov = qwix.LoraProvider(module_path=TUNIX_TARGETS, rank=scfg.lora_rank, alpha=scfg.lora_alpha)
            inp = gen_input(ex)
            model = qwix.apply_lora_to_model(model, prov, inp["input_tokens"], inp["positions"], None,
                                             inp["attention_mask"], rngs=nnx.Rngs(0))
            st = nnx.state(model, nnx.LoRAParam)
            assert jax.tree.leaves(st), "qwix created no LoRA params"
            a0 = np.load(lora_in)
            for k, (blk, mod, name) in TUNIX_A.items():
                for l, layer in st["layers"].items():
                    v = layer[blk][mod][name]
                    assert v.value.shape == a0[k][l].shape, (k, v.value.shape, a0[k][l].shape)
                    v.value = jnp.asarray(a0[k][l], v.value.dtype)
            nnx.update(model, st)
        tr = peft_trainer.PeftTrainer(model, tunix_optimizer(scfg),
                                      peft_trainer.TrainingConfig(eval_every_n_steps=10**9))
        tr = tr.with_gen_model_input_fn(gen_input)
    tr.is_managed_externally = True          # one call of train() per batch; no max_steps, no close()
    losses, orig = [], tr._buffer_metrics
    def spy(buf, loss, step, additional_metrics=None):
        losses.append(loss); return orig(buf, loss=loss, step=step, additional_metrics=additional_metrics)
    tr._buffer_metrics = spy
    def step():
        with mesh: tr.train([ex])
        return float(jax.block_until_ready(losses[-1]))
    return step

def _vm_hwm_gib(pid: int) -> float:
    "Peak RSS so far (VmHWM) of a live process, GiB; 0 if it is gone."
    try: return int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM")).split()[1]) / 2**20
    except (OSError, StopIteration): return 0.0

def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20     # ru_maxrss is in KiB on Linux

def worker(name: str, a):
    "One trainer in this process: set up, then answer 'step' (loss, seconds) and 'done' (peak RSS) on stdin/stdout."
    from maxpost.convert.from_gguf import embedded_hf
    hf_dir = embedded_hf("gemma3-270m")
    tokens = make_tokens(262_144, a.batch, a.seq)
    t = time.perf_counter()
    if name.startswith("maxpost"):     # (BASE: the same code path, maxpost imported from --baseline)
        step, n = setup_maxpost(hf_dir, tokens, a.mode, a.dtype, a.lora_file if name == "maxpost" else None,
                                name == BF16MM, "none" if name == BASE else a.remat)
    else: step, n = setup_tunix(hf_dir, tokens, a.mode, a.dtype, a.lora_file), None
    say = lambda d: print(TAG + json.dumps(d), flush=True)
    say({"ready": True, "setup_s": time.perf_counter() - t, "n_params": n, "rss_after_setup_gib": _peak_rss_gib()})
    for line in sys.stdin:
        if line.strip() == "step":
            t = time.perf_counter(); loss = step(); say({"loss": loss, "s": time.perf_counter() - t})
        elif line.strip() == "done":
            say({"peak_rss_gib": _peak_rss_gib()}); return

class Worker:
    "A trainer in a subprocess of this script."
    def __init__(self, name: str, a, lora_file: str):
        args = [sys.executable, __file__, "--worker", name, "--mode", a.mode, "--batch", str(a.batch),
                "--seq", str(a.seq), "--dtype", a.dtype, "--lora-file", lora_file, "--remat", a.remat]
        env = os.environ | {"PYTHONUNBUFFERED": "1"} | ({"PYTHONPATH": a.baseline} if name == BASE else {})
        self.name, self.p = name, subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                                   cwd=ROOT, env=env)
    def read(self) -> dict:
        for line in self.p.stdout:
            if line.startswith(TAG): return json.loads(line[len(TAG):])
        raise SystemExit(f"{self.name} worker ended (exit {self.p.wait()}): out of memory or an error above")
    def ask(self, cmd: str) -> dict:
        self.p.stdin.write(cmd + "\n"); self.p.stdin.flush(); return self.read()

def bench(a) -> dict:
    "Both trainers set up in turn (maxpost first: Tunix starts from its LoRA A), a compile step each, then alternation."
    lora_file = str(Path(tempfile.mkdtemp()) / "lora_a.npz")
    names = ["maxpost"] + ([BASE] if a.baseline else []) + ([BF16MM] if a.bf16_matmuls else []) + \
        ([] if a.skip_tunix else ["tunix"])
    ws, out = {}, {}
    if a.sequential:      # one trainer alive at a time: the memory of the larger one, not of both
        if a.mode == "full": names = names[-1:] + names[:-1] if names[-1] == "tunix" else names   # (no LoRA A to share)
        for k in names:
            hwm = 0.0
            try:
                ws[k] = Worker(k, a, lora_file); out[k] = ws[k].read() | {"losses": [], "step_s": []}
                out[k]["load_avg_before"] = os.getloadavg()
                r = ws[k].ask("step"); out[k]["losses"].append(r["loss"]); out[k]["first_step_s"] = r["s"]
                for _ in range(a.steps):
                    hwm = max(hwm, _vm_hwm_gib(ws[k].p.pid))
                    r = ws[k].ask("step"); out[k]["losses"].append(r["loss"]); out[k]["step_s"].append(r["s"])
                out[k] |= ws[k].ask("done") | {"load_avg_after": os.getloadavg()}; ws[k].p.wait()
            except (SystemExit, OSError) as e:     # killed (out of memory): say so and go on with the next trainer
                out[k] = {"failed": str(e), "vm_hwm_gib_before_last_step": hwm, "load_avg_after": os.getloadavg()}
            print(f"{k} done: {json.dumps(out[k])}", flush=True)     # kept if a later trainer is killed
        return out
    for k in names:
        ws[k] = Worker(k, a, lora_file); out[k] = ws[k].read() | {"losses": [], "step_s": []}
    for k in names:
        r = ws[k].ask("step"); out[k]["losses"].append(r["loss"]); out[k]["first_step_s"] = r["s"]
    for _ in range(a.steps):
        for k in names:
            r = ws[k].ask("step"); out[k]["losses"].append(r["loss"]); out[k]["step_s"].append(r["s"])
    for k in names:
        out[k] |= ws[k].ask("done"); ws[k].p.wait()
    return out

def rss_run(hf_dir, batch: int, seq: int, steps: int = 2) -> dict:
    "Peak RSS of `python -m maxpost.train_sft` doing a full fine-tune of Gemma 3 270M (synthetic ids, float32)."
    out = Path(tempfile.mkdtemp())
    args = ["model_name=gemma3-270m", f"load_parameters_path={hf_dir}", "dataset_type=synthetic",
            "synthetic_task=copy", f"per_device_batch_size={batch}", f"max_target_length={seq}", f"steps={steps}",
            "eval_interval=0", "enable_checkpointing=false", "save_model=false", "enable_tqdm=false",
            "num_train_rows=2048", "run_name=rss", f"base_output_directory={out}"]
    r = subprocess.run([sys.executable, "-m", "maxpost.train_sft", *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode: raise SystemExit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])

def step_hash() -> dict:
    "Hash of the lowered SFT train step (StableHLO, no debug locations) of tiny-gemma3, full and LoRA, and its first loss."
    import hashlib, re
    from maxpost.data import SFTDataIterator
    from maxpost.sft import SFTConfig, SFTTrainer, model_config, random_params, synthetic_examples
    mcfg = model_config("tiny-gemma3"); base = random_params(mcfg, 0)
    b = next(SFTDataIterator(synthetic_examples(64, mcfg.vocab_size, "copy"), 8, 64, seed=0))
    out = {}
    for mode in ("full", "lora"):
        cfg = SFTConfig(model_name="tiny-gemma3", max_target_length=64, per_device_batch_size=8, loss_chunk_size=128,
                        use_lora=mode == "lora", lora_rank=4)
        tr = SFTTrainer(cfg, mcfg, base); st = tr.init_state()
        txt = re.sub(r"loc\([^)]*\)", "", tr._step.lower(st, tr.frozen, tr.put_batch(b)).as_text(debug_info=False))
        _, m = tr.step(st, b)
        out[mode] = {"hlo_sha1": hashlib.sha1(txt.encode()).hexdigest()[:16], "loss": float(m["loss"]),
                     "grad_norm": float(m["grad_norm"])}
    return out

def profile(a, reps: int = 3) -> dict:
    """maxpost's step split per op class, each part its own jitted program on the same batch: the decoder forward
    without LoRA (dense matmuls + attention), with LoRA, forward + backward to the trained params, the loss (fused
    head forward + backward to h; to the head too under full fine-tuning), the optimizer update, and the whole step.
    Seconds (median of `reps` after a warm-up), the matmul flops of each part counted by hand (XLA's cost analysis
    counts the body of a scan once, not once per layer), and FLOP/s ÷ matmul peak. Flops: 2·(layer params)·tokens
    per dense pass, 4·L·B·T²·H·hd for attention's two products, 2·(LoRA params)·tokens per LoRA pass, 2·V·d·tokens
    per head pass; LoRA's backward forms dx of the dense layers but no frozen-weight gradient."""
    import jax, jax.numpy as jnp, optax
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.head_loss import fused_nll_sum, head_weight
    tokens = make_tokens(262_144, a.batch, a.seq)
    tr, hb = maxpost_trainer(embedded_hf("gemma3-270m"), tokens, a.mode, a.dtype, a.bf16_matmuls, a.remat)
    st = tr.init_state(); db = tr.put_batch(hb); mb = jax.tree.map(lambda x: x[0], db)
    params, frozen, cfg, mcfg = st["params"], tr.frozen, tr.cfg, tr.mcfg
    def hidden(p, fz, mb, use_lora=True):
        model, lora = tr.model_inputs(p, fz)
        return model(mb["inputs"], mb["positions"], mb["segment_ids"], return_hidden=True,
                     lora=lora if use_lora else None)[0]
    ct = jax.random.normal(jax.random.key(1), (a.batch, a.seq, mcfg.hidden_size), jnp.float32)
    h0 = jax.jit(hidden)(params, frozen, mb)
    def loss_h(h, p, fz):
        model, _ = tr.model_inputs(p, fz)
        return fused_nll_sum(h.reshape(-1, h.shape[-1]), head_weight(model), mb["targets"].reshape(-1),
                             mb["loss_mask"].reshape(-1), mcfg.final_logit_softcapping, cfg.loss_chunk_size,
                             not cfg.use_lora, jnp.bfloat16 if cfg.bf16_matmuls else None)
    parts = {
        "decoder forward, no LoRA (dense + attention)": (lambda p, fz: hidden(p, fz, mb, False), (params, frozen)),
        "decoder forward with LoRA": (lambda p, fz: hidden(p, fz, mb), (params, frozen)),
        "decoder forward + backward": (jax.grad(lambda p, fz: jnp.vdot(hidden(p, fz, mb), ct)), (params, frozen)),
        "loss: head forward + backward": (jax.grad(loss_h, argnums=(0, 1) if not cfg.use_lora else 0),
                                          (h0, params, frozen)),
        "optimizer (clip + AdamW)": (lambda p, o: optax.apply_updates(p, tr.opt.update(p, o, p)[0]),
                                     (params, st["opt_state"])),
    }
    from maxpost.model import param_shapes
    import math
    ntok, L, T = a.batch * a.seq, mcfg.num_layers, a.seq
    n_layer = sum(math.prod(s) for k, s in param_shapes(mcfg).items() if k not in ("embed", "lm_head", "final_norm"))
    n_lora = sum(x.size for x in jax.tree.leaves(params)) if cfg.use_lora else 0
    dense, attn, lora = 2 * n_layer * ntok, 4.0 * L * a.batch * T * T * mcfg.num_heads * mcfg.head_dim, 2 * n_lora * ntok
    head = 2 * mcfg.vocab_size * mcfg.hidden_size * ntok
    bwd = (dense + 2 * attn + 2 * lora) if cfg.use_lora else (2 * dense + 2 * attn)   # dx (+ dW: full) + LoRA dA, dB
    flops = [dense + attn, dense + attn + lora, dense + attn + lora + bwd, head * (2 if cfg.use_lora else 3), float("nan")]
    out = {}
    for (name, (fn, args)), fl in zip(parts.items(), flops):
        c = jax.jit(fn).lower(*args).compile()
        jax.block_until_ready(c(*args))
        ts = [_timed(lambda: jax.block_until_ready(c(*args))) for _ in range(reps)]
        out[name] = {"s": statistics.median(ts), "flops": float(fl)}
    state = {"s": st}
    def one():
        state["s"], m = tr.step(state["s"], hb); jax.block_until_ready(m["loss"])
    one()
    out["whole step"] = {"s": statistics.median([_timed(one) for _ in range(reps)]), "flops": float("nan")}
    out["whole step"]["flops"] = flops[2] + flops[3]
    return out

def summary(res: dict) -> str:
    a, ci = res["config"], res["cpu"]
    flags = " ".join(f"{k}={'y' if v else 'n'}" for k, v in ci["isa"].items())
    lines = [f"CPU: {ci['model']}, {ci['cores']} cores; {flags}",
             f"jax {res['jax']['jax']}, jaxlib {res['jax']['jaxlib']}, XLA_FLAGS={res['jax']['XLA_FLAGS']!r}",
             f"load average at start {res['load_avg_start']}, at end {res['load_avg_end']}",
             f"{a['mode']} SFT, Gemma 3 270M, batch {a['batch']} x {a['seq']}, {a['dtype']}, maxpost remat_policy "
             f"{a.get('remat', 'none')}; matmul peak "
             f"{res['peak_flops'] / 1e9:.1f} GFLOP/s (before {res['peak_flops_before'] / 1e9:.1f}, after "
             f"{res['peak_flops_after'] / 1e9:.1f}); {a['steps']} timed steps, " + ("one trainer after the other" if a.get('sequential') else "alternating")]
    for k in ("maxpost", BASE, BF16MM, "tunix"):
        if k in res:
            r = res[k]
            lines.append(f"  {k:8s} {r['tokens_per_s']:7.1f} tok/s (min {r['tokens_per_s_min']:.1f}, max "
                         f"{r['tokens_per_s_max']:.1f})  MFU(6N) {r['mfu_6N']:.3f}  first step {r['first_step_s']:.1f} s"
                         f"  peak RSS {r['peak_rss_gib']:.2f} GiB  losses {[round(x, 4) for x in r['losses']]}")
    for k, v in res.get("failed", {}).items():
        lines.append(f"  {k:8s} FAILED ({v['failed']}); peak RSS before its last step {v['vm_hwm_gib_before_last_step']:.2f} GiB")
    if "tunix" in res:
        lines.append(f"  maxpost / Tunix = {res['ratio_maxpost_over_tunix']:.2f} (median of per-round ratios "
                     f"{res['ratio_paired_median']:.2f}); peak RSS maxpost / Tunix = {res['rss_ratio']:.2f}; "
                     f"max |loss difference| = {res['max_loss_diff']:.2e}")
    if BASE in res:
        lines.append(f"  maxpost / {BASE} = {res['ratio_maxpost_over_baseline']:.2f} (median of per-round ratios "
                     f"{res['ratio_baseline_paired']:.2f}); max |loss difference| = {res['baseline_max_loss_diff']:.2e}")
    if BF16MM in res:
        lines.append(f"  {BF16MM} / maxpost = {res['ratio_bf16mm_over_maxpost']:.2f} (median of per-round ratios "
                     f"{res['ratio_bf16mm_paired_median']:.2f})" + (f"; {BF16MM} / Tunix = {res['ratio_bf16mm_over_tunix']:.2f}"
                     if "tunix" in res else "") + f"; max |loss difference| to maxpost = {res['bf16mm_max_loss_diff']:.2e}")
    return "\n".join(lines)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["lora", "full"], default="lora")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5, help="timed steps after the compile step (at least 5)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--skip-tunix", action="store_true")
    ap.add_argument("--sequential", action="store_true",
                    help="run the trainers one after the other (not alternating): peak memory of one trainer only")
    ap.add_argument("--rss", action="store_true", help="measure peak RSS of a full fine-tune (maxpost CLI) instead")
    ap.add_argument("--step-hash", action="store_true", help="print the hash of the lowered tiny train step instead")
    ap.add_argument("--profile", action="store_true", help="maxpost's step per op class against the matmul peak")
    ap.add_argument("--bf16-matmuls", action="store_true",
                    help="also run maxpost with bf16_matmuls=true (bfloat16 matmul inputs, float32 accumulation)")
    ap.add_argument("--remat", choices=["none", "full", "dots"], default="none",
                    help="maxpost's remat_policy (not the --baseline tree's: it keeps its default)")
    ap.add_argument("--baseline", help="also run maxpost imported from this tree (e.g. `git archive` of the commit "
                    "before a change), alternating with the others")
    ap.add_argument("--worker", choices=["maxpost", BASE, BF16MM, "tunix"], help=argparse.SUPPRESS)
    ap.add_argument("--lora-file", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker: return worker(a.worker, a)
    if a.step_hash: print(json.dumps(step_hash())); return
    if a.profile:
        peak = matmul_peak(a.dtype); la = os.getloadavg(); prof = profile(a); la2 = os.getloadavg()
        print(f"CPU {machine_kind(cpu_info())}; load average {la} -> {la2}; matmul peak {peak / 1e9:.1f} GFLOP/s")
        step_s = prof["whole step"]["s"]
        for k, v in prof.items():
            print(f"  {k:48s} {v['s']:7.3f} s  {v['s'] / step_s:6.1%} of the step  {v['flops'] / 1e9:8.1f} GFLOP  "
                  f"{v['flops'] / v['s'] / peak:5.2f} of peak")
        return
    if a.rss:
        from maxpost.convert.from_gguf import embedded_hf
        print(json.dumps(rss_run(embedded_hf("gemma3-270m"), a.batch, a.seq))); return
    if a.steps < 5: ap.error("--steps must be at least 5")
    res = {"config": {k: v for k, v in vars(a).items() if k not in ("worker", "lora_file")}, "cpu": cpu_info(),
           "jax": jax_info(), "load_avg_start": os.getloadavg()}
    res["machine_kind"] = machine_kind(res["cpu"])
    res["peak_flops_before"] = matmul_peak(a.dtype)
    res |= bench(a)
    res["failed"] = {k: res.pop(k) for k in list(res) if isinstance(res[k], dict) and "failed" in res[k]}
    res["peak_flops_after"] = matmul_peak(a.dtype)
    res["load_avg_end"] = os.getloadavg()
    peak = res["peak_flops"] = max(res["peak_flops_before"], res["peak_flops_after"])
    ntok, N = a.batch * a.seq, res["maxpost"]["n_params"]
    for k in ("maxpost", BASE, BF16MM, "tunix"):
        if k in res:
            r = res[k]; s = r["step_s"]
            r |= {"tokens_per_s": ntok / statistics.median(s), "tokens_per_s_min": ntok / max(s),
                  "tokens_per_s_max": ntok / min(s), "mfu_6N": 6 * N * ntok / statistics.median(s) / peak}
    if "tunix" in res:
        m, t = res["maxpost"], res["tunix"]
        res["ratio_maxpost_over_tunix"] = m["tokens_per_s"] / t["tokens_per_s"]
        res["ratio_paired_median"] = statistics.median(b / a_ for a_, b in zip(m["step_s"], t["step_s"]))
        res["rss_ratio"] = m["peak_rss_gib"] / t["peak_rss_gib"]
        res["max_loss_diff"] = max(abs(x - y) for x, y in zip(m["losses"], t["losses"]))
    if BASE in res:
        m, b = res["maxpost"], res[BASE]
        res["ratio_maxpost_over_baseline"] = m["tokens_per_s"] / b["tokens_per_s"]
        res["ratio_baseline_paired"] = statistics.median(y / x for x, y in zip(m["step_s"], b["step_s"]))
        res["baseline_max_loss_diff"] = max(abs(x - y) for x, y in zip(m["losses"], b["losses"]))
    if BF16MM in res:
        m, b = res["maxpost"], res[BF16MM]
        res["ratio_bf16mm_over_maxpost"] = b["tokens_per_s"] / m["tokens_per_s"]
        res["ratio_bf16mm_paired_median"] = statistics.median(x / y for x, y in zip(m["step_s"], b["step_s"]))
        res["bf16mm_max_loss_diff"] = max(abs(x - y) for x, y in zip(m["losses"], b["losses"]))
        if "tunix" in res: res["ratio_bf16mm_over_tunix"] = b["tokens_per_s"] / res["tunix"]["tokens_per_s"]
    print(json.dumps(res, indent=1, default=str))
    print("\n" + summary(res))

if __name__ == "__main__":
    main()
