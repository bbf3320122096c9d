"""maxpost side of the MaxText parity check (benchmarks/RESULTS_convert.md, "Against real MaxText"): the embedded
SmolLM2-135M HF folder → MaxText checkpoints written by `maxpost.convert.maxtext.to_maxtext` (scanned and unscanned),
plus maxpost's float32 logits on 16 tokens. Run with maxpost's .venv:

    .venv/bin/python benchmarks/maxtext_parity_write.py /tmp/mt/work
"""
import sys
from pathlib import Path
import numpy as np, jax.numpy as jnp
from maxpost.checkpoint import load_model
from maxpost.convert.from_gguf import embedded_hf
from maxpost.convert.maxtext import to_maxtext

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
hf = embedded_hf("smollm2-135m")
tok = np.array([[1, 504, 3458, 314, 3117, 30, 216, 17, 42, 9, 1000, 2000, 49000, 5, 77, 3]], np.int32)
pos = np.arange(tok.shape[1], dtype=np.int32)[None]
logits = load_model(hf)(jnp.asarray(tok), jnp.asarray(pos), jnp.ones_like(jnp.asarray(tok)))[0]
np.save(out / "tokens.npy", tok); np.save(out / "maxpost_logits.npy", np.asarray(logits, np.float32))
for scan in (True, False): print(to_maxtext(hf, out / f"smol-scan-{scan}", scan_layers=scan))
