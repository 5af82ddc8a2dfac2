"""``paged_indexer``: v41.paged_indexer (index scores over the packed MXFP4 index-key cache,
Top-K physical rows, optional Reindex candidate mask) against
``goldens.indexer.paged_indexer``.

Fixture (deterministic in the seed): ``case.requests`` requests share ``case.tokens``
tokens; each request owns a random number of pages of a nonidentity block permutation
(the rest of its table row is -1, unallocated) and its tokens see causal, increasing
``compressed_lens`` (one token sees nothing, several fewer positions than ``topk``).  The
index keys are random BF16 rows published with ``goldens.quant.quantize_index_key``
(E2M1 pairs, E8M0 group-32 scales).  q and the head weights are random BF16 (mixed signs):
the index query itself (``goldens.indexer.index_query``) is not part of this kernel.
Kinds: ``ties`` gives every request only two distinct key rows, so most scores tie and the
tie rule (lower position wins) decides the selection; ``reindex`` adds a random candidate
mask (Reindex layers); ``chunked`` sets a score budget of :data:`CHUNKED_ROWS` rows, so
the host splits the queries into several launches.

Chunking (contract): query rows go to the kernel in chunks whose FP32 score buffer
(``tokens x max(width, topk)``) fits ``max_logits_bytes`` (default 512 MiB, at least one
row: ``goldens.indexer.logits_chunk_rows``), further capped by :data:`LAUNCH_ROWS` on the
a5sim interpreter (its memory; not on an estimate-only platform, which interprets
nothing); each chunk is one launch that completes its Top-K.

Comparison: ``harness.compare.check_topk`` (eligibility, uniqueness, ascending order,
trailing -1 padding, count, cutoff-score quality against the golden's scores).
"""

from __future__ import annotations

import torch

from goldens.indexer import DEFAULT_MAX_LOGITS_BYTES, logits_chunk_rows, paged_indexer, score_row_bytes
from goldens.quant import quantize_index_key
from harness.case import Case, Support
from harness.compare.topk import check_topk
from harness.fixtures import block_table, generator, randn, split_lengths, uniform
from harness.platforms.topology import CUBE_BF16, VECTOR_FP32
from harness.entries._kernel import launch_step, sequential_cost
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes

MODULE = "v41.paged_indexer"
SUPPORT = Support(phase="prefill", tp_sizes=(1, 4), kinds=("mixed", "ties", "reindex", "chunked"))
ROW_SENTINEL = -13  # unwritten Top-K slots
CHUNKED_ROWS = 3  # score-buffer rows of the ``chunked`` kind's budget
LAUNCH_ROWS = 32  # a5sim: query rows per launch at most (~115 MB of interpreter per FLASH row)
KEY_INPUTS = ("index_key", "index_key_scale")
TOKEN_INPUTS = ("q", "weights", "token_to_req", "compressed_lens", "candidate_mask")


