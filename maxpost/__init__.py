"""Post-training for LLMs in JAX: HF converters, SFT, GRPO/GSPO/DAPO and evaluation, runnable on a CPU

Modules:

- `maxpost.checkpoint`: Safetensors read and written tensor by tensor, the HF ⇄ maxpost name and layout mapping, HF `config.json` ⇄ `ModelConfig`, and atomic Orbax checkpoints.
- `maxpost.config`: One grammar for every entry point, as in MaxText: a base YAML, then the model's preset, then `key=value` overrides from the command line, validated into a typed config whose errors name the bad key.
- `maxpost.convert.check_logits`: `python -m maxpost.convert.check_logits hf_model_path=… load_parameters_path=…`: the same batch through transformers and maxpost; exits non-zero past the limits.
- `maxpost.convert.from_gguf`: `python -m maxpost.convert.from_gguf gguf_path=… base_output_directory=…`: a GGUF file (quantised or not) becomes an HF folder with float32 safetensors, config.json and a tokenizer, so that real models work with no model hub.
- `maxpost.convert.to_huggingface`: `python -m maxpost.convert.to_huggingface model_name=… load_parameters_path=… base_output_directory=…`: a folder that transformers and vLLM load, bit-exact in float32.
- `maxpost.demo`: `make demo` runs `python -m maxpost.demo`: on the embedded real models, with no network after setup, it imports each from GGUF, converts to maxpost and back, checks the round trip and the logits against transformers, then fine-tunes SmolLM2 with LoRA on GSM8K for a few steps and shows the loss going down. It ends with a short report and two plots.
- `maxpost.losses`: Group-relative advantages (GRPO, Dr.GRPO, RLOO), Schulman's k1/k2/k3 KL estimators, the clipped policy loss at the token level (GRPO, DAPO, Dr.GRPO) and the sequence level (GSPO, GSPO-token), DAPO's soft overlong penalty, and named presets that set these together.
- `maxpost.rl`: The RL loop: rollouts from an engine, TRL-style rewards, group advantages, the clipped policy loss with true old log-probs over several iterations, a KL term to a reference model that costs no second copy under LoRA, entropy computed in chunks, and Orbax checkpoints that resume a killed run exactly.
- `maxpost.sft`: Masked token-mean cross-entropy computed in chunks so that a 262k vocabulary never becomes a [batch, length, vocab] array, AdamW with warmup and cosine decay, gradient accumulation, native LoRA on the stacked layers, FSDP × tensor sharding, and Orbax checkpoints that resume a killed run exactly.
- `maxpost.sharding`: A two-axis device mesh (`fsdp`, `tensor`) with MaxText's names, and the rules that map the model's logical parameter axes onto it.
- `maxpost.train_rl`: `python -m maxpost.train_rl model_name=… load_parameters_path=… run_name=… base_output_directory=… loss_algo=…`: GRPO / GSPO / DAPO / Dr.GRPO from the command line, MaxText's grammar, evaluated before and after, resumable.
- `maxpost.train_sft`: `python -m maxpost.train_sft model_name=… load_parameters_path=… run_name=… base_output_directory=…`: supervised fine-tuning (full or LoRA) from the command line, MaxText's grammar, resumable."""

__version__ = "0.1.0"
