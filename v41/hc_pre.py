"""mHC collapse kernel: ``y = sum_h pre[:, h] * x_hc[:, h]`` -> BF16 ``[T, D]``
(golden: ``goldens.mhc.hc_pre``).

Contract: FP32 accumulation in ascending lane order (``acc = pre0*x0; acc += pre1*x1;
...``), then one BF16 cast (RNE).  ``pre`` is used as given (not normalized).  The kernel
follows that order exactly: one FP32 multiply-add per lane over a ``[rows, D]`` tile.

ABI
---
======  ======================  ========  =====
name    shape                   dtype     role
======  ======================  ========  =====
x_hc    (tokens, hc, hidden)    float32   in
pre     (tokens, hc)            float32   in
y       (tokens, hidden)        bfloat16  out
======  ======================  ========  =====

``hc = config.hc.hc_mult``, ``hidden = config.hidden_size``; ``tokens`` from
``case["tokens"]`` (>= 1) is a dynamic axis.  ``x_hc`` is the residual stream (BF16 values
held in FP32).  :mod:`v41.hc_head` is this kernel with the last delayed pre-mix.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve

ROW_TILE = 8  # rows per loop iteration
VEC_TILE_FP32_ELEMS = 8192  # FP32 elements per vector tile (32 KiB)

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "normalized": "divides by sum(pre) (normalizes the collapse weights)",
    "lane0": "ignores the last lane (accumulates lanes 0..hc-2 only)",
}

ABI = (
    Arg("x_hc", ("tokens", "hc", "hidden"), "float32", "in"),
    Arg("pre", ("tokens", "hc"), "float32", "in"),
    Arg("y", ("tokens", "hidden"), "bfloat16", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    return {"tokens": case_int(case, "tokens", minimum=1), "hc": config.hc.hc_mult,
            "hidden": config.hidden_size}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def build_collapse(config, *, name: str, variant: str, runtime_options: dict | None):
    """The collapse jit kernel ``(x_hc, mix, y)`` shared by hc_pre and hc_head."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    hc, hidden = config.hc.hc_mult, config.hidden_size
    rows = ROW_TILE
    tile_rows = max(1, min(rows, VEC_TILE_FP32_ELEMS // hidden))
    lanes = hc - 1 if variant == "lane0" else hc
    normalized = variant == "normalized"
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    def collapse(
        x_hc: pypto.Tensor([tokens_dim, hc, hidden], pypto.DT_FP32),
        mix: pypto.Tensor([tokens_dim, hc], pypto.DT_FP32),
        y: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
    ):
        tokens = x_hc.shape[0]
        x2 = pypto.reshape(x_hc, [tokens, hc * hidden], inplace=True)
        pypto.set_vec_tile_shapes(tile_rows, hidden)
        for i in pypto.loop((tokens + rows - 1) // rows, name="HC_COLLAPSE_ROWS", idx_name="r"):
            start = i * rows
            valid = (tokens - start).min(rows)
            m = pypto.view(mix, [rows, hc], [start, 0], valid_shape=[valid, hc])
            if normalized:
                m = pypto.div(m, pypto.sum(m, -1, keepdim=True))
            acc = pypto.mul(pypto.view(m, [rows, 1], [0, 0], valid_shape=[valid, 1]),
                            pypto.view(x2, [rows, hidden], [start, 0], valid_shape=[valid, hidden]))
            for h in range(1, lanes):  # ascending lanes, unrolled at trace time
                xh = pypto.view(x2, [rows, hidden], [start, h * hidden],
                                valid_shape=[valid, hidden])
                mh = pypto.view(m, [rows, 1], [0, h], valid_shape=[valid, 1])
                acc = pypto.add(acc, pypto.mul(mh, xh))
            pypto.assemble(pypto.cast(acc, pypto.DT_BF16), [start, 0], y)

    collapse.__name__ = name
    collapse.__qualname__ = name
    return pypto.frontend.jit(runtime_options=options)(collapse)


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``hc_pre(x_hc, pre, y)``; tokens are a dynamic axis."""
    return build_collapse(config, name="hc_pre", variant=variant, runtime_options=runtime_options)
