"""Every trainer, the native engine, the evaluation and the vLLM weight sync on a single host's mesh: one process with
4 virtual CPU devices runs one optimizer step of `maxpost.sft.train`, `maxpost.dpo.train` (two rows per pair, and
one shared row with `dpo.share_prompt`) and `maxpost.rl.train` (the CLIs' configs, in process) on one device
(chips_per_vm=1), on fsdp=4 and on fsdp=2 × tensor=2, and generates from weights placed on those meshes. The tests
compare the first step's loss and gradient norm, and the engine's tokens and log-probs, with the one-device run.

Tolerance: the runs differ only in the order in which float32 sums are taken (rows split over fsdp; heads, MLP and
vocabulary columns over tensor; then all-reduced). A sum of n terms of total size S rounds to about sqrt(n)·u·S
(u = 6e-8): DPO's loss is β (0.1) times differences of log-prob sums of about 80 nats, so about 1e-6 on the loss.
Measured (2-core x86 CPU, LLVM -O0): loss differences up to 2.4e-6 relative (DPO with a reference model; SFT: 0;
DPO at log 2: 7e-7 absolute; RL: 3e-8 absolute on a loss of 0.03), gradient norms up to 1.3e-6 relative, engine
log-probs up to 1e-6. The bounds: 2e-5 on the loss (relative, absolute below 1), 1e-4 relative on the gradient norm
(tests/test_sft.py's), 1e-5 on a log-prob: about 10× and 100× the noise, far below what a wrong batch, a missing
all-reduce or a mis-placed weight gives (perturbing the weights by 0.02 moves DPO's first loss from 0.693 to 1.149)."""
import json, os, subprocess, sys, time
from pathlib import Path
import pytest
from conftest import xla_cache

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import json, sys, tempfile, time, traceback
from pathlib import Path
import numpy as np, jax, jax.numpy as jnp
from maxpost.config import load_config
from maxpost.model import PARAM_AXES, param_shapes
from maxpost.sharding import make_mesh, tree_shardings
from maxpost.sft import SFTConfig, model_config, random_params, train as sft_train
from maxpost.dpo import DPOConfig, train as dpo_train
from maxpost.rl.config import RLConfig
from maxpost.rl.trainer import train as rl_train
import maxpost.train_sft, maxpost.train_dpo, maxpost.train_rl
assert len(jax.devices()) == 4, jax.devices()
ref_ckpt, work = sys.argv[1], Path(tempfile.mkdtemp())
MESHES = {"one": ["chips_per_vm=1"], "fsdp": ["ici_fsdp_parallelism=4"],
          "tensor": ["ici_fsdp_parallelism=-1", "ici_tensor_parallelism=2"]}

def digits(prompts, completions, **kw):
    "A reward that varies on a random model's completions, so that the advantages (and the gradient) are not 0."
    return [float(sum(c.isdigit() for c in s)) for s in completions]