def pages_for(config) -> int:
    """Block-table pages per request: width 128 (TINY: two key tiles) or 1024 compressed
    positions (FLASH: twice the Top-K)."""
    return max(1, max(128, 2 * config.index.topk) // config.cache.block_size)


def build_inputs(config, case):
    ix, bs = config.index, config.cache.block_size
    t, nreq, seed = case.tokens, case.requests, case.seed
    pages = pages_for(config)
    width = pages * bs
    g = generator(seed, "pages")
    need = [int(torch.randint(max(1, pages // 2), pages + 1, (1,), generator=g)) for _ in range(nreq)]
    blocks = sum(need) + 2
    table = block_table(need, blocks, seed, "index_blocks", width=pages)
    rows = blocks * bs
    spread = torch.exp2(uniform((rows, 1), seed, "key_scale", -3.0, 2.0).round())
    keys = randn((rows, ix.head_dim), seed, "index_key") * spread
    if case.kind == "ties":  # two distinct key rows per request: most scores tie
        for r in range(nreq):
            for p in range(need[r]):
                blk = int(table[r, p])
                keys[blk * bs:(blk + 1) * bs] = keys[int(table[r, 0]) * bs + (p % 2)]
    packed, scales = quantize_index_key(keys.to(torch.bfloat16), config.cache.index_group)
    counts = split_lengths(t, nreq, seed, "tokens")
    t2r = torch.tensor([r for r, n in enumerate(counts) for _ in range(n)], dtype=torch.int32)
    lens = torch.zeros(t, dtype=torch.int32)
    at = 0
    for r, n in enumerate(counts):
        cap = need[r] * bs
        last = max(0, cap - n)  # a request longer than its pages: from 0, lens clamped to cap
        start = int(torch.randint(max(0, last - ix.topk), last + 1, (1,), generator=g))
        lens[at:at + n] = torch.arange(start + 1, start + n + 1).clamp(max=cap).to(torch.int32)
        at += n
    lens[0] = 0  # sees nothing: an all -1 row
    if t > 2:
        lens[2] = min(int(lens[2]), max(1, ix.topk // 2))  # fewer positions than topk
    inputs = {"q": randn((t, ix.n_heads, ix.head_dim), seed, "q").to(torch.bfloat16),
              "weights": randn((t, ix.n_heads), seed, "w", scale=0.5).to(torch.bfloat16),
              "index_key": packed.reshape(blocks, bs, 1, ix.head_dim // 2),
              "index_key_scale": scales.reshape(blocks, bs, 1, -1),
              "index_block_table": table, "token_to_req": t2r, "compressed_lens": lens,
              "topk_rows": torch.full((t, ix.topk), ROW_SENTINEL, dtype=torch.int32)}
    if case.kind == "reindex":  # candidate blocks of 8 positions, about half kept
        cb = config.index.candidate_block_size
        keep = torch.rand((t, -(-width // cb)), generator=generator(seed, "cand")) < 0.5
        inputs["candidate_mask"] = keep.repeat_interleave(cb, dim=1)[:, :width].to(torch.uint8)
    return inputs


def validate_launch(config, inputs) -> None:
    """Host checks before any launch: shapes, every token's request in ``[0, requests)``,
    ``compressed_lens`` in ``[0, width]`` with every page it sees allocated and inside the
    cache, a 0/1 candidate mask.  Raises ValueError naming the field and the bound."""
    ix, bs = config.index, config.cache.block_size
    q, table = inputs["q"], inputs["index_block_table"]
    t = q.shape[0]
    if tuple(q.shape[1:]) != (ix.n_heads, ix.head_dim) or q.dtype != torch.bfloat16:
        raise ValueError(f"q: expected BF16 [T, {ix.n_heads}, {ix.head_dim}], got {q.dtype} "
                         f"{tuple(q.shape)}")
    for name, shape in (("weights", (t, ix.n_heads)), ("token_to_req", (t,)),
                        ("compressed_lens", (t,))):
        if tuple(inputs[name].shape) != shape:
            raise ValueError(f"{name}: shape {tuple(inputs[name].shape)}, expected {shape}")
    if table.dtype != torch.int32 or table.dim() != 2:
        raise ValueError(f"index_block_table: expected INT32 [B, pages], got {table.dtype} "
                         f"{tuple(table.shape)}")
    nreq, pages = table.shape
    width, blocks = pages * bs, inputs["index_key"].shape[0]
    req, lens = inputs["token_to_req"].tolist(), inputs["compressed_lens"].tolist()
    for i in range(t):
        if not 0 <= req[i] < nreq:
            raise ValueError(f"token_to_req[{i}]: {req[i]} outside [0, requests={nreq})")
        if not 0 <= lens[i] <= width:
            raise ValueError(f"compressed_lens[{i}]: {lens[i]} outside [0, width={width}]")
        for p in range(-(-lens[i] // bs)):
            blk = int(table[req[i], p])
            if not 0 <= blk < blocks:
                raise ValueError(f"index_block_table[{req[i]}, {p}]: {blk} outside [0, "
                                 f"blocks={blocks}) but token {i} sees position {lens[i] - 1}")
    mask = inputs.get("candidate_mask")
    if mask is not None:
        if tuple(mask.shape) != (t, width) or mask.dtype != torch.uint8:
            raise ValueError(f"candidate_mask: expected uint8 [{t}, {width}], got {mask.dtype} "
                             f"{tuple(mask.shape)}")
        if mask.numel() and int(mask.max()) > 1:
            raise ValueError(f"candidate_mask: values must be 0 or 1, got {int(mask.max())}")


def budget_for(config, case, max_logits_bytes: int | None) -> int:
    """The score budget of ``case``: ``max_logits_bytes`` when given, else the ``chunked``
    kind's :data:`CHUNKED_ROWS` rows, else the default 512 MiB."""
    if max_logits_bytes is not None:
        return max_logits_bytes
    if case.kind == "chunked":
        width = pages_for(config) * config.cache.block_size
        return CHUNKED_ROWS * score_row_bytes(config, width)
    return DEFAULT_MAX_LOGITS_BYTES


def kernel_sut(variant: str = "reference", max_logits_bytes: int | None = None):
    """The SUT: host validation, then one launch per query chunk of the score budget."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        validate_launch(config, inputs)
        table = inputs["index_block_table"]
        width = table.shape[1] * config.cache.block_size
        t = inputs["q"].shape[0]
        step = min(launch_step(platform, t, LAUNCH_ROWS),
                   logits_chunk_rows(config, width, budget_for(config, case, max_logits_bytes)))
        masked = "candidate_mask" in inputs
        axes = {"tokens": step, "preset": case.preset, "pages": table.shape[1],
                "requests": table.shape[0], "blocks": inputs["index_key"].shape[0],
                "candidates": masked}
        options = {} if variant == "reference" else {"variant": variant}
        out, records = inputs["topk_rows"], []
        padded = max(width, config.index.topk)
        for t0 in range(0, t, step):
            n = min(step, t - t0)
            program = platform.compile(KernelSpec(MODULE, options), config, {**axes, "tokens": n})
            part = {}
            for a in program.args:
                if a.name in TOKEN_INPUTS or a.name == "topk_rows":
                    part[a.name] = inputs[a.name][t0:t0 + n].clone()
                elif a.name == "scores":  # the chunk's score buffer
                    part[a.name] = torch.zeros(n, padded, dtype=torch.float32)
                else:
                    part[a.name] = inputs[a.name]
            result = platform.launch(program, 0, part)
            result.raise_for_error()
            out[t0:t0 + n] = result.outputs["topk_rows"]
            record = result.cost_record()
            if record:
                records.append(record)
        # chunks run one after another on one rank: their times add
        return SutOutput({"topk_rows": out}, [sequential_cost(records)] if records else [])
    return run


def work(config, case, inputs):
    """Per token: its q, weights, ids and Top-K row; the block-table row; per scored key
    (every position of the tiles up to ``compressed_lens``, gathered per token) its packed
    row and scale row; its score row written and read once.  Cube: ``2*H*Dh`` BF16 FLOPs per
    scored key; vector: about 12 decode operations per key element and 6 per (head, key)."""
    ix, bs = config.index, config.cache.block_size
    pages = inputs["index_block_table"].shape[1]
    width, tile = pages * bs, min(64, pages * bs)
    scored = sum(-(-n // tile) * tile for n in inputs["compressed_lens"].tolist())
    row = tensor_bytes(inputs["index_key"][0, 0], inputs["index_key_scale"][0, 0])
    t = inputs["q"].shape[0]
    moved = tensor_bytes(*(inputs[n] for n in TOKEN_INPUTS if n in inputs), inputs["topk_rows"])
    moved += t * pages * 4 + 2 * t * 4 * max(width, ix.topk)
    return Work(moved + scored * row,
                {CUBE_BF16: 2 * ix.n_heads * ix.head_dim * scored,
                 VECTOR_FP32: scored * (12 * ix.head_dim + 6 * ix.n_heads)})


def golden(config, case, inputs):
    mask = inputs.get("candidate_mask")
    res = paged_indexer(config, inputs["q"], inputs["weights"], inputs["index_key"],
                        inputs["index_key_scale"], inputs["index_block_table"],
                        inputs["token_to_req"], inputs["compressed_lens"], inputs["q"].shape[0],
                        candidate_mask=None if mask is None else mask.bool())
    return {"topk_rows": res.topk_rows, "scores": res.scores}


def compare(config, case, inputs, gold, actual):
    mask = inputs.get("candidate_mask")
    result = check_topk("topk_rows", actual["topk_rows"], gold["topk_rows"], gold["scores"],
                        inputs["compressed_lens"], inputs["index_block_table"],
                        inputs["token_to_req"], page_size=config.cache.block_size,
                        candidate_mask=None if mask is None else mask.bool(),
                        topk=config.index.topk)
    return list(result.verdicts)


ENTRY = register(Entry(
    name="paged_indexer",
    description="paged indexer: BF16-rounded index scores over packed MXFP4 index keys "
                "decoded per 64-key tile, Top-K physical rows (ties to the lower position, "
                "ascending, -1 padded), optional Reindex candidate mask, host chunks by the "
                "FP32 score budget",
    support=SUPPORT,
    matrix=(Case(entry="paged_indexer", tokens=7, requests=2),
            Case(entry="paged_indexer", tokens=6, requests=2, kind="ties"),
            Case(entry="paged_indexer", tokens=6, requests=2, kind="reindex"),
            Case(entry="paged_indexer", tokens=8, requests=2, kind="chunked", seed=3),
            Case(entry="paged_indexer", tokens=3, requests=2, preset="flash")),
    slow_cases=(Case(entry="paged_indexer", tokens=192, tp=4, requests=4, preset="flash"),
                Case(entry="paged_indexer", tokens=512, requests=2, preset="flash", seed=3)),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut()},
    work=work,
))
