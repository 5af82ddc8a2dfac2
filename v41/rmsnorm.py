"""RMSNorm kernel (pypto 0.2.0 frontend): ``y = x * rsqrt(mean(x^2) + eps) * w``.

Contract (reference-facts 4.1): FP32 arithmetic over each row of ``x``; the only
rounding is the final cast of the product to BF16 (``rint``).  ``eps`` is
``config.rms_norm_eps`` (1e-20 for the released model; it matters only for all-zero rows,
which must give exactly 0 instead of NaN).

ABI
---
``ABI`` below declares the launch arguments in call order.  Shapes are named dimensions
resolved against a config and a case by :func:`abi`; nothing here fixes a shape at import:

========  =======================  ========  =====
name      shape                    dtype     role
========  =======================  ========  =====
x         (tokens, hidden_size)    bfloat16  in
weight    (hidden_size,)           bfloat16  in
y         (tokens, hidden_size)    bfloat16  out
========  =======================  ========  =====

``tokens`` comes from ``case["tokens"]`` (>= 1) and is a dynamic axis of the compiled
kernel; ``hidden_size`` from ``config.hidden_size``.

This module does not import pypto at import time (the platform chooses which pypto build
is imported, see ``harness.platforms.pypto_env``); :func:`build` does.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, ResolvedArg, jit_options, resolve

ROW_CAP = 64  # most rows per loop iteration
VEC_TILE_FP32_ELEMS = 20480  # FP32 elements per vector tile (80 KiB): [4, 5120] compiles, [8, 5120] fails "Run pass"

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "no_weight": "omits the multiplication by weight",
    "half_count": "divides the sum of squares by hidden_size / 2 (mean over the wrong count)",
    "no_eps": "omits eps (all-zero rows become NaN)",
}


ABI: tuple[Arg, ...] = (
    Arg("x", ("tokens", "hidden_size"), "bfloat16", "in"),
    Arg("weight", ("hidden_size",), "bfloat16", "in"),
    Arg("y", ("tokens", "hidden_size"), "bfloat16", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    """Named dimensions of one launch; raises ValueError naming the bad field."""
    tokens = case.get("tokens")
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"case['tokens']: {tokens!r} must be an int >= 1")
    return {"tokens": tokens, "hidden_size": config.hidden_size}


def abi(config, case: dict) -> tuple[ResolvedArg, ...]:
    """``ABI`` with concrete shapes for ``config`` and ``case``."""
    return resolve(ABI, dims(config, case))


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``rmsnorm(x, weight, y)`` for ``config`` (one compile per call).

    ``case`` is accepted for interface uniformity; the token count is a dynamic axis.
    ``runtime_options`` (e.g. ``{"run_mode": pypto.RunMode.SIM}``) are passed to the jit.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    hidden = config.hidden_size
    eps = 0.0 if variant == "no_eps" else float(config.rms_norm_eps)
    count = hidden // 2 if variant == "half_count" else hidden
    inv_count = 1.0 / count
    use_weight = variant != "no_weight"
    # One tile a loop iteration: the iteration is one task, with the weight's cast inside it
    # (a cast shared by several row tiles is a task of its own, and each dependent task
    # waits ~9 k cycles for it on the A5 cost model).
    rows = max(1, min(ROW_CAP, VEC_TILE_FP32_ELEMS // hidden))
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options)
    def rmsnorm(
        x: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        weight: pypto.Tensor([hidden], pypto.DT_BF16),
        y: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
    ):
        tokens = x.shape[0]
        pypto.set_vec_tile_shapes(rows, hidden)
        for i in pypto.loop((tokens + rows - 1) // rows, name="RMSNORM_ROWS", idx_name="r"):
            start = i * rows
            valid = (tokens - start).min(rows)
            xt = pypto.view(x, [rows, hidden], [start, 0], valid_shape=[valid, hidden])
            x32 = pypto.cast(xt, pypto.DT_FP32)
            mean_sq = pypto.mul(pypto.sum(pypto.mul(x32, x32), -1, keepdim=True), inv_count)
            inv_rms = pypto.rsqrt(pypto.add(mean_sq, eps))
            y32 = pypto.mul(x32, inv_rms)
            if use_weight:
                w32 = pypto.cast(pypto.reshape(weight, [1, hidden]), pypto.DT_FP32)
                y32 = pypto.mul(y32, w32)
            pypto.assemble(pypto.cast(y32, pypto.DT_BF16), [start, 0], y)

    return rmsnorm