# name: (config class, its CLI module, train, argv, keys of the first step's metrics)
TRAINERS = {
    "sft": (SFTConfig, maxpost.train_sft, sft_train,
            ["max_target_length=32", "per_device_batch_size={b8}", "eval_interval=0"], ("loss", "grad_norm")),
    "dpo_full": (DPOConfig, maxpost.train_dpo, dpo_train,
                 ["per_device_batch_size={b4}", "num_train_rows=16", "eval_interval=0"],
                 ("loss", "grad_norm", "rewards/margins")),
    "dpo_lora_ref": (DPOConfig, maxpost.train_dpo, dpo_train,
                     ["per_device_batch_size={b4}", "num_train_rows=16", "eval_interval=0", "use_lora=true",
                      "lora_rank=4", f"dpo.reference_model_path={ref_ckpt}"], ("loss", "grad_norm", "rewards/margins")),
    "dpo_share": (DPOConfig, maxpost.train_dpo, dpo_train,     # one row per pair (tiny-llama: no sliding window)
                  ["model_name=tiny-llama", "per_device_batch_size={b4}", "num_train_rows=16", "eval_interval=0",
                   "use_lora=true", "lora_rank=4", "dpo.share_prompt=true", "dpo.max_response_length=24"],
                  ("loss", "grad_norm", "rewards/margins")),
    "rl_grpo_lora": (RLConfig, maxpost.train_rl, rl_train,
                     ["batch_size=4", "num_generations=4", "use_lora=true", "lora_rank=4", "eval_before_after=false",
                      "log_completions=16"], ("loss", "grad_norm", "kl", "reward_mean", "pg_loss")),
}
out = {}
for mesh, mesh_args in MESHES.items():
    n = 1 if mesh == "one" else 4
    for name, (cls, cli, train, argv, keys) in TRAINERS.items():
        argv = [a.format(b8=8 / n, b4=4 / n) for a in argv]
        common = ["model_name=tiny-gemma3", "steps=1", "enable_checkpointing=false", "save_model=false",
                  "enable_tqdm=false", f"base_output_directory={work}", f"run_name={name}-{mesh}"]
        t0 = time.process_time()
        try:
            cfg = load_config(cls, common + argv + mesh_args, base_yaml=cli.default_config())
            r = train(cfg, [digits]) if train is rl_train else train(cfg)
            m = json.loads((Path(r["run_dir"]) / "metrics.jsonl").read_text().splitlines()[0])
            got = {k: m[k] for k in keys} | {"mesh": dict(cfg.mesh().shape)}
            if train is rl_train: got["completions"] = (Path(r["run_dir"]) / "completions.jsonl").read_text()
        except Exception as e:
            traceback.print_exc()
            got = {"error": f"{type(e).__name__}: {e}"}
        out[f"{name}|{mesh}"] = got
        print(name, mesh, f"{time.process_time() - t0:.1f} s CPU", {k: v for k, v in got.items() if k != "completions"},
              file=sys.stderr, flush=True)

# the native engine, the evaluation and the vLLM weight sync from weights placed on each mesh
from maxpost.checkpoint import empty_decoder
from maxpost.engine import SamplingParams, make_engine
from maxpost.evaluate import EvalConfig, evaluate, render_prompts
from maxpost.rewards import load_gsm8k
from maxpost.testing import DigitTokenizer
from maxpost.vllm_engine import VLLMEngine, hf_weights

class ChatDigits(DigitTokenizer):
    "The digit tokenizer with a chat template (the question's first digits, then '=') and every id decoded."
    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=True):
        return "".join(c for c in msgs[-1]["content"] if c.isdigit())[:12] + "="
    def decode(self, ids, skip_special_tokens=True): return " ".join(str(int(i)) for i in ids)

class FakeLLM:
    "What VLLMEngine.sync_weights calls on vllm.LLM: the streamed (HF name, torch tensor) pairs are kept."
    def collective_rpc(self, method, args=(), kwargs=None):
        self.got = {n: t.numpy().copy() for n, t in kwargs["weights_iterator"]}
    def reset_prefix_cache(self): pass

