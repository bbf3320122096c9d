"""SFT, DPO and RL on JAX's multi-process runtime, two processes on localhost (gloo collectives, `maxpost.launch`): 2 processes ×
4 CPU devices train exactly like 1 process × 8 devices, DPO and GRPO on 2 × 2 like 1 × 4 (also with rollout_mode=one_step_off), multi-turn
GRPO with the calculator on 2 × 1 like 1 × 2; a run whose process 1 is SIGKILLed resumes with the same
launch and logs the uninterrupted run's losses; bad multi-process input ends with one error line; a single TPU host (its
environment as JAX sees it on a one-chip v5e container, no metadata server) trains as one process."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import numpy as np
import pytest
from conftest import cli_env, read_metrics as _metrics, run_together

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8
ARGS = ["model_name=tiny-gemma3", "enable_tqdm=false", f"steps={STEPS}", "checkpoint_period=2",
        "per_device_batch_size=1", "eval_interval=8", "eval_steps=2", "eval_at_start=false", "save_model=true",
        "async_checkpointing=false", "initialization_timeout=120"]

# LLVM at -O0 (as tests/test_mesh.py): these runs compile far more than they compute, and every run a test compares
# uses the same flags (the launcher keeps them, setting only the device count)
O0 = "--xla_backend_optimization_level=0"

def _env(tmp: Path, devices: int | None = None) -> dict: return cli_env(tmp, devices, O0, PYTHONUNBUFFERED="1")

def _sft(*args) -> list[str]:
    return [sys.executable, "-m", "maxpost.train_sft", *args]

def _launch(n: int, m: int, *args) -> list[str]:
    return [sys.executable, "-m", "maxpost.launch", f"--num_processes={n}", f"--devices_per_process={m}", "--",
            *_sft(*args)]

def _check(r):
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r

def _one_and_two(module: str, args, tmp: Path, one_devices: int = 4, per_process: int = 2):
    """`python -m module args` as run `one` (1 process × `one_devices`) and run `two` (2 processes × `per_process`),
    side by side (`run_together`); both checked."""
    cmd = lambda *a: [sys.executable, "-m", module, *args, *a]
    one, two = run_together((cmd("run_name=one"), _env(tmp, one_devices)),
                            ([sys.executable, "-m", "maxpost.launch", "--num_processes=2",
                              f"--devices_per_process={per_process}", "--", *cmd("run_name=two")], _env(tmp)))
    return _check(one), _check(two)

def _params(run_dir) -> dict:
    from maxpost.checkpoint import load_params
    return load_params(Path(run_dir) / "model" / "params")

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    "One run of 1 process × 8 devices and one of 2 processes × 4 devices, same config and seed."
    tmp = tmp_path_factory.mktemp("multihost")
    out = [f"base_output_directory={tmp}"]
    t0 = time.time()
    one, two = run_together((_sft(*ARGS, *out, "run_name=one"), _env(tmp, 8)),
                            (_launch(2, 4, *ARGS, *out, "run_name=two"), _env(tmp)))
    _check(one); _check(two)
    print(f"1 process and 2 processes, side by side: {time.time() - t0:.0f} s")
    return tmp, two

def test_two_processes_train_like_one(runs):
    """Over 8 steps (global batch 8 × 64), 2 processes × 4 devices give the losses, gradient norms and held-out loss
    of 1 process × 8 devices, and the same weights after the run; only process 0 wrote the run's files."""
    tmp, two = runs
    one_m, two_m = _metrics(tmp / "one"), _metrics(tmp / "two")
    assert [m["step"] for m in two_m] == list(range(1, STEPS + 1))
    for a, b in zip(one_m, two_m):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * a["loss"], (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * a["grad_norm"], (a, b)
        assert a["tokens"] == b["tokens"] and a["loss_tokens"] == b["loss_tokens"]
    assert abs(one_m[-1]["eval_loss"] - two_m[-1]["eval_loss"]) <= 1e-5 * one_m[-1]["eval_loss"]
    assert one_m[-1]["loss"] < one_m[0]["loss"] - 0.1, "the run did not train"     # the comparison is not vacuous
    p1, p2 = _params(tmp / "one"), _params(tmp / "two")
    _assert_same_training(p1, p2)
    lines = two.stdout.splitlines()
    assert sum(l.startswith("[0] {") for l in lines) == 1 and sum(l.startswith("[1] {") for l in lines) == 1
    assert sorted(p.name for p in (tmp / "two").iterdir()) == \
        ["checkpoints", "config.yml", "metrics.jsonl", "model", "tensorboard"]

def _params_init(k):
    from maxpost.model import model_config, random_params
    return random_params(model_config("tiny-gemma3"), 0)[k]

def _assert_same_training(p1: dict, p2: dict, rel: float = 1e-2):
    """The two runs' weights moved the same way: |p2 - p1| / |p1 - p0| < rel in the 2-norm over all weights (p0 the
    shared random init). Adam divides each update by sqrt(v), so an element whose gradient is near 0 turns a 1e-7
    difference in summation order (2 processes sum in another order than 1) into up to one step's lr in that weight:
    a per-element bound flakes (max 1.5e-5 in one run, 3.1e-4 in another, of 8 SFT steps at lr 2e-2). A real split
    bug (a process's rows or gradients dropped or doubled) moves the whole update, a ratio of order 1."""
    assert sorted(p1) == sorted(p2)
    d = np.sqrt(sum(float(np.sum((p2[k].astype(np.float64) - p1[k]) ** 2)) for k in p1))
    moved = np.sqrt(sum(float(np.sum((p1[k].astype(np.float64) - _params_init(k)) ** 2)) for k in p1))
    print(f"weights: |two - one| / |one - init| = {d / moved:.2e} (|one - init| = {moved:.3e})")
    assert moved > 0 and d < rel * moved, (d, moved)

DPO_STEPS = 4
DPO_ARGS = ["model_name=tiny-gemma3", "dataset_type=synthetic", "enable_tqdm=false", f"steps={DPO_STEPS}",
            "checkpoint_period=0", "per_device_batch_size=1", "max_target_length=32", "loss_chunk_size=64",
            "num_train_rows=64", "num_eval_rows=16", "eval_interval=4", "eval_at_start=false", "learning_rate=1e-2",
            "warmup_steps_fraction=0", "use_lora=true", "lora_rank=4", "save_model=true", "async_checkpointing=false",
            "initialization_timeout=120"]

def test_dpo_two_processes_like_one(tmp_path):
    """LoRA DPO on synthetic pairs, 4 steps of 4 pairs and a held-out evaluation: 2 processes × 2 devices (every process
    iterates over the same global batches, each device takes its rows) log the losses, gradient norms, reward metrics and
    held-out accuracy of 1 process × 4 devices within float tolerance, end with the same weights, and only process 0
    wrote the run's files."""
    one, two = _one_and_two("maxpost.train_dpo", [*DPO_ARGS, f"base_output_directory={tmp_path}"], tmp_path)
    one_m, two_m = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert [m["step"] for m in two_m] == list(range(1, DPO_STEPS + 1))
    for a, b in zip(one_m, two_m):
        # the rewards are β (log π - log π_ref) of sums over ~25 tokens (|log π| ~ 50 nats): summed in another order,
        # they round like β |log π|, not like their own (small) size
        scale = {"rewards/margins": 0.1 * abs(a["logps/chosen"])}
        for k in ("loss", "grad_norm", "rewards/margins", "logps/chosen", "logps/rejected"):
            assert abs(a[k] - b[k]) <= 1e-5 * max(abs(a[k]), scale.get(k, 0), 1e-3), (a["step"], k, a[k], b[k])
        assert a["pairs"] == b["pairs"] == 4 and a["tokens"] == b["tokens"]
    for k in ("eval_loss", "eval_preference_accuracy"):
        assert abs(one_m[-1][k] - two_m[-1][k]) <= 1e-5 * max(abs(one_m[-1][k]), 1e-3), k
    assert one_m[-1]["loss"] < one_m[0]["loss"] - 0.01, "the run did not train"     # the comparison is not vacuous
    _assert_same_training(_params(tmp_path / "one"), _params(tmp_path / "two"))
    assert two.stdout.count('{"run_dir"') == 2, two.stdout[-3000:]        # each process printed its summary
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == \
        ["checkpoints", "config.yml", "metrics.jsonl", "model", "tensorboard"]

DISTILL_ARGS = ["model_name=tiny-gemma3", "enable_tqdm=false", "steps=4", "checkpoint_period=0", "eval_interval=4",
                "save_model=true", "async_checkpointing=false", "initialization_timeout=120", "use_lora=true",
                "lora_rank=4", "teacher_model_name=tiny-llama", "lmbda=0.5", "max_new_tokens=4",
                "per_device_batch_size=1"]

def test_on_policy_distill_two_processes_like_one(tmp_path):
    """On-policy distillation (TRL's `lmbda=0.5`: rollout_seed 0 makes step 3 the student's samples), LoRA student, random
    tiny-llama teacher: 2 processes × 2 devices log the losses and sampled-batch counts of 1 process × 4 devices and end
    with the same weights. Each process samples its own prompts, numbered in global row order (each number keys the
    prompt's random stream), and every process packs all the completions into the global batch: before that, each
    process sampled its prompts as if they were the first and packed only its own, and the student's step differed."""
    one, two = _one_and_two("maxpost.train_distill", [*DISTILL_ARGS, f"base_output_directory={tmp_path}"], tmp_path)
    one_m, two_m = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert [m["on_policy"] for m in one_m] == [m["on_policy"] for m in two_m] == [0, 0, 1, 0], one_m
    for a, b in zip(one_m, two_m):
        for k in ("sampled_prompts", "dropped_prompts", "sampled_tokens", "loss_tokens"):
            assert a[k] == b[k], (a["step"], k, a[k], b[k])
        for k in ("loss", "soft_loss", "hard_loss", "grad_norm"):
            assert abs(a[k] - b[k]) <= 1e-5 * max(abs(a[k]), 1e-3), (a["step"], k, a[k], b[k])
    assert one_m[2]["sampled_prompts"] > 0 and one_m[2]["sampled_tokens"] > 0   # the student's step sampled something
    _assert_same_training(_params(tmp_path / "one"), _params(tmp_path / "two"))
    assert two.stdout.count('{"run_dir"') == 2, two.stdout[-3000:]        # each process printed its summary

def test_sigkill_one_process_then_resume(runs):
    """SIGKILL process 1 after the checkpoint of step 2: the launcher stops process 0 and fails; the same launch
    resumes both processes from the last checkpoint and the 8 losses equal the uninterrupted 2-process run's."""
    tmp, _ = runs
    cmd = _launch(2, 4, *ARGS, f"base_output_directory={tmp}", "run_name=killed")
    p = subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid1 = None
    for line in p.stdout:                       # "[launch] process 1: pid N"
        if line.startswith("[launch] process 1: pid"): pid1 = int(line.split()[-1]); break
    assert pid1 is not None
    ckpt, t0 = tmp / "killed" / "checkpoints" / "2", time.time()
    while not ckpt.exists() and p.poll() is None and time.time() - t0 < 300: time.sleep(0.02)
    os.kill(pid1, signal.SIGKILL)
    rest = p.stdout.read(); p.wait(timeout=120)
    assert p.returncode != 0 and "process 1 exited with status -9" in rest, rest[-3000:]
    done = sorted(int(d.name) for d in (tmp / "killed" / "checkpoints").iterdir() if d.name.isdigit())
    assert STEPS not in done, "the run finished before the kill"
    r = _check(subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(tmp), timeout=600))
    assert "resumed from step" in r.stdout, r.stdout[-3000:]
    got, ref = _metrics(tmp / "killed"), _metrics(tmp / "two")
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))
    assert [m["loss"] for m in got] == [m["loss"] for m in ref]
    assert [m["grad_norm"] for m in got] == [m["grad_norm"] for m in ref]

