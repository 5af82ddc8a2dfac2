"""mHC collapse kernel: ``y = sum_h pre[:, h] * x_hc[:, h]`` -> BF16 ``[T, D]``
(golden: ``goldens.mhc.hc_pre``).

Contract: FP32 accumulation in ascending lane order (``acc = pre0*x0; acc += pre1*x1;
...``), then one BF16 cast (RNE).  ``pre`` is used as given (not normalized).  The kernel
follows that order exactly: one FP32 multiply of the ``[rows, hc, D]`` block by the
``[rows, hc, 1]`` mix, then the lane slices of that product added in ascending order.

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

# Schedule (A5 cost model, FLASH hidden 5120): one loop iteration takes ROW_TILE rows as one
# [rows, hc, hidden] view, multiplies it by the [rows, hc, 1] mix in one op and adds the hc
# lane slices of that product in ascending order.  The vector tile is [TILE_ROWS, hc,
# hidden / COL_SPLIT] (80 KiB FP32 at FLASH): each x_hc copy-in moves all hc lanes at once
# (~1,400 cycles of latency per copy-in on this model, whatever its size; the old [1, 5120]
# lane-by-lane tiles copied x_hc in 20 KiB pieces and the mix once per lane, 8 copy-ins a row),
# and an iteration is 2 tasks.  FLASH T=192 46.3 -> 22.2 us, T=7 9.4 -> 6.1 us.  Four rows merged
# into one task (vec_nbuffer_setting) gave T=192 16.3 us but T=7 7.8 us and T=48 10.1 us.
ROW_TILE = 4  # rows per loop iteration
TILE_ROWS = 2  # rows per vector tile
COL_SPLIT = 2  # hidden split into this many column tiles

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
    tile = [min(TILE_ROWS, rows), hc, max(1, -(-hidden // COL_SPLIT))]
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
        m3 = pypto.reshape(mix, [tokens, hc, 1], inplace=True)
        pypto.set_vec_tile_shapes(*tile)
        for i in pypto.loop((tokens + rows - 1) // rows, name="HC_COLLAPSE_ROWS", idx_name="r"):
            start = i * rows
            valid = (tokens - start).min(rows)
            m = pypto.view(m3, [rows, hc, 1], [start, 0, 0], valid_shape=[valid, hc, 1])
            if normalized:
                m = pypto.div(m, pypto.sum(m, 1, keepdim=True))
            xv = pypto.view(x_hc, [rows, hc, hidden], [start, 0, 0], valid_shape=[valid, hc, hidden])
            prod = pypto.mul(m, xv)
            acc = pypto.view(prod, [rows, 1, hidden], [0, 0, 0], valid_shape=[valid, 1, hidden])
            for h in range(1, lanes):  # ascending lanes, unrolled at trace time
                acc = pypto.add(acc, pypto.view(prod, [rows, 1, hidden], [0, h, 0],
                                                valid_shape=[valid, 1, hidden]))
            # reshape the result, not y: assembling into an in-place 3-D reshape of the
            # output traced a kernel without the loop
            pypto.assemble(pypto.reshape(pypto.cast(acc, pypto.DT_BF16), [rows, hidden],
                                         valid_shape=[valid, hidden]), [start, 0], y)

    collapse.__name__ = name
    collapse.__qualname__ = name
    return pypto.frontend.jit(runtime_options=options)(collapse)


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``hc_pre(x_hc, pre, y)``; tokens are a dynamic axis."""
    return build_collapse(config, name="hc_pre", variant=variant, runtime_options=runtime_options)
