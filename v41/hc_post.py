"""mHC expand kernel (golden: ``goldens.mhc.hc_post``).

``out[:, o] = post[:, o] * y + sum_i comb[:, i, o] * x_hc[:, i]`` for every output lane
``o``; ``comb`` is ``M[in, out]`` (the reduction runs over its FIRST lane axis).  Contract:
FP32 accumulation, the post term first, then input lanes ``i`` ascending; then one BF16
rounding (RNE); the result is stored FP32 (BF16 values in FP32, the residual-stream
format).  The kernel follows that order exactly with one FP32 multiply and one add per term,
all output lanes at once over ``[rows, hc, D]`` blocks.

ABI
---
======  ======================  ========  =====
name    shape                   dtype     role
======  ======================  ========  =====
y       (tokens, hidden)        bfloat16  in
x_hc    (tokens, hc, hidden)    float32   in
post    (tokens, hc)            float32   in
comb    (tokens, hc, hc)        float32   in
out     (tokens, hc, hidden)    float32   out
======  ======================  ========  =====

``tokens`` from ``case["tokens"]`` (>= 1) is a dynamic axis.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve

# Schedule (A5 cost model, FLASH hidden 5120): every output lane at once on [rows, hc, D]
# blocks - acc = post * y, then acc += comb[:, k, :] * x_k for k ascending - over vector
# tiles of [TILE_ROWS, hc, D / COL_SPLIT] (40 KiB FP32 at FLASH).  Each copy-in costs ~1,400
# cycles of latency on this model whatever its size; the old lane-by-lane [1, 5120] tiles
# copied x_hc and comb once per (out, in) lane pair, ~37 copy-ins a row.  Now one x_hc, comb,
# post and y copy-in per tile; larger tiles made the accumulator spill to DDR between adds.
# FLASH T=192 182.9 -> 53.6 us, T=7 28.3 -> 12.4 us.  Merging 2 tiles per task
# (vec_nbuffer_setting) gave T=192 45.9 us but T=7 20.4 us.
ROW_TILE = 2  # rows per loop iteration
TILE_ROWS = 1  # rows per vector tile
COL_SPLIT = 2  # hidden split into this many column tiles

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "comb_transposed": "reduces over comb's SECOND lane axis (M[out, in])",
    "no_round": "stores the FP32 sum without the BF16 rounding",
    "no_post": "omits the post * y term",
}

ABI = (
    Arg("y", ("tokens", "hidden"), "bfloat16", "in"),
    Arg("x_hc", ("tokens", "hc", "hidden"), "float32", "in"),
    Arg("post", ("tokens", "hc"), "float32", "in"),
    Arg("comb", ("tokens", "hc", "hc"), "float32", "in"),
    Arg("out", ("tokens", "hc", "hidden"), "float32", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    return {"tokens": case_int(case, "tokens", minimum=1), "hc": config.hc.hc_mult,
            "hidden": config.hidden_size}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``hc_post(y, x_hc, post, comb, out)``; tokens are a dynamic axis."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    hc, hidden = config.hc.hc_mult, config.hidden_size
    rows = ROW_TILE
    tile = [min(TILE_ROWS, rows), hc, max(1, -(-hidden // COL_SPLIT))]
    transposed = variant == "comb_transposed"
    rounded = variant != "no_round"
    with_post = variant != "no_post"
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options)
    def hc_post(
        y: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        x_hc: pypto.Tensor([tokens_dim, hc, hidden], pypto.DT_FP32),
        post: pypto.Tensor([tokens_dim, hc], pypto.DT_FP32),
        comb: pypto.Tensor([tokens_dim, hc, hc], pypto.DT_FP32),
        out: pypto.Tensor([tokens_dim, hc, hidden], pypto.DT_FP32),
    ):
        tokens = y.shape[0]
        y3 = pypto.reshape(y, [tokens, 1, hidden], inplace=True)
        p3 = pypto.reshape(post, [tokens, hc, 1], inplace=True)
        pypto.set_vec_tile_shapes(*tile)
        for i in pypto.loop((tokens + rows - 1) // rows, name="HC_POST_ROWS", idx_name="r"):
            start = i * rows
            valid = (tokens - start).min(rows)
            full, vfull = [rows, hc, hidden], [valid, hc, hidden]
            y32 = pypto.cast(pypto.view(y3, [rows, 1, hidden], [start, 0, 0],
                                        valid_shape=[valid, 1, hidden]), pypto.DT_FP32)
            # x_hc and comb enter through one exact op each (x * 1.0) so that each is one
            # copy-in per tile; the per-lane slices below are then views in UB.
            xb = pypto.mul(pypto.view(x_hc, full, [start, 0, 0], valid_shape=vfull), 1.0)
            cb = pypto.mul(pypto.view(comb, [rows, hc, hc], [start, 0, 0],
                                      valid_shape=[valid, hc, hc]), 1.0)
            if with_post:
                pm = pypto.view(p3, [rows, hc, 1], [start, 0, 0], valid_shape=[valid, hc, 1])
                acc = pypto.mul(pm, pypto.expand_clone(y32, full, valid_shape=vfull))
            for k in range(hc):  # input lanes ascending; all output lanes at once
                if transposed:  # M[out, in]: column k of comb
                    c_k = pypto.view(cb, [rows, hc, 1], [0, 0, k], valid_shape=[valid, hc, 1])
                else:  # M[in, out]: row k of comb, as [rows, hc (out), 1]
                    c_k = pypto.reshape(pypto.view(cb, [rows, 1, hc], [0, k, 0],
                                                   valid_shape=[valid, 1, hc]),
                                        [rows, hc, 1], valid_shape=[valid, hc, 1])
                x_k = pypto.view(xb, [rows, 1, hidden], [0, k, 0], valid_shape=[valid, 1, hidden])
                term = pypto.mul(c_k, pypto.expand_clone(x_k, full, valid_shape=vfull))
                acc = pypto.add(acc, term) if (with_post or k > 0) else term
            if rounded:
                acc = pypto.cast(pypto.cast(acc, pypto.DT_BF16), pypto.DT_FP32)
            pypto.assemble(acc, [start, 0, 0], out)

    return hc_post
