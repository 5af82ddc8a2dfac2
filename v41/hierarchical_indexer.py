"""Hierarchical candidate blocks at the candidate source (golden:
``goldens.indexer.select_candidate_blocks``).

For token ``t`` over its FP32 score row (``-inf`` at masked positions) and ``n =
compressed_lens[t]``: positions form blocks of ``candidate_block_size`` (``cbs``); a block's
score is the max of its positions; the block holding position ``n - 1`` (the newest,
possibly partial block) is pinned above every score when ``n > 0``; the best
``min(candidate_topk_blocks, blocks)`` blocks are kept (equal block scores: the lower block
wins, :func:`v41.rank_select.select`), minus blocks whose score is ``-inf``; the output is
the position mask (1 on every position of a kept block, 0 elsewhere).

Kernel algorithm (per token): ``-inf`` is mapped to ``MASKED`` by a ``maximum``; the block
maxima are ``cbs`` column gathers (``index_select`` of positions ``b*cbs + i``) combined by
``maximum``; the pin is an exact FP32 compare of the block index with
``floor((n - 1 + 1/2) / cbs)`` (``-1`` when ``n = 0``); the kept blocks go back to positions
with one gather of ``position // cbs``.

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

# Merge pairs of same-structure vector subgraphs of a loop iteration into one task: fewer
# tasks and dependency edges for the AICPU to resolve (the partition only; outputs unchanged).
# FLASH TP4 T=192 389 -> 311 us, T=512 1,038 -> 829 us, T=3 39.5 -> 36.1 us; TINY 28.9 ->
# 32.8 us (merging 4 was worse at T=192: 470 us).
PASS_OPTIONS = {"vec_nbuffer_setting": {-2: 1, -1: 2}}

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
        pypto.set_vec_tile_shapes(nb)
        bidx1 = pypto.arange(0.0, float(nb), 1.0)
        members = []
        for i in range(first, cbs):  # position b*cbs + i of every block b
            members.append(pypto.cast(pypto.add(pypto.mul(bidx1, float(cbs)), float(i)),
                                      pypto.DT_INT32))
        pypto.set_vec_tile_shapes(keep)
        kio1 = pypto.arange(0.0, float(keep), 1.0)
        pypto.set_vec_tile_shapes(width)
        pos1 = pypto.arange(0.0, float(width), 1.0)
        block_of = pypto.cast(pypto.floor(pypto.mul(pos1, 1.0 / cbs)), pypto.DT_INT32)
        pypto.set_vec_tile_shapes(1, nb)
        bidx = pypto.reshape(bidx1, [1, nb])
        if variant == "higher_ties":
            rev = pypto.add(bidx, 1.0)
        else:
            rev = pypto.add(pypto.mul(bidx, -1.0), float(nb))
        pypto.set_vec_tile_shapes(1, keep)
        kio = pypto.reshape(kio1, [1, keep])
        for t in pypto.loop(tokens, name="CAND_TOKENS", idx_name="t"):
            pypto.set_vec_tile_shapes(1, width)
            s = pypto.maximum(pypto.view(scores, [1, width], [t, 0]), rank_select.MASKED)
            pypto.set_vec_tile_shapes(1, nb)
            best = pypto.index_select(s, 1, members[0])
            for i in range(1, len(members)):
                best = pypto.maximum(best, pypto.index_select(s, 1, members[i]))
            if variant != "no_pin":
                pypto.set_vec_tile_shapes(8)
                lv = pypto.cast(pypto.view(compressed_lens, [1], [t]), pypto.DT_FP32)
                pypto.set_vec_tile_shapes(1, nb)
                newest = pypto.floor(pypto.mul(pypto.add(pypto.reshape(lv, [1, 1]), -0.5),
                                               1.0 / cbs))
                best = pypto.where(pypto.eq(bidx, pypto.expand_clone(newest, [1, nb])), PIN,
                                   best)
            chosen = rank_select.select(pypto, best, rev, kio, nb, keep)
            pypto.set_vec_tile_shapes(1, width)
            mask = pypto.index_select(chosen, 1, block_of)
            pypto.assemble(pypto.cast(mask, pypto.DT_UINT8), [t, 0], candidate_mask)

    return hierarchical_indexer