def _one_error(r, *needles):
    errs = [l for l in r.stdout.splitlines() if "error:" in l]
    assert r.returncode != 0 and errs, f"exit {r.returncode}\n{r.stdout[-3000:]}"
    assert "Traceback" not in r.stdout, r.stdout[-3000:]
    for n in needles: assert n in errs[0], errs
    return errs

def test_bad_multiprocess_input(tmp_path):
    "num_processes against the launch, a dcn mesh that does not fit 2 processes: one error line, nothing written."
    out = [f"base_output_directory={tmp_path}", "run_name=bad"]
    run = lambda *a: subprocess.run(_launch(2, 2, *ARGS, *out, *a), capture_output=True, text=True, cwd=ROOT,
                                    env=_env(tmp_path), timeout=300)
    _one_error(run("num_processes=3"), "num_processes=3 but the launch started 2 processes")
    _one_error(run("dcn_data_parallelism=3"), "dcn_data_parallelism=3", "there are 2 processes")
    assert not (tmp_path / "bad").exists()

EVAL_SCRIPT = """
import re, sys, numpy as np
from maxpost.distributed import initialize
from maxpost.engine import GenerationResult
from maxpost.evaluate import EvalConfig, evaluate
class Tok:                                   # characters as ids: enough of the tokenizer interface
    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=True):
        return "".join(m["content"] for m in msgs)
    def encode(self, text, add_special_tokens=False): return [ord(c) % 256 for c in text]
    def decode(self, ids): return "".join(map(chr, ids))
class Engine:                                # deterministic: a function of the prompt and the sample's index
    tokenizer = Tok()
    def generate(self, prompts, sp, stream_ids=None):
        out = []
        for pi, ids in enumerate(prompts):
            for si in range(sp.n):
                a, b = re.findall(r"What is (\\d+) \\+ (\\d+)", self.tokenizer.decode(ids))[-1]
                n = int(a) + int(b) + (sum(ids) + si) % 2         # right for about half of the samples
                text = f"<reasoning>r</reasoning>\\n<answer>{n}</answer>"
                out.append(GenerationResult(pi, si, list(ids), self.tokenizer.encode(text), text,
                                            np.zeros(len(text), np.float32), "stop"))
        return out
cfg = EvalConfig(eval_mode="maj", num_eval_passes=3, batch_size=6, template="maxtext_gsm8k")
initialize(cfg)
rows = [dict(question=f"What is {i} + {i % 7}?", answer=f"#### {i + i % 7}") for i in range(20)]
evaluate(Engine(), None, rows, cfg, out_dir=sys.argv[1], progress=False)
"""