mcfg = model_config("tiny-gemma3"); params = random_params(mcfg, 0)
tok, rows = ChatDigits(), load_gsm8k("test", 4)
ecfg = EvalConfig(num_eval_examples=4, max_completion_length=8, batch_size=4, max_prefill_length=32)
prompts = [ids for _, ids in render_prompts(rows, tok, ecfg)]
sp = SamplingParams(temperature=1.0, max_tokens=8, seed=3, stop_token_ids=(2,))
hf_plain = dict(hf_weights(params, mcfg))
for mesh, (f, t) in {"one": (1, 1), "fsdp": (4, 1), "tensor": (-1, 2)}.items():
    t0 = time.process_time()
    try:
        sh = tree_shardings(make_mesh(f, t, jax.devices()[:1] if mesh == "one" else None), PARAM_AXES, param_shapes(mcfg))
        placed = {k: jax.device_put(v, sh[k]) for k, v in params.items()}
        model = empty_decoder(mcfg)                       # a Decoder holding the placed weights (evaluate's input)
        for k, v in placed.items(): getattr(model, k)[...] = v
        res = make_engine("native", model, tok, max_batch=4, max_prefill=32).generate(prompts, sp)
        synced = make_engine("native", empty_decoder(mcfg), tok, max_batch=4, max_prefill=32)   # RL's path
        synced.sync_weights(placed)
        res2 = synced.generate(prompts, sp)
        _, recs = evaluate(model, tok, rows, ecfg, progress=False)
        eng = object.__new__(VLLMEngine)                  # sync_weights without vLLM: the HF tensors it streams
        eng.cfg, eng.dtype, eng.multiprocessing, eng.llm, eng.stats = mcfg, "float32", False, FakeLLM(), {}
        eng.sync_weights(placed)
        got = dict(tokens=[r.token_ids for r in res], logprobs=[r.logprobs.tolist() for r in res],
                   synced_same=[r.token_ids for r in res2] == [r.token_ids for r in res] and
                               all(np.array_equal(a.logprobs, b.logprobs) for a, b in zip(res, res2)),
                   eval=[r["completions"] for r in recs], spec=str(placed["wq"].sharding.spec),
                   vllm_names=sorted(eng.llm.got) == sorted(hf_plain),
                   vllm_max_diff=max(float(np.abs(eng.llm.got[k] - np.asarray(v)).max()) for k, v in hf_plain.items()))
    except Exception as e:
        traceback.print_exc()
        got = {"error": f"{type(e).__name__}: {e}"}
    out[f"engine|{mesh}"] = got
    print("engine", mesh, f"{time.process_time() - t0:.1f} s CPU", got.get("error") or got["tokens"][0], file=sys.stderr,
          flush=True)
