"""Hierarchical candidate blocks at the candidate source (golden:
``goldens.indexer.select_candidate_blocks``).

For token ``t`` over its FP32 score row (``-inf`` at masked positions) and ``n =
compressed_lens[t]``: positions form blocks of ``candidate_block_size`` (``cbs``); a block's
score is the max of its positions; the block holding position ``n - 1`` (the newest,
possibly partial block) is pinned above every score when ``n > 0``; the best
``min(candidate_topk_blocks, blocks)`` blocks are kept (equal block scores: the lower block
wins, :func:`v41.rank_select.select`), minus blocks whose score is ``-inf``; the output is
the position mask (1 on every position of a kept block, 0 elsewhere).

Kernel algorithm (per token): the block maxima are one gather of the input row in
member-major order (column ``i*blocks + b`` holds position ``b*cbs + i``) and a ``maximum``
over the ``cbs`` column slices, then ``-inf`` is mapped to ``MASKED`` by a ``maximum`` (the
same values as mapping first); the pin is an exact FP32 compare of the block index with
``floor((n - 1 + 1/2) / cbs)`` (``-1`` when ``n = 0``); the kept blocks go back to positions
with one gather of ``position // cbs``.  Each task is one subgraph of whole tokens (``ROWS``
per task once tokens exceed ``WAVE``, else one), constants recomputed in every task.

ABI
---
================  =================  =======  =====
name              shape              dtype    role
================  =================  =======  =====
scores            (tokens, width)    float32  in
compressed_lens   (tokens,)          int32    in
candidate_mask    (tokens, width)    uint8    out
================  =================  =======  =====

``width`` from the case dict (a multiple of ``cbs`` and of 8); ``tokens`` dynamic.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41 import rank_select
from v41.abi import Arg, case_int, jit_options, resolve
from v41.subgraph import one_subgraph

# Tokens per task (at most): 4 fits the UB at FLASH width; 5 was better at T=512 (24.9 us)
# but worse at T=192 (11.2 us), 8 did not compile.  WAVE: the A5 vector cores (one wave of
# single-token tasks is the fastest while tokens <= WAVE).
ROWS = 4
WAVE = 56

# No pass options: each task is one ``one_subgraph`` scope of ROWS whole tokens (FLASH TP4
# T=192 225 -> 9.5 us, T=512 438 -> 33 us, T=3 36 -> 3.2 us); the former
# ``vec_nbuffer_setting {-2: 1, -1: 2}`` merge doubled T=192 on top of the scopes.  9.5 us is
# below the 22.0 us roofline of the bytes: the cost model charges the gather that reads each
# score row straight from global memory as vector work, not at HBM bandwidth, so on a card
# the roofline is the bound to expect.
PASS_OPTIONS = {}

PIN = 3.0e38  # the newest block's score: above every finite score

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "no_pin": "does not pin the newest (partial) block",
    "higher_ties": "breaks equal block scores toward the HIGHER block",
    "skip_first": "scores a block by the max of its positions but the first",
}

ABI = (
    Arg("scores", ("tokens", "width"), "float32", "in"),
    Arg("compressed_lens", ("tokens",), "int32", "in"),
    Arg("candidate_mask", ("tokens", "width"), "uint8", "out"),
)


def dims(config, case: dict) -> dict[str, int]:
    """Named dimensions of one launch; raises ValueError naming the bad field."""
    case = case or {}
    cbs = config.index.candidate_block_size
    width = case_int(case, "width", minimum=1)
    if width % cbs or width % 8:
        raise ValueError(f"case['width']: {width} must be a multiple of candidate_block_size "
                         f"{cbs} and of 8")
    if width >= 2 ** 24:
        raise ValueError(f"case['width']: {width} must be below 2^24 (exact FP32 positions)")
    blocks = width // cbs
    return {"tokens": case_int(case, "tokens", minimum=1), "width": width, "blocks": blocks,
            "keep": min(config.index.candidate_topk_blocks, blocks), "cbs": cbs}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def _consts(pypto, width, nb, keep, cbs, first, variant):
    """Per-task constants (recomputed in every task: a hoisted constant is a task that every
    token task waits on)."""
    c = {}
    pypto.set_vec_tile_shapes(nb)
    c["bidx1"] = bidx1 = pypto.arange(0.0, float(nb), 1.0)
    pypto.set_vec_tile_shapes(keep)
    kio1 = pypto.arange(0.0, float(keep), 1.0)
    pypto.set_vec_tile_shapes(width)
    pos1 = pypto.arange(0.0, float(width), 1.0)
    c["block_of"] = pypto.cast(pypto.floor(pypto.mul(pos1, 1.0 / cbs)), pypto.DT_INT32)
    pypto.set_vec_tile_shapes(1, nb)
    bidx = pypto.reshape(bidx1, [1, nb])
    if variant == "higher_ties":
        c["rev"] = pypto.add(bidx, 1.0)
    else:
        c["rev"] = pypto.add(pypto.mul(bidx, -1.0), float(nb))
    pypto.set_vec_tile_shapes(1, keep)
    c["kio"] = pypto.reshape(kio1, [1, keep])
    # member-major gather index: column i*nb + b holds position b*cbs + first + i
    m = c["m"] = cbs - first
    pypto.set_vec_tile_shapes(nb * ((m + 1) // 2))  # 2 tiles: a [32768] FP32 cast overflows UB
    j = pypto.arange(0.0, float(nb * m), 1.0)
    member = pypto.floor(pypto.mul(j, 1.0 / nb))
    block = pypto.add(j, pypto.mul(member, -float(nb)))
    c["perm"] = pypto.cast(pypto.add(pypto.add(pypto.mul(block, float(cbs)), member),
                                     float(first)), pypto.DT_INT32)
    return c


def _row(pypto, c, scores, compressed_lens, candidate_mask, t, width, nb, keep, cbs, variant):
    """One token's row."""
    m = c["m"]
    # one gather (one index copy-out) straight from the input row; the -inf -> MASKED map
    # after the maximum (monotone: the same values as mapping first)
    pypto.set_vec_tile_shapes(1, m * nb)  # one tile: the lowered verifier refuses a split one
    g = pypto.index_select(pypto.view(scores, [1, width], [t, 0]), 1, c["perm"])
    pypto.set_vec_tile_shapes(1, nb)
    best = pypto.view(g, [1, nb], [0, 0])
    for i in range(1, m):
        best = pypto.maximum(best, pypto.view(g, [1, nb], [0, i * nb]))
    best = pypto.maximum(best, rank_select.MASKED)
    if variant != "no_pin":
        # 1-D until the flag row: a [1] -> [1, 1] reshape goes through global memory
        pypto.set_vec_tile_shapes(8)
        lv = pypto.cast(pypto.view(compressed_lens, [1], [t]), pypto.DT_FP32)
        newest = pypto.floor(pypto.mul(pypto.add(lv, -0.5), 1.0 / cbs))
        pypto.set_vec_tile_shapes(nb)
        pinned = pypto.where(pypto.eq(c["bidx1"], pypto.expand_clone(newest, [nb])), 1.0, 0.0)
        pypto.set_vec_tile_shapes(1, nb)
        best = pypto.where(pypto.gt(pypto.reshape(pinned, [1, nb]), 0.5), PIN, best)
    chosen = rank_select.select(pypto, best, c["rev"], c["kio"], nb, keep)
    flags = pypto.cast(chosen, pypto.DT_FP16)  # 0/1: exact; a narrower gather and cast
    pypto.set_vec_tile_shapes(1, width)
    mask = pypto.index_select(flags, 1, c["block_of"])
    pypto.assemble(pypto.cast(mask, pypto.DT_UINT8), [t, 0], candidate_mask)