def test_evaluation_sharded_over_processes(tmp_path):
    """20 problems (maj@3, 2 problems per engine call) shared out over 2 processes: the merged completions.jsonl is
    byte-identical to one process's, and so is the summary (timings aside)."""
    script = tmp_path / "ev.py"; script.write_text(EVAL_SCRIPT)
    _check(subprocess.run([sys.executable, str(script), str(tmp_path / "one")], capture_output=True, text=True,
                          cwd=ROOT, env=_env(tmp_path), timeout=300))
    _check(subprocess.run([sys.executable, "-m", "maxpost.launch", "--num_processes=2", "--devices_per_process=1",
                           "--", sys.executable, str(script), str(tmp_path / "two")], capture_output=True, text=True,
                          cwd=ROOT, env=_env(tmp_path), timeout=300))
    a, b = [(tmp_path / d / "completions.jsonl").read_text() for d in ("one", "two")]
    assert a == b and len(a.splitlines()) == 20
    sa, sb = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two")]
    for s in (sa, sb):
        for k in ("seconds", "tokens_per_s"): s["eval"].pop(k)
    head = sa[sa["eval"]["headline"]]["value"]
    assert sa == sb and 0 < head < 1, sa                  # some problems right, some wrong: not a vacuous match

RL_STEPS = 3
RL_ARGS = ["model_name=tiny-gemma3", "enable_tqdm=false", f"steps={RL_STEPS}", "batch_size=8", "num_generations=4",
           "num_eval_rows=10", "num_eval_passes=2", "checkpoint_period=2", "async_checkpointing=false", "save_model=true",
           "initialization_timeout=120"]
