"""Compile a trainer's programs for a TPU topology as `python -m maxpost.aot` does, and save each compiled program's
HLO text (for `benchmarks/hlo_traffic.py`).

    python benchmarks/hlo_dump.py OUT_PREFIX train_sft model_name=gemma3-1b use_lora=true per_device_batch_size=2 \\
        max_target_length=1024 remat_policy=none topology=v5e-1

writes OUT_PREFIX.<n>.hlo, one per compiled program, in the order maxpost.aot compiles them.
"""
import sys
import maxpost.aot as aot          # first: it puts libtpu on the path before jax is imported


def main(argv):
    prefix, mode, *kv = argv
    topo = next((a.split("=", 1)[1] for a in kv if a.startswith("topology=")), "v5e-1")
    kv = [a for a in kv if not a.startswith("topology=")]
    n, orig = [0], aot.memory

    def memory(compiled):
        open(f"{prefix}.{n[0]}.hlo", "w").write(compiled.as_text()); n[0] += 1
        ca = compiled.cost_analysis(); ca = ca[0] if isinstance(ca, list) else ca
        print(f"cost analysis: {ca.get('flops', 0) / 1e12:.3f} TFLOP, {ca.get('bytes accessed', 0) / 2**30:.2f} GiB accessed")
        return orig(compiled)
    aot.memory = memory
    aot.check(mode, kv, topo)


if __name__ == "__main__":
    main(sys.argv[1:])