print(json.dumps(out))
'''

@pytest.fixture(scope="module")
def results(tmp_path_factory):
    "The script's JSON: one process, 4 virtual CPU devices, one XLA compilation cache for the module."
    from maxpost.checkpoint import save_checkpoint
    from maxpost.model import model_config, random_params
    import numpy as np
    tmp = tmp_path_factory.mktemp("mesh")
    # the reference model of dpo.reference_model_path: the starting weights, perturbed (step 1's loss is then not log 2)
    mcfg = model_config("tiny-gemma3"); p = random_params(mcfg, 0); rng = np.random.default_rng(1)
    ref = save_checkpoint(tmp / "ref", {k: v + 0.02 * rng.standard_normal(v.shape, np.float32) for k, v in p.items()},
                          mcfg, model_name="tiny-gemma3")
    # LLVM at -O0: each program runs once or twice and compiling is most of the cost (RL's step: 23 → 14 s of CPU)
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
             " --xla_backend_optimization_level=0").strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=xla_cache(tmp))
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ref)], capture_output=True, text=True, cwd=ROOT, timeout=900,
                       env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    print(f"mesh script: {time.time() - t0:.0f} s")
    return json.loads(r.stdout.strip().splitlines()[-1])

def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(b))

def _check_trainer(results, name: str, keys=("loss", "grad_norm")):
    one = results[f"{name}|one"]
    assert "error" not in one, one
    assert one["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1}, one
    for mesh, shape in (("fsdp", {"data": 1, "fsdp": 4, "tensor": 1}), ("tensor", {"data": 1, "fsdp": 2, "tensor": 2})):
        got = results[f"{name}|{mesh}"]
        assert "error" not in got, (name, mesh, got["error"])
        assert got["mesh"] == shape, got
        diffs = {k: got[k] - one[k] for k in keys}
        print(f"{name} {mesh}: " + ", ".join(f"{k} {one[k]:.9g} vs {got[k]:.9g} (diff {d:.2g})" for k, d in diffs.items()))
        assert _close(got["loss"], one["loss"], 2e-5), (name, mesh, got, one)
        assert abs(got["grad_norm"] - one["grad_norm"]) <= 1e-4 * one["grad_norm"], (name, mesh, got, one)
        for k in keys[2:]: assert _close(got[k], one[k], 2e-5), (name, mesh, k, got, one)
    return one

def test_sft_one_step_on_fsdp_and_tensor_meshes(results):
    _check_trainer(results, "sft")

def test_dpo_one_step_on_fsdp_and_tensor_meshes(results):
    """Full fine-tuning (the reference: the starting weights) and LoRA with `dpo.reference_model_path` (another
    checkpoint, placed like the base weights). Before the fix the reference pass declared its weights replicated and
    failed on any mesh of more than one device ("Sharding passed to jit does not match ...")."""
    one = _check_trainer(results, "dpo_full", ("loss", "grad_norm", "rewards/margins"))
    assert abs(one["loss"] - 0.6931472) < 1e-5 and one["grad_norm"] > 0     # policy = reference at step 1
    one = _check_trainer(results, "dpo_lora_ref", ("loss", "grad_norm", "rewards/margins"))
    assert abs(one["loss"] - 0.6931472) > 1e-2, one                        # the reference is another model

def test_dpo_shared_prompt_one_step_on_fsdp_and_tensor_meshes(results):
    """`dpo.share_prompt` (one row per pair, prefix-group segment ids) with LoRA on tiny-llama: the first step on fsdp=4
    and on fsdp=2 × tensor=2 is the one-device step (policy = reference at step 1: the loss is log 2)."""
    one = _check_trainer(results, "dpo_share", ("loss", "grad_norm", "rewards/margins"))
    assert abs(one["loss"] - 0.6931472) < 1e-5 and one["grad_norm"] > 0, one

def test_rl_grpo_one_step_on_fsdp_and_tensor_meshes(results):
    """GRPO with LoRA (rollouts by the native engine from the merged, sharded weights; KL to the base): the same
    completions on every mesh, then the same loss, KL and gradient norm."""
    one = _check_trainer(results, "rl_grpo_lora", ("loss", "grad_norm", "kl", "reward_mean", "pg_loss"))
    assert one["grad_norm"] > 0 and abs(one["loss"]) > 1e-4, one            # a reward that varies: a real update
    for mesh in ("fsdp", "tensor"):
        assert results[f"rl_grpo_lora|{mesh}"]["completions"] == one["completions"], mesh

def test_engine_evaluate_and_vllm_sync_from_sharded_weights(results):
    """The native engine (built from a Decoder holding sharded weights, and synced with them as RL does), `evaluate`
    and the HF tensors that `VLLMEngine.sync_weights` streams, from weights placed with `tree_shardings` on fsdp=4 and
    fsdp=2 × tensor=2: the same sampled tokens and log-probs (float32 summation order: 1e-5), the same greedy evaluation,
    and the vLLM tensors gathered exactly."""
    import numpy as np
    one = results["engine|one"]
    assert "error" not in one, one
    for mesh, want in (("fsdp", "fsdp"), ("tensor", "tensor")):
        got = results[f"engine|{mesh}"]
        assert "error" not in got, (mesh, got["error"])
        assert want in got["spec"], got["spec"]
        assert got["tokens"] == one["tokens"] and got["eval"] == one["eval"], mesh
        d = max(float(np.abs(np.subtract(a, b)).max()) for a, b in zip(got["logprobs"], one["logprobs"]))
        print(f"engine {mesh}: max |log-prob difference| {d:.2g}")
        assert d <= 1e-5, (mesh, d)
        assert got["synced_same"] and got["vllm_names"] and got["vllm_max_diff"] == 0.0, got
    assert one["synced_same"] and one["vllm_names"] and one["vllm_max_diff"] == 0.0, one
