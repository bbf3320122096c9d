"""maxpost side of the MaxText parity checks (benchmarks/RESULTS_convert.md, "Against real MaxText"). Run with
maxpost's .venv.

maxpost → MaxText: the embedded SmolLM2-135M HF folder → MaxText checkpoints written by
`maxpost.convert.maxtext.to_maxtext` (scanned and unscanned), plus maxpost's float32 logits on 16 tokens:

    .venv/bin/python benchmarks/maxtext_parity_write.py /tmp/mt/work

MaxText → maxpost: a random-weight HF folder with MaxText's `qwen3-0.6b` config (`config.json` dumped from MaxText's
`HF_MODEL_CONFIGS`, see maxtext_parity_check.py) and HF transformers' float32 logits on three 16-token inputs; then,
after MaxText's own converter has run, maxpost loads its checkpoints (preset `qwen3-0.6b`) and compares logits:

    .venv/bin/python benchmarks/maxtext_parity_write.py /tmp/mt/qwen hf-qwen3
    .venv/bin/python benchmarks/maxtext_parity_write.py /tmp/mt/qwen load-qwen3 /tmp/mt/qwen/mt-scan-true/0/items ...
"""
import sys
from pathlib import Path
import numpy as np, jax.numpy as jnp
from maxpost.checkpoint import load_model

def maxpost_logits(path, tok, model_name=None) -> np.ndarray:
    pos = np.broadcast_to(np.arange(tok.shape[1], dtype=np.int32), tok.shape)
    model = load_model(path, model_name)
    return np.asarray(model(jnp.asarray(tok), jnp.asarray(pos), jnp.ones_like(jnp.asarray(tok)))[0], np.float32)

def report(name, got, ref):
    d = np.abs(got - ref)
    print(f"{name}: max|diff| {d.max():.2e}, mean {d.mean():.1e} (max |logit| {np.abs(ref).max():.2f}); "
          f"argmax agrees at {int((got.argmax(-1) == ref.argmax(-1)).sum())}/{ref.shape[0] * ref.shape[1]} positions")

def smollm2(out: Path):
    from maxpost.convert.from_gguf import embedded_hf
    from maxpost.convert.maxtext import to_maxtext
    hf = embedded_hf("smollm2-135m")
    tok = np.array([[1, 504, 3458, 314, 3117, 30, 216, 17, 42, 9, 1000, 2000, 49000, 5, 77, 3]], np.int32)
    np.save(out / "tokens.npy", tok); np.save(out / "maxpost_logits.npy", maxpost_logits(hf, tok))
    for scan in (True, False): print(to_maxtext(hf, out / f"smol-scan-{scan}", scan_layers=scan))

def hf_qwen3(out: Path):
    "Random Qwen3 weights (seed 0) under MaxText's qwen3-0.6b config; norm scales drawn around 1 so a misplaced one shows."
    import torch, transformers
    cfg = transformers.Qwen3Config.from_json_file(out / "maxtext_qwen3-0.6b_config.json")
    cfg.torch_dtype = "float32"
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"): p.copy_(1 + 0.2 * torch.randn_like(p))
    model.save_pretrained(out / "hf", safe_serialization=True)
    tok = np.random.default_rng(0).integers(0, cfg.vocab_size, (3, 16)).astype(np.int32)
    with torch.no_grad(): logits = model(torch.from_numpy(tok).long()).logits.float().numpy()
    np.save(out / "tokens.npy", tok); np.save(out / "hf_logits.npy", logits)
    del model
    report("maxpost (HF folder) vs HF transformers", maxpost_logits(out / "hf", tok, "qwen3-0.6b"), logits)

def load_qwen3(out: Path, items: list[str]):
    "Each MaxText checkpoint's params as maxpost reads them, against the HF folder's (rounded alike), then the logits."
    from maxpost.checkpoint import hf_to_params
    from maxpost.convert.maxtext import load_maxtext
    tok, ref = np.load(out / "tokens.npy"), np.load(out / "hf_logits.npy")
    hf, _ = hf_to_params(out / "hf")
    for it in items:
        params, _ = load_maxtext(it, "qwen3-0.6b")
        dt = {np.asarray(v).dtype for v in params.values()}
        same = sum(np.array_equal(np.asarray(params[k]), hf[k].astype(np.asarray(params[k]).dtype)) for k in hf)
        print(f"maxpost params of {it} ({'/'.join(map(str, dt))}): {same}/{len(hf)} equal the HF folder's "
              f"(cast alike) bit for bit; keys {'match' if set(params) == set(hf) else 'DIFFER'}")
        del params
        got = maxpost_logits(it, tok, "qwen3-0.6b")
        np.save(Path(it).parent.parent / "maxpost_logits.npy", got)
        report(f"maxpost ({it}) vs HF transformers", got, ref)

if __name__ == "__main__":
    out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
    mode = sys.argv[2] if len(sys.argv) > 2 else "smollm2"
    {"smollm2": lambda: smollm2(out), "hf-qwen3": lambda: hf_qwen3(out),
     "load-qwen3": lambda: load_qwen3(out, sys.argv[3:])}[mode]()
