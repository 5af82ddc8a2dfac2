"""mHC expand kernel (golden: ``goldens.mhc.hc_post``).

``out[:, o] = post[:, o] * y + sum_i comb[:, i, o] * x_hc[:, i]`` for every output lane
``o``; ``comb`` is ``M[in, out]`` (the reduction runs over its FIRST lane axis).  Contract:
FP32 accumulation, the post term first, then input lanes ``i`` ascending; then one BF16
rounding (RNE); the result is stored FP32 (BF16 values in FP32, the residual-stream
format).  The kernel follows that order exactly with one FP32 multiply-add per term over
``[rows, D]`` tiles.

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

ROW_TILE = 8  # rows per loop iteration
VEC_TILE_FP32_ELEMS = 8192  # FP32 elements per vector tile (32 KiB)

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
    tile_rows = max(1, min(rows, VEC_TILE_FP32_ELEMS // hidden))
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
        x2 = pypto.reshape(x_hc, [tokens, hc * hidden], inplace=True)
        c2 = pypto.reshape(comb, [tokens, hc * hc], inplace=True)
        pypto.set_vec_tile_shapes(tile_rows, hidden)
        for i in pypto.loop((tokens + rows - 1) // rows, name="HC_POST_ROWS", idx_name="r"):
            start = i * rows
            valid = (tokens - start).min(rows)
            y32 = pypto.cast(pypto.view(y, [rows, hidden], [start, 0],
                                        valid_shape=[valid, hidden]), pypto.DT_FP32)
            p = pypto.view(post, [rows, hc], [start, 0], valid_shape=[valid, hc])
            m = pypto.view(c2, [rows, hc * hc], [start, 0], valid_shape=[valid, hc * hc])
            for o in range(hc):  # output lanes, unrolled at trace time
                if with_post:
                    acc = pypto.mul(pypto.view(p, [rows, 1], [0, o], valid_shape=[valid, 1]), y32)
                for k in range(hc):  # input lanes ascending
                    col = k * hc + o
                    if transposed:
                        col = o * hc + k
                    term = pypto.mul(pypto.view(m, [rows, 1], [0, col], valid_shape=[valid, 1]),
                                     pypto.view(x2, [rows, hidden], [start, k * hidden],
                                                valid_shape=[valid, hidden]))
                    if with_post or k > 0:
                        acc = pypto.add(acc, term)
                    else:
                        acc = term
                if rounded:
                    acc = pypto.cast(pypto.cast(acc, pypto.DT_BF16), pypto.DT_FP32)
                pypto.assemble(pypto.reshape(acc, [rows, 1, hidden], valid_shape=[valid, 1, hidden]),
                               [start, o, 0], out)

    return hc_post
