"""Input pack kernel: token embeddings into the mHC residual lanes (golden:
``goldens.boundary.embed``).

``x_hc[t, h, :] = float32(embed[token_ids[t], :])`` for every lane ``h < hc_mult``: the BF16
table row gathered in the kernel (``index_select`` of the table by the id tile), upcast
exactly to FP32 and replicated over the lanes.  An id of ``-1`` (a padding row in the
golden's convention) gathers row 0 and is replaced by an exact ``+0.0`` row (``where``, not
a multiply: ``-x * 0`` would leave ``-0.0``).

Inactive rows: rows ``t >= num_tokens`` are written as exact zeros by a second loop and
their ids are never read (the last active tile's ``valid_shape`` stops at row
``num_tokens - 1``).  ``num_tokens`` is a runtime INT32 ``[1]`` tensor; the caller checks it
to ``[0, tokens]`` and the active ids to ``[-1, vocab)`` before launch
(``harness.entries.input_pack.validate_launch``): an id at or past ``vocab`` would be an
out-of-range gather.

ABI
---
============  ======================  ========  =====
name          shape                   dtype     role
============  ======================  ========  =====
token_ids     (tokens,)               int32     in
num_tokens    (1,)                    int32     in
embed         (vocab, hidden)         bfloat16  in
x_hc          (tokens, hc, hidden)    float32   out
============  ======================  ========  =====

``x_hc`` is 3-D, the layout ``v41.hc_pre`` / ``v41.hc_head`` read.  ``tokens`` from
``case["tokens"]`` (>= 1) is a dynamic axis.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve
from v41.subgraph import one_subgraph

# Each loop iteration is one task (see _embed_rows); a task's time grows with its rows (the
# four FP32 lane writes), and the launch's tasks queue on dispatch past ~48 of them.  FLASH
# (hidden 5,120): T=21 1 row 4.0 us, 2 rows 4.6, 4 rows 5.6; T=96 1 row 9.6, 2 rows 4.6, 4
# rows 5.8; T=192 2 rows 11.9, 4 rows 5.8, 8 rows 16.2.
MOST_TASKS = 48
ROW_TILES = (1, 2, 4)
VEC_TILE_FP32_ELEMS = 20480  # FP32 elements per vector tile (80 KiB: [4, 5120] compiles)

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "lane0_only": "writes the embedding row to lane 0 only, zeros to the other lanes",
    "index_off_by_one": "gathers row id + 1 (an index slip)",
    "no_pad_mask": "a -1 id keeps the gathered row 0 instead of a zero row",
    "skip_padding": "leaves rows at or past num_tokens unwritten",
    "embed_padding": "embeds every row, also rows at or past num_tokens",
}

ABI = (
    Arg("token_ids", ("tokens",), "int32", "in"),
    Arg("num_tokens", (1,), "int32", "in"),
    Arg("embed", ("vocab", "hidden"), "bfloat16", "in"),
    Arg("x_hc", ("tokens", "hc", "hidden"), "float32", "out"),
)


def row_tile(tokens: int) -> int:
    """Rows per loop iteration for a launch of ``tokens`` rows (a trace-time constant): the
    smallest of ``ROW_TILES`` that keeps the tasks at or below ``MOST_TASKS``."""
    for rows in ROW_TILES:
        if -(-tokens // rows) <= MOST_TASKS:
            return rows
    return ROW_TILES[-1]


def dims(config, case: dict) -> dict[str, int]:
    return {"tokens": case_int(case, "tokens", minimum=1), "vocab": config.vocab_size,
            "hc": config.hc.hc_mult, "hidden": config.hidden_size}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def _embed_rows(pypto, start, active, rows, tile_rows, hc, hidden, vocab, token_ids, embed,
                x_hc, shift, mask_pad, lane0):
    """Rows ``start .. start + rows - 1`` (clipped at ``active``) of ``x_hc``, one subgraph."""
    with one_subgraph(pypto):
        valid = (active - start).min(rows)
        pypto.set_vec_tile_shapes(rows)
        ids = pypto.view(token_ids, [rows], [start], valid_shape=[valid])
        safe = pypto.maximum(ids, 0)
        if shift:
            safe = pypto.minimum(pypto.add(safe, 1), vocab - 1)
        keep = pypto.reshape(pypto.ge(pypto.cast(ids, pypto.DT_FP32), 0.0), [rows, 1],
                             valid_shape=[valid, 1])
        pypto.set_vec_tile_shapes(tile_rows, hidden)
        x = pypto.cast(pypto.index_select(embed, 0, safe), pypto.DT_FP32)  # [rows, D]
        if mask_pad:
            x = pypto.where(pypto.expand_clone(keep, [rows, hidden],
                                               valid_shape=[valid, hidden]), x, 0.0)
        pypto.set_vec_tile_shapes(tile_rows, 1, hidden)
        x3 = pypto.reshape(x, [rows, 1, hidden], valid_shape=[valid, 1, hidden])
        for h in range(hc):  # lanes, unrolled at trace time
            if lane0 and h > 0:
                lane = pypto.full([rows, 1, hidden], 0.0, pypto.DT_FP32,
                                  valid_shape=[valid, 1, hidden])
            else:
                lane = x3
            pypto.assemble(lane, [start, h, 0], x_hc)


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``input_pack(token_ids, num_tokens, embed, x_hc)``: active rows get
    their embedding row on every lane (zero for id -1), the rest exact zeros."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    vocab, hc, hidden = config.vocab_size, config.hc.hc_mult, config.hidden_size
    rows = row_tile(case_int(case, "tokens", default=1, minimum=1))
    tile_rows = max(1, min(rows, VEC_TILE_FP32_ELEMS // hidden))
    shift = variant == "index_off_by_one"
    mask_pad = variant != "no_pad_mask"
    lane0 = variant == "lane0_only"
    embed_padding = variant == "embed_padding"
    zero_padding = variant not in ("skip_padding", "embed_padding")
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options)
    def input_pack(
        token_ids: pypto.Tensor([tokens_dim], pypto.DT_INT32),
        num_tokens: pypto.Tensor([1], pypto.DT_INT32),
        embed: pypto.Tensor([vocab, hidden], pypto.DT_BF16),
        x_hc: pypto.Tensor([tokens_dim, hc, hidden], pypto.DT_FP32),
    ):
        tokens = token_ids.shape[0]
        if embed_padding:
            active = tokens
        else:
            active = num_tokens[0]
        for i in pypto.loop((active + rows - 1) // rows, name="INPUT_PACK_ROWS", idx_name="r"):
            _embed_rows(pypto, i * rows, active, rows, tile_rows, hc, hidden, vocab, token_ids,
                        embed, x_hc, shift, mask_pad, lane0)
        if zero_padding:  # rows active .. tokens - 1: exact zeros on every lane
            pypto.set_vec_tile_shapes(tile_rows, 1, hidden)
            for p in pypto.loop((tokens - active + rows - 1) // rows, name="INPUT_PACK_PADDING",
                                idx_name="p"):
                start = active + p * rows
                valid = (tokens - start).min(rows)
                for h in range(hc):
                    zero = pypto.full([rows, 1, hidden], 0.0, pypto.DT_FP32,
                                      valid_shape=[valid, 1, hidden])
                    pypto.assemble(zero, [start, h, 0], x_hc)

    return input_pack
