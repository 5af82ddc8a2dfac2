"""MoE combine at the token owner (golden: ``goldens.moe.combine`` of ``moe_block``).

After the EP combine transport returns each token's ``k`` routed expert outputs (BF16, in
ascending global expert index: :mod:`harness.ep_transport`), this kernel forms the block
output ``y = [BF16](shared + ((r_0 + r_1) + ... + r_{k-1}))`` with every addition in FP32,
in that order: exactly the golden's rounding (its ``routed_sum`` starts at zero and adds
each expert's BF16 output in ascending expert order; ``0 + r_0 = r_0`` exactly), so the
result is byte-equal.  Rows at or past ``num_tokens`` are written zero and never read.

ABI
---
===========  ========================  ========  =====
name         shape                     dtype     role
===========  ========================  ========  =====
routed       (tokens, k * hidden)      bfloat16  in   (row t: [k, hidden], expert order)
shared       (tokens, hidden)          bfloat16  in   (the shared expert's output)
num_tokens   (1,)                      int32     in
y            (tokens, hidden)          bfloat16  out
===========  ========================  ========  =====

``tokens`` (>= 1) is a dynamic axis; the caller validates ``num_tokens`` to ``[0, tokens]``.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve

ROW_TILE = 16
COL_TILE = 1024  # hidden columns per step (FLASH 5120 = 5 steps)

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "bf16_partials": "rounds the routed sum to BF16 before adding the shared expert",
    "drop_last_expert": "leaves out each token's last routed expert",
}

ABI = (
    Arg("routed", ("tokens", "routed_width"), "bfloat16", "in"),
    Arg("shared", ("tokens", "hidden"), "bfloat16", "in"),
    Arg("num_tokens", (1,), "int32", "in"),
    Arg("y", ("tokens", "hidden"), "bfloat16", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    d, k = config.hidden_size, config.moe.num_experts_per_tok
    return {"tokens": case_int(case, "tokens", minimum=1), "hidden": d, "routed_width": k * d}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def _col_tile(hidden: int) -> int:
    width = min(hidden, COL_TILE)
    while hidden % width:
        width //= 2
    return width


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``moe_combine(routed, shared, num_tokens, y)``."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    hidden, k = config.hidden_size, config.moe.num_experts_per_tok
    rows, cols = ROW_TILE, _col_tile(hidden)
    if k < 2:
        raise ValueError(f"config.moe.num_experts_per_tok: {k}; the combine sums k >= 2 experts")
    drop_last = variant == "drop_last_expert"
    round_partial = variant == "bf16_partials"
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")
    bf16, fp32 = pypto.DT_BF16, pypto.DT_FP32

    @pypto.frontend.jit(runtime_options=options)
    def moe_combine(
        routed: pypto.Tensor([tokens_dim, k * hidden], pypto.DT_BF16),
        shared: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        num_tokens: pypto.Tensor([1], pypto.DT_INT32),
        y: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
    ):
        tokens = shared.shape[0]
        active = num_tokens[0]
        pypto.set_vec_tile_shapes(rows, cols)
        for i in pypto.loop((active + rows - 1) // rows, name="COMBINE_ROWS", idx_name="r"):
            start = i * rows
            valid = (active - start).min(rows)
            for c in pypto.loop(hidden // cols, name="COMBINE_COLS", idx_name="c"):
                c0 = c * cols
                acc = pypto.cast(pypto.view(routed, [rows, cols], [start, c0],
                                            valid_shape=[valid, cols]), fp32)
                for j in range(1, k):  # ascending expert order, unrolled at trace time
                    part = pypto.cast(pypto.view(routed, [rows, cols], [start, j * hidden + c0],
                                                 valid_shape=[valid, cols]), fp32)
                    if drop_last and j == k - 1:
                        part = pypto.mul(part, 0.0)
                    acc = pypto.add(acc, part)
                if round_partial:
                    acc = pypto.cast(pypto.cast(acc, bf16), fp32)
                sh = pypto.cast(pypto.view(shared, [rows, cols], [start, c0],
                                           valid_shape=[valid, cols]), fp32)
                pypto.assemble(pypto.cast(pypto.add(sh, acc), bf16), [start, c0], y)
        for p in pypto.loop((tokens - active + rows - 1) // rows, name="COMBINE_PADDING",
                            idx_name="p"):
            start = active + p * rows
            valid = (tokens - start).min(rows)
            for c in pypto.loop(hidden // cols, name="COMBINE_PAD_COLS", idx_name="c"):
                pypto.assemble(pypto.full([rows, cols], 0.0, bf16, valid_shape=[valid, cols]),
                               [start, c * cols], y)

    return moe_combine