DIGITS = """
def digits(prompts, completions, **kw):
    "A graded reward that the random tiny model already earns sometimes: the share of digits in the completion."
    return [sum(ch.isdigit() for ch in c) / 3 for c in completions]
"""

def _rl(*args) -> list[str]:
    return [sys.executable, "-m", "maxpost.train_rl", *args]

def _rl_one_and_two(args, tmp, one_devices: int, per_process: int, what: str):
    """`train_rl args` as run `one` (1 process × `one_devices`) and run `two` (2 processes × `per_process`), side by
    side (`run_together`), both checked; run two's result."""
    t0 = time.time()
    _, two = _one_and_two("maxpost.train_rl", args, tmp, one_devices, per_process)
    print(f"{what}, 1 process and 2 processes, side by side: {time.time() - t0:.0f} s")
    return two

def test_rl_two_processes_like_one(tmp_path):
    """GRPO on the tiny gemma (8 prompts × 4 samples, 2 iterations, KL to the reference, packed updates), 3 steps and an
    evaluation before and after: 2 processes × 2 devices, each sampling 4 of the prompts, log the rewards of 1 process ×
    4 devices exactly (every prompt samples from its own random stream) and the losses within float tolerance; the
    evaluations are identical and only process 0 wrote the run's files."""
    (tmp_path / "digits.py").write_text(DIGITS)
    args = [*RL_ARGS, f"reward_functions_path={tmp_path / 'digits.py'}:digits", f"base_output_directory={tmp_path}"]
    two = _rl_one_and_two(args, tmp_path, 4, 2, "RL")
    one_m, two_m = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert [m["step"] for m in two_m] == list(range(1, RL_STEPS + 1))
    for a, b in zip(one_m, two_m):
        for k in ("reward_mean", "reward_std", "rewards/digits/mean", "completion_length_mean", "truncation_rate",
                  "frac_reward_zero_std", "dropped_groups"):
            assert a[k] == b[k], (a["step"], k, a[k], b[k])                 # the same completions, the same rewards
        for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "ratio_mean", "last_ratio_max"):
            assert abs(a[k] - b[k]) <= 1e-5 * max(abs(a[k]), 1e-3), (a["step"], k, a[k], b[k])
    assert any(m["reward_std"] > 0 for m in one_m) and all(abs(m["pg_loss"]) > 1e-4 for m in one_m)   # not vacuous
    for f in ("eval_before.json", "eval_after.json"):
        assert json.loads((tmp_path / "one" / f).read_text()) == json.loads((tmp_path / "two" / f).read_text()), f
    assert json.loads((tmp_path / "two" / "eval_before.json").read_text())["digits"]["mean"] > 0
    lines = two.stdout.splitlines()
    assert sum(l.startswith("[0] {") for l in lines) == 1 and sum(l.startswith("[1] {") for l in lines) == 1
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
    p1, p2 = _params(tmp_path / "one"), _params(tmp_path / "two")
    _assert_same_training(p1, p2)