def _tokens(pypto, t0, rows, scores, compressed_lens, candidate_mask, width, nb, keep, cbs,
            first, variant):
    """The rows ``t0 .. t0 + rows - 1`` as one task (a module-level helper: ``with`` is
    refused in the jit body)."""
    with one_subgraph(pypto):
        c = _consts(pypto, width, nb, keep, cbs, first, variant)
        for r in range(rows):
            _row(pypto, c, scores, compressed_lens, candidate_mask, t0 + r, width, nb, keep, cbs,
                 variant)


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``hierarchical_indexer(scores, compressed_lens, candidate_mask)``."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    dm = dims(config, case or {"tokens": 1, "width": 8 * config.index.candidate_block_size})
    width, nb, keep, cbs = dm["width"], dm["blocks"], dm["keep"], dm["cbs"]
    first = 1 if variant == "skip_first" else 0
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options, pass_options=PASS_OPTIONS)
    def hierarchical_indexer(
        scores: pypto.Tensor([tokens_dim, width], pypto.DT_FP32),
        compressed_lens: pypto.Tensor([tokens_dim], pypto.DT_INT32),
        candidate_mask: pypto.Tensor([tokens_dim, width], pypto.DT_UINT8),
    ):
        tokens = scores.shape[0]
        args = (scores, compressed_lens, candidate_mask, width, nb, keep, cbs, first, variant)
        # k tasks of ROWS tokens, then one task per token: as many tasks as vector cores
        # while tokens allow (one wave), ROWS-token tasks only past that
        k = ((tokens - WAVE).max(0) + ROWS - 2) // (ROWS - 1)
        k = k.min(tokens // ROWS)
        for g in pypto.loop(k, name="CAND_TOKENS", idx_name="g"):
            _tokens(pypto, g * ROWS, ROWS, *args)
        for r in pypto.loop(tokens - k * ROWS, name="CAND_TAIL", idx_name="r"):
            _tokens(pypto, k * ROWS + r, 1, *args)

    return hierarchical_indexer
