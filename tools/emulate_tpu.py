"""An approximation, on a CPU, of the two ways a TPU's float32 arithmetic differs from a CPU's, to find the tests whose
tolerances a TPU would break before anyone runs them there. A development aid: not a TPU, and not part of the package.

    import emulate_tpu; emulate_tpu.install()              # before the first jit: affects this process's CPU programs

1. Matmuls at JAX's default precision: a TPU rounds float32 inputs of every matmul (dot_general) to bfloat16 and
   accumulates the exact products in float32 (one MXU pass; 'highest' takes six passes and is float32-accurate).
   `install(dots=True)` lowers every CPU dot_general whose precision is DEFAULT (no `jax.default_matmul_precision`
   context, or 'default') with its float32 operands rounded to bfloat16 and back, and leaves 'high'/'highest' dots
   alone. That is the same rounding as the MXU's (round to nearest even), only the summation order differs.
2. Transcendental functions: a TPU's float32 exp, log, log1p, logistic, exp2 and pow are fast approximations (JAX's own
   test suite allows them 2e-4 there: tests/lax_test.py; log-sum-exp came out 1.4e-5 off on a v5e,
   shared/tpu/results/notebooks/nb_06_generate.log). `install(transcendental=eps)` multiplies each result by
   1 + eps·sin(97·x), x the argument: deterministic (jit and eager agree, as on a TPU), smooth like a polynomial
   approximation's error (nearly equal arguments, as in two computations of the same log-softmax, get nearly equal
   errors), and unrelated between arguments a few hundredths apart (a log-sum-exp over blocks against one over the row).

Neither models everything (a TPU's reductions, divisions and summation orders differ too); a test that passes here can
still fail on a TPU, but one that fails here would fail there.
"""
from __future__ import annotations

import numpy as np

_installed: dict = {}
_saved: dict = {}        # primitive -> the CPU lowering entry it had before install() (None: the generic rule)


def _is_default(precision) -> bool:
    "Whether a dot_general `precision` parameter means the backend's default (a TPU: one bfloat16 pass)."
    from jax.lax import Precision
    if precision is None: return True
    if isinstance(precision, tuple):
        return all(p is None or p == Precision.DEFAULT for p in precision)
    return precision == Precision.DEFAULT


def install(dots: bool = True, transcendental: float = 0.0) -> dict:
    "Replace the CPU lowerings (see the module's docstring); returns what is now installed. Idempotent."
    import jax.numpy as jnp
    from jax._src.lax import lax as L
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir.dialects import hlo
    cpu = mlir._platform_specific_lowerings["cpu"]
    if dots and "dots" not in _installed:
        _saved.setdefault(L.dot_general_p, cpu.get(L.dot_general_p))
        orig = cpu[L.dot_general_p].rule

        def rule(ctx, lhs, rhs, *, precision, **kw):
            if _is_default(precision):
                def rnd(v, aval):
                    if aval.dtype != np.float32: return v
                    bf = aval.update(dtype=jnp.bfloat16)
                    return hlo.convert(mlir.aval_to_ir_type(ctx.module_context, aval),
                                       hlo.convert(mlir.aval_to_ir_type(ctx.module_context, bf), v))
                lhs, rhs = rnd(lhs, ctx.avals_in[0]), rnd(rhs, ctx.avals_in[1])
            return orig(ctx, lhs, rhs, precision=precision, **kw)
        mlir.register_lowering(L.dot_general_p, rule, platform="cpu")
        _installed["dots"] = True
    if transcendental and "transcendental" not in _installed:
        eps = float(transcendental)

        def make_rule(base):
            def rule(ctx, *args, **params):
                out, = base(ctx, *args, **params)
                aval = ctx.avals_out[0]
                if aval.dtype != np.float32 or ctx.avals_in[0].shape != aval.shape: return [out]
                full = lambda v: mlir.full_like_aval(ctx, v, aval)
                y = hlo.multiply(args[0], full(97.0))    # the argument (for pow, the base), scaled; may overflow
                f = hlo.add(full(1.0), hlo.multiply(full(eps), hlo.sine(y)))
                return [hlo.multiply(out, hlo.select(hlo.is_finite(y), f, full(1.0)))]
            return rule

        for prim in (L.exp_p, L.log_p, L.log1p_p, L.logistic_p, L.exp2_p, L.pow_p):
            _saved.setdefault(prim, cpu.get(prim))
            mlir.register_lowering(prim, make_rule(mlir._lowerings[prim].rule), platform="cpu")
        _installed["transcendental"] = eps
    return dict(_installed)


def uninstall():
    "Put back the CPU lowerings that `install` replaced (programs compiled meanwhile stay in JAX's caches)."
    from jax._src.interpreters import mlir
    cpu = mlir._platform_specific_lowerings["cpu"]
    for prim, entry in _saved.items():
        if entry is None: cpu.pop(prim, None)
        else: cpu[prim] = entry
    _saved.clear(); _installed.clear()


if __name__ == "__main__":                                   # a quick look at both effects
    import jax, jax.numpy as jnp
    install(transcendental=5e-5)
    x = jax.random.normal(jax.random.key(0), (64, 256)); w = jax.random.normal(jax.random.key(1), (256, 64))
    ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    for p in ("default", "highest"):
        with jax.default_matmul_precision(p):
            y = np.asarray(jax.jit(jnp.matmul)(x, w))
        print(f"matmul at {p}: max relative error {np.abs(y - ref).max() / np.abs(ref).max():.1e}")
    z = np.linspace(-3, 3, 10001, dtype=np.float32)
    print(f"exp: max relative error {np.abs(np.asarray(jnp.exp(z)) / np.exp(z.astype(np.float64)) - 1).max():.1e}")