def test_rl_bad_multiprocess_input(tmp_path):
    "A batch of prompts that does not split into whole groups per process: one error line naming batch_size."
    r = subprocess.run(_rl("model_name=tiny-gemma3", "num_processes=2", "batch_size=3", f"base_output_directory={tmp_path}"),
                       capture_output=True, text=True, cwd=ROOT, env=_env(tmp_path), timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errs = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and "batch_size=3 prompts do not split over 2 processes" in errs[0], r.stderr[-3000:]

def test_rl_one_step_off_two_processes_like_one(tmp_path):
    """rollout_mode=one_step_off on 2 processes × 2 devices: each process samples step t+1's prompts in its own background
    thread (process-local engine, no collectives) while the update's cross-process collectives run on the main thread.
    3 GRPO steps log the rewards of 1 process × 4 devices exactly and the losses within float tolerance; the lag is
    visible (staleness 0, 1, 1; engine-vs-π_old gap > 0 from step 2) and corrected (token_truncate weights)."""
    (tmp_path / "digits.py").write_text(DIGITS)
    args = [*RL_ARGS, f"reward_functions_path={tmp_path / 'digits.py'}:digits", f"base_output_directory={tmp_path}",
            "rollout_mode=one_step_off", "eval_before_after=false", "save_model=false"]
    two = _rl_one_and_two(args, tmp_path, 4, 2, "RL one_step_off")
    one_m, two_m = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert [m["step"] for m in two_m] == list(range(1, RL_STEPS + 1))
    for m in (one_m, two_m):
        assert [x["staleness"] for x in m] == [0] + [1] * (RL_STEPS - 1), [x["staleness"] for x in m]
        assert all(x["sampling/sampling_logp_difference/mean"] > 1e-4 for x in m[1:]), m   # stale sampler ≠ π_old
    for a, b in zip(one_m, two_m):
        for k in ("reward_mean", "reward_std", "rewards/digits/mean", "completion_length_mean", "policy_version"):
            assert a[k] == b[k], (a["step"], k, a[k], b[k])                 # the same stale rollouts, the same rewards
        for k in ("loss", "pg_loss", "grad_norm"):
            assert abs(a[k] - b[k]) <= 1e-4 * max(abs(a[k]), 1e-3), (a["step"], k, a[k], b[k])
        # at step 1 the sampler is π_old and this gap is float32 rounding of log-probs of size ~1-10 (~1e-7 each):
        # two device layouts may differ by that much, so the bound has an absolute floor of 1e-6
        k = "sampling/sampling_logp_difference/mean"
        assert abs(a[k] - b[k]) <= max(1e-4 * abs(a[k]), 1e-6), (a["step"], k, a[k], b[k])
    assert any(m["reward_std"] > 0 for m in one_m) and all(abs(m["pg_loss"]) > 1e-4 for m in one_m)   # not vacuous

def _one_tpu_host_env(tmp: Path) -> dict:
    """The environment of a one-chip TPU v5e container as JAX's cluster detection sees it, on this CPU: JAX_FORCE_TPU_INIT
    makes JAX take the machine for a Cloud TPU VM, TPU_WORKER_HOSTNAMES=localhost makes its GKE TPU cluster "present",
    and the metadata server's address is a closed local port, so that any query of it fails at once."""
    from maxpost.launch import free_port
    return _env(tmp) | {"JAX_FORCE_TPU_INIT": "1", "JAX_PLATFORMS": "cpu", "TPU_WORKER_HOSTNAMES": "localhost",
                        "TPU_WORKER_ID": "0", "TPU_SKIP_MDS_QUERY": "true", "TPU_ACCELERATOR_TYPE": "v5litepod-4",
                        "GCE_METADATA_IP": f"127.0.0.1:{free_port()}"}

def test_single_tpu_host_trains(tmp_path):
    """On one TPU host JAX's detection says "GKE TPU cluster" (checked first, so the test is not vacuous), and an earlier
    maxpost called jax.distributed.initialize(), which stopped every command in seconds on the metadata query. SFT now
    runs its 2 steps as one process, with no error or note."""
    env = _one_tpu_host_env(tmp_path)
    probe = "from jax._src.clusters import GkeTpuCluster as G; print(G.is_env_present())"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                          timeout=120).stdout.split()[-1:] == ["True"]
    r = _check(subprocess.run(_sft("model_name=tiny-gemma3", "steps=2", "enable_tqdm=false", "eval_interval=0",
                                   f"base_output_directory={tmp_path}", "run_name=tpu1"),
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=300))
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["stopped"] == "steps", summary
    assert "error:" not in r.stderr and "note:" not in r.stderr and "cluster" not in r.stderr, r.stderr[-3000:]

