"""The native engine on a single host's mesh (`NativeEngine(mesh=…)`, nbs/06d_sampler_mesh.ipynb): one process with 4
virtual CPU devices generates from a tiny Gemma 3 (4 layers, 2 kv heads) without a mesh and on the meshes data=4,
fsdp=4 and data=2 × tensor=2, with both decode programs (unrolled and scanned), greedy and sampled. Every call's
program is wrapped to also return the rows' own KV cache, so the test reads the layout the program produced.

Tolerance: on a mesh the program sums the same float32 products in another order only where tensor splits the heads
and the MLP (an all-reduce over 2 chips of partial sums) and in XLA's choice of fusion; a log-prob is a difference of
a logit and a logsumexp of about 5 nats, so rounding gives about 1e-6. The bound, 1e-5, is the one tests/test_mesh.py
uses for the engine; a row decoded against another row's prompt or cache changes tokens and log-probs by O(1)."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from conftest import xla_cache

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import json, sys
import numpy as np, jax
from flax import nnx
from jax.sharding import Mesh
import maxpost.generate as G
from maxpost.engine import SamplingParams
from maxpost.model import Decoder, tiny_config
from maxpost.sharding import MESH_AXES
assert len(jax.devices()) == 4, jax.devices()

def spec(x):
    "x's PartitionSpec as a list of one entry per axis (None, an axis name, or a list of names); one device: None."
    if not hasattr(x.sharding, "spec"): return None
    s = list(x.sharding.spec) + [None] * (x.ndim - len(x.sharding.spec))
    return [list(a) if isinstance(a, tuple) else a for a in s]

seen = []                                   # (layout, output specs) of every call
program = G._generate_batch
def recording(*args, **kw):
    *out, cache = program(*args, **kw, return_cache=True)
    seen.append(dict(layout=kw["layout"] is not None, scan=kw["scan"], rows=spec(out[0]), lengths=spec(out[3]),
                     cache=[spec(x) for x in jax.tree.leaves(cache)]))
    return tuple(out)
G._generate_batch = recording

model = Decoder(tiny_config("gemma3"), rngs=nnx.Rngs(0))
prompts = [[5, 17, 3], [9, 8, 7, 6, 5, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
SP = {"greedy": SamplingParams(temperature=0.0, max_tokens=8, n=2, stop_token_ids=()),
      "sampled": SamplingParams(temperature=1.0, max_tokens=8, n=2, seed=3, stop_token_ids=())}
one_row = SamplingParams(temperature=0.0, max_tokens=8, n=1, stop_token_ids=())
d = np.array(jax.devices())
MESHES = {"none": None, "data4": Mesh(d.reshape(4, 1, 1), MESH_AXES), "fsdp4": Mesh(d.reshape(1, 4, 1), MESH_AXES),
          "data2_tensor2": Mesh(d.reshape(2, 1, 2), MESH_AXES)}
out = {}
for decode in ("unrolled", "scan"):
    for name, mesh in MESHES.items():
        eng = G.NativeEngine(model, None, max_batch=8, max_len=32, decode=decode, mesh=mesh)
        n0 = len(seen)
        got = {k: [(r.token_ids, r.logprobs.tolist()) for r in eng.generate(prompts, sp)] for k, sp in SP.items()}
        if name == "data4": got["one_row"] = [(r.token_ids, r.logprobs.tolist()) for r in eng.generate(prompts[:1], one_row)]
        got["weights"] = {k: spec(v) for k, v in zip(eng._names, jax.tree.leaves(eng._state))}
        got["calls"] = seen[n0:]
        eng.sync_weights(model)             # placed again with the engine's shardings
        got["synced"] = {k: spec(v) for k, v in zip(eng._names, jax.tree.leaves(eng._state))}
        got["synced_same"] = [r.token_ids for r in eng.generate(prompts, SP["greedy"])] == [t for t, _ in got["greedy"]]
        out[f"{decode}|{name}"] = got
        print(decode, name, "done", file=sys.stderr, flush=True)
# without a mesh the program traces no sharding constraint: it is the program it was before meshes
gd, st = nnx.split(model)
args = (st, np.ones((2, 16), np.int32), np.ones((2, 16), np.int32), np.ones((4,), bool), np.zeros((4, 2), np.int32),
        np.uint32(0), np.full(8, -1, np.int32), np.int32(4), np.float32(1), np.int32(0), np.float32(1))
out["jaxpr_constraints"] = {s: str(program.trace(*args, graphdef=gd, max_new=16, with_sampling_logprobs=False,
                                                 scan=s).jaxpr).count("sharding_constraint") for s in (False, True)}
print(json.dumps(out))
'''

@pytest.fixture(scope="module")
def results(tmp_path_factory):
    "The script's JSON: one process, 4 virtual CPU devices (LLVM at -O0: compiling is most of the cost)."
    tmp = tmp_path_factory.mktemp("mesh_sampler")
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
             " --xla_backend_optimization_level=0").strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=xla_cache(tmp))
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])

DP = {"data4": "data", "fsdp4": "fsdp", "data2_tensor2": "data"}   # the rows' axes of size > 1 (JAX drops size-1 axes)

@pytest.mark.parametrize("decode", ["unrolled", "scan"])
@pytest.mark.parametrize("mesh", ["data4", "fsdp4", "data2_tensor2"])
def test_mesh_engine_matches_one_device(results, decode, mesh):
    "Greedy and sampled: the same tokens as the engine without a mesh, log-probs within 1e-5."
    base, got = results[f"{decode}|none"], results[f"{decode}|{mesh}"]
    for k in ("greedy", "sampled"):
        assert [t for t, _ in got[k]] == [t for t, _ in base[k]], (k, mesh, decode)
        diff = max(abs(a - b) for (_, la), (_, lb) in zip(got[k], base[k]) for a, b in zip(la, lb))
        print(f"{decode} {mesh} {k}: max |log-prob difference| {diff:.2g}")
        assert diff <= 1e-5, (k, diff)
    assert got["synced_same"] and base["synced_same"]

def test_batch_smaller_than_data_axis(results):
    "One prompt, one sample on data=4: padded to 4 rows, 3 idle; the row equals the one-device engine's greedy row."
    for decode in ("unrolled", "scan"):
        got, base = results[f"{decode}|data4"], results[f"{decode}|none"]
        assert len(got["one_row"]) == 1
        assert got["one_row"][0][0] == base["greedy"][0][0], decode       # prompt 0's first sample
        assert abs(got["one_row"][0][1][0] - base["greedy"][0][1][0]) <= 1e-5

@pytest.mark.parametrize("decode", ["unrolled", "scan"])
def test_layout_is_stated(results, decode):
    """Rows and outputs split over data × fsdp on every mesh; the rows' own cache split by rows and, on tensor=2 with
    2 kv heads, by kv head; weights whole over the data axes (no 'data' or 'fsdp' in any spec), heads and MLP over tensor."""
    rows, kv = (0, 1) if decode == "unrolled" else (1, 2)      # [B, K, hd, n] blocks, or stacked [L, B, K, N, hd]
    for mesh in ("data4", "fsdp4", "data2_tensor2"):
        got = results[f"{decode}|{mesh}"]
        assert got["calls"] and all(c["layout"] and c["scan"] == (decode == "scan") for c in got["calls"])
        for c in got["calls"]:
            assert c["rows"] == [DP[mesh], None] and c["lengths"] == [DP[mesh]], c
            assert c["cache"] and all(s[rows] == DP[mesh] and s[kv] == ("tensor" if mesh == "data2_tensor2" else None)
                                      for s in c["cache"]), (mesh, c["cache"])
        for specs in (got["weights"], got["synced"]):
            assert not any(a in ("data", "fsdp") or isinstance(a, list) for s in specs.values() for a in s), specs
            assert specs["wq"] == [None, None, "tensor", None] and specs["w_down"] == [None, "tensor", None], specs
    assert all(not c["layout"] for c in results[f"{decode}|none"]["calls"])

def test_no_mesh_program_unchanged(results):
    "Without a mesh neither program traces a sharding constraint: the program (and its CPU results) is today's."
    assert results["jaxpr_constraints"] == {"false": 0, "true": 0}, results["jaxpr_constraints"]