def _tool_args(tool_ckpt, tmp: Path) -> list[str]:
    "A multi-turn tool RL run on the tiny llama warm-started to call the calculator (conftest's tool_ckpt), 4 prompts × 4 episodes."
    ckpt, digits = tool_ckpt
    return ["model_name=tiny-llama", f"load_parameters_path={ckpt}", "dataset_type=multiplication", "tools=calculator",
            "max_turns=2", "reward_functions=addition_answer", f"reward_functions_path={digits}:digits", "batch_size=4",
            "num_generations=4", "max_prefill_predict_length=32", "max_completion_length=16", f"steps={RL_STEPS}",
            "checkpoint_period=2", "num_eval_rows=8", "num_eval_passes=2", "eval_temperature=1.0", "enable_tqdm=false",
            "async_checkpointing=false", "initialization_timeout=120", f"base_output_directory={tmp}"]

def test_tool_rl_two_processes_like_one(tool_ckpt, tmp_path):
    """Multi-turn GRPO with the calculator (`dataset_type=multiplication tools=calculator max_turns=2`), 3 steps of 4
    prompts × 4 episodes and an evaluation before and after: 2 processes × 1 device, each playing the episodes of its 2
    prompts (a group never spans processes), log the rewards and tool counts of 1 process × 2 devices exactly (every
    episode samples from its own stream, turn after turn) and the losses within float tolerance; the evaluations agree."""
    args = _tool_args(tool_ckpt, tmp_path)
    two = _rl_one_and_two(args, tmp_path, 2, 1, "tool RL")
    one_m, two_m = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert [m["step"] for m in two_m] == list(range(1, RL_STEPS + 1))
    for a, b in zip(one_m, two_m):
        for k in ("reward_mean", "reward_std", "rewards/digits/mean", "completion_length_mean", "truncation_rate",
                  "tools/call_rate", "tools/malformed_rate", "tools/turns_mean"):
            assert a[k] == b[k], (a["step"], k, a[k], b[k])                 # the same episodes, the same rewards
        # each process packs its own episodes, so the per-token terms (of size |advantage| · ratio ~ 0.1-1) are summed
        # in another order: they round at that scale, not at that of the loss, a mean in which they cancel (~0.01).
        # Step 1 starts from the same weights; later steps from weights that Adam moved apart (it divides by sqrt(v),
        # so a near-zero gradient turns a rounding difference into up to a step's lr: _assert_same_training), which
        # the gradient norm shows (measured: 1e-6, 7e-6, 1.8e-4 relative at steps 1, 2, 3)
        tol = 1e-5 if a["step"] == 1 else 1e-3
        for k in ("loss", "pg_loss", "kl", "grad_norm", "ratio_mean"):
            assert abs(a[k] - b[k]) <= tol * max(abs(a[k]), 1.0), (a["step"], k, a[k], b[k])
    # not vacuous: episodes of two turns (a call, the calculator's result, another turn), rewards that differ
    assert all(m["tools/turns_mean"] > 1 for m in one_m) and any(m["reward_std"] > 0 for m in one_m)
    for f in ("eval_before.json", "eval_after.json"):
        assert json.loads((tmp_path / "one" / f).read_text()) == json.loads((tmp_path / "two" / f).read_text()), f
    ev = json.loads((tmp_path / "two" / "eval_before.json").read_text())    # the evaluation played episodes, with the tools
    assert ev["tools/turns_mean"]["mean"] > 1 and ev["tools/call_rate"]["lo"] <= ev["tools/call_rate"]["mean"], ev
    assert "tools/malformed_rate" in ev and ev["digits"]["hi"] is not None, ev
