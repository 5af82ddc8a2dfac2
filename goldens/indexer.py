"""Indexer golden: index query, paged scoring over a source's FP4 index-key cache,
hierarchical candidate selection, Top-K in physical cache rows.

Math (rounding boundaries in brackets, reference-facts 4.8/4.9):

* Query (:func:`index_query`): ``q = MX(qr) @ index_wq_b`` -> ``[T, H, Dh]`` [BF16], RoPE
  on the last ``rope_dim`` channels of every head at the token's absolute position
  (compressed YaRN profile; negative position = identity) [BF16].  Weights ``w = bf16(x @
  index_weights_proj)`` (BF16 ``[hidden, H]``, FP32 accumulation), then ``w = bf16(w *
  Dh^-0.5 * H^-0.5)``.  The query is not FP4-simulated (the project's paged reference
  does not; the official model's ``fp4_act_quant(q)`` is not reproduced).
* Scores (:func:`paged_indexer`): for each visible compressed position ``k <
  compressed_lens[t]`` of the token's request, the key is the dequantized index cache row
  ``table[req, k // block] * block + k % block``; ``dot = bf16(q_h . key_k)`` (FP32
  accumulation), ``s_hk = bf16(relu(dot) * w_h)``, ``score_k = bf16(sum_h s_hk)`` stored
  in FP32.  ``k >= compressed_lens[t]`` and, when a candidate mask is supplied, positions
  outside it score ``-inf``.  Dots and the head sum are computed in FP64 and rounded once
  to FP32 before the BF16 cast (order-independent FP32 accumulation).
* Candidates (``select_candidates=True``, the candidate source's Full layer): scores padded
  with ``-inf`` to a multiple of ``candidate_block_size``; block score = max over the
  block; the block holding ``compressed_lens[t] - 1`` is pinned to ``+inf`` (the newest,
  possibly partial block); the top ``min(candidate_topk_blocks, blocks)`` blocks are kept,
  minus any whose score is ``-inf``; expanded back to a bool position mask ``[T, width]``
  in request-local compressed-position space.  The Full layer's own Top-K is NOT restricted
  by the mask it publishes; later Reindex layers pass it as ``candidate_mask``.
* Top-K: ``min(topk, width)`` best scores, ties to the LOWER logical position (stable
  descending sort); ``-inf`` picks dropped; sorted ascending by logical position; output
  the physical flattened cache rows, padded with trailing ``-1`` to ``config.index.topk``.
* Reuse: :func:`reuse_topk` returns the source's physical Top-K rows unchanged.

Width.  A request's compressed-position space is the block table's capacity, ``width =
index_block_table.shape[1] * block_size``; candidate masks are ``[T, width]``.

Query chunking.  Query rows are processed in chunks whose FP32 score buffer fits
``max_logits_bytes`` (default 512 MiB): one score row is ``4 * max(width, topk)`` bytes,
i.e. the ``width`` scores padded to at least ``topk`` columns (the Top-K row padding);
``chunk_rows = max(1, max_logits_bytes // row_bytes)`` (at least one padded row is
retained).  Each chunk completes Top-K and candidate selection before the next chunk
reuses the buffer.  Rows are independent, so every budget gives identical results.

Stale index keys (v41-math-and-peers 1.12).  The released reference scores a ratio-2
source against ``shared_attn.index_k`` even on decode steps where no group completed,
i.e. against the last publisher's (usually layer 20's) keys.  This golden follows the
FIXED semantics: the indexer reads only the index-key cache of the layer's own KV source
(``goldens.compressor`` publishes each source's keys into its own pages), bounded by each
token's causal ``compressed_lens``; a step without a completed group scores the source's
previously published keys.  Comparisons against the unmodified reference differ there.

Bad input raises :class:`ValueError` naming the field and bound before any work; nothing
here writes a cache.  Pure torch: imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from goldens.checks import check_tensor as _tensor, fail as _fail
from goldens.config import V41Config
from goldens.quant import dequantize_index_key, mxfp8_linear
from goldens.rope import apply_rope_tail

__all__ = ["DEFAULT_MAX_LOGITS_BYTES", "IndexQuery", "IndexerResult", "index_query",
           "paged_indexer", "select_candidate_blocks", "reuse_topk", "logits_chunk_rows",
           "score_row_bytes"]

DEFAULT_MAX_LOGITS_BYTES = 512 * 2**20
_NEG_INF = float("-inf")


@dataclass(frozen=True)
class IndexQuery:
    q: torch.Tensor  # BF16 [T, H, Dh], rotated
    weights: torch.Tensor  # BF16 [T, H], scaled


@dataclass(frozen=True)
class IndexerResult:
    topk_rows: torch.Tensor  # INT32 [T, topk], physical rows by logical position, -1 padded
    candidate_mask: torch.Tensor | None  # bool [T, width] when select_candidates
    scores: torch.Tensor  # FP32 [T, width] (masked positions -inf)
    num_chunks: int  # query chunks the score budget produced


def _num_tokens(num_tokens, T: int) -> None:
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 <= num_tokens <= T:
        _fail(f"num_tokens: {num_tokens!r}, expected an int in [0, T={T}]")


# ---- query -----------------------------------------------------------------------------------

def index_query(config: V41Config, qr: torch.Tensor, wq_b_payload: torch.Tensor,
                wq_b_scales: torch.Tensor, x: torch.Tensor, weights_proj: torch.Tensor,
                position_ids: torch.Tensor, num_tokens: int, freqs_cos: torch.Tensor,
                freqs_sin: torch.Tensor) -> IndexQuery:
    """Index query and head weights of the valid rows (padding rows are zero).

    ``qr`` BF16 ``[T, q_lora_rank]``; ``wq_b_payload``/``wq_b_scales`` the checkpoint FP8
    weight ``[H*Dh, q_lora_rank]`` E4M3 + uint8 E8M0 ``[H*Dh/32, q_lora_rank/32]``; ``x``
    BF16 ``[T, hidden]``; ``weights_proj`` BF16 ``[hidden, H]``; ``position_ids`` INT32
    ``[T]``; ``freqs_cos``/``freqs_sin`` FP32 ``[capacity, rope_dim/2]`` compressed-profile
    tables.
    """
    H, Dh = config.index.n_heads, config.index.head_dim
    T = qr.shape[0] if isinstance(qr, torch.Tensor) and qr.dim() == 2 else -1
    _tensor("qr", qr, torch.bfloat16, (None, config.q_lora_rank))
    _tensor("x", x, torch.bfloat16, (T, config.hidden_size))
    _tensor("weights_proj", weights_proj, torch.bfloat16, (config.hidden_size, H))
    _tensor("position_ids", position_ids, torch.int32, (T,))
    _tensor("wq_b_payload", wq_b_payload, torch.float8_e4m3fn, (H * Dh, config.q_lora_rank))
    half = config.rope_dim // 2
    _tensor("freqs_cos", freqs_cos, torch.float32, (None, half))
    _tensor("freqs_sin", freqs_sin, torch.float32, tuple(freqs_cos.shape))
    _num_tokens(num_tokens, T)
    pos = position_ids[:num_tokens].long()
    cap = freqs_cos.shape[0]
    if pos.numel() and int(pos.max()) >= cap:
        t = int((pos >= cap).nonzero()[0, 0])
        _fail(f"position_ids[{t}]: {int(pos[t])} is at or past the RoPE table capacity {cap}")
    q = torch.zeros(T, H, Dh, dtype=torch.bfloat16)
    w = torch.zeros(T, H, dtype=torch.bfloat16)
    if num_tokens == 0:
        return IndexQuery(q, w)
    n = num_tokens
    qb = mxfp8_linear(qr[:n], wq_b_payload, wq_b_scales, out_dtype=torch.bfloat16)
    valid = (pos >= 0)[:, None]
    safe = pos.clamp(min=0)
    cos = torch.where(valid, freqs_cos[safe], 1.0)
    sin = torch.where(valid, freqs_sin[safe], 0.0)
    q[:n] = apply_rope_tail(qb.view(n, H, Dh), cos, sin)
    w0 = ((x[:n].to(torch.float64) @ weights_proj.to(torch.float64)).to(torch.float32)
          .to(torch.bfloat16))
    scale = torch.tensor(Dh ** -0.5 * H ** -0.5, dtype=torch.float32)
    w[:n] = (w0.to(torch.float32) * scale).to(torch.bfloat16)
    return IndexQuery(q, w)


# ---- budget ----------------------------------------------------------------------------------

def score_row_bytes(config: V41Config, width: int) -> int:
    """FP32 bytes of one query's score row: ``width`` padded to at least ``topk`` columns."""
    return 4 * max(width, config.index.topk)


def logits_chunk_rows(config: V41Config, width: int,
                      max_logits_bytes: int = DEFAULT_MAX_LOGITS_BYTES) -> int:
    """Query rows per chunk under the score budget (at least one padded row)."""
    if isinstance(max_logits_bytes, bool) or not isinstance(max_logits_bytes, int) \
            or max_logits_bytes < 1:
        _fail(f"max_logits_bytes: {max_logits_bytes!r}, expected an int >= 1")
    return max(1, max_logits_bytes // score_row_bytes(config, width))


# ---- selection -------------------------------------------------------------------------------

def select_candidate_blocks(config: V41Config, scores: torch.Tensor,
                            compressed_lens: torch.Tensor) -> torch.Tensor:
    """Bool candidate position mask ``[n, width]`` from FP32 scores ``[n, width]`` (causally
    masked with -inf) and per-row ``compressed_lens`` ``[n]``; see the module docstring."""
    cbs = config.index.candidate_block_size
    n, width = scores.shape
    nblocks = -(-width // cbs)
    padded = torch.full((n, nblocks * cbs), _NEG_INF, dtype=torch.float32)
    padded[:, :width] = scores
    block = padded.view(n, nblocks, cbs).amax(dim=-1)
    lens = compressed_lens.long()
    has = lens > 0
    newest = ((lens - 1).clamp(min=0) // cbs)
    rows = torch.arange(n)[has]
    block[rows, newest[has]] = float("inf")
    keep = min(config.index.candidate_topk_blocks, nblocks)
    order = torch.sort(block, dim=-1, descending=True, stable=True).indices[:, :keep]
    picked = torch.gather(block, 1, order) > _NEG_INF
    bmask = torch.zeros(n, nblocks, dtype=torch.bool)
    bmask.scatter_(1, order, picked)
    return bmask.repeat_interleave(cbs, dim=1)[:, :width]


def _topk_positions(config: V41Config, scores: torch.Tensor) -> torch.Tensor:
    """INT64 ``[n, topk]`` logical positions (ascending, -1 padded) of the best finite scores,
    ties to the lower position."""
    n, width = scores.shape
    topk = config.index.topk
    k = min(topk, width)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
    finite = torch.gather(scores, 1, order) > _NEG_INF
    big = width + 1
    chosen = torch.where(finite, order, torch.full_like(order, big)).sort(dim=-1).values
    out = torch.full((n, topk), -1, dtype=torch.int64)
    out[:, :k] = torch.where(chosen == big, torch.full_like(chosen, -1), chosen)
    return out


def reuse_topk(source_topk_rows: torch.Tensor) -> torch.Tensor:
    """Reuse layers take the source's physical Top-K rows unchanged (a copy)."""
    _tensor("source_topk_rows", source_topk_rows, torch.int32, (None, None))
    return source_topk_rows.clone()


# ---- paged indexer ---------------------------------------------------------------------------

def paged_indexer(
    config: V41Config,
    q: torch.Tensor,
    weights: torch.Tensor,
    index_key: torch.Tensor,
    index_key_scale: torch.Tensor,
    index_block_table: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    compressed_lens: torch.Tensor,
    num_tokens: int,
    *,
    candidate_mask: torch.Tensor | None = None,
    select_candidates: bool = False,
    max_logits_bytes: int = DEFAULT_MAX_LOGITS_BYTES,
) -> IndexerResult:
    """Score a source's paged index-key cache and select Top-K physical rows.

    ``q`` BF16 ``[T, H, Dh]`` and ``weights`` BF16 ``[T, H]`` from :func:`index_query`;
    ``index_key`` uint8 ``[blocks, block_size, 1, Dh/2]`` and ``index_key_scale`` uint8
    E8M0 ``[blocks, block_size, 1, Dh/index_group]``; ``index_block_table`` INT32
    ``[B, pages]`` (the source's compressed block table); ``token_to_req_indices`` and
    ``compressed_lens`` INT32 ``[T]`` (``metadata.compressed_lens[source]``).  Full at the
    candidate source: ``select_candidates=True``; Reindex: ``candidate_mask`` bool
    ``[T, width]``; other Full layers: neither.  Rows ``>= num_tokens`` get ``-1``.
    """
    H, Dh = config.index.n_heads, config.index.head_dim
    T = q.shape[0] if isinstance(q, torch.Tensor) and q.dim() == 3 else -1
    _tensor("q", q, torch.bfloat16, (None, H, Dh))
    _tensor("weights", weights, torch.bfloat16, (T, H))
    bs, grp = config.cache.block_size, config.cache.index_group
    nb = index_key.shape[0] if isinstance(index_key, torch.Tensor) and index_key.dim() == 4 else -1
    _tensor("index_key", index_key, torch.uint8, (None, bs, 1, Dh // 2))
    _tensor("index_key_scale", index_key_scale, torch.uint8, (nb, bs, 1, Dh // grp))
    _tensor("index_block_table", index_block_table, torch.int32, (None, None))
    B, pages = index_block_table.shape
    width = pages * bs
    _tensor("token_to_req_indices", token_to_req_indices, torch.int32, (T,))
    _tensor("compressed_lens", compressed_lens, torch.int32, (T,))
    _num_tokens(num_tokens, T)
    if not isinstance(select_candidates, bool):
        _fail(f"select_candidates: {select_candidates!r}, expected a bool")
    if candidate_mask is not None:
        if select_candidates:
            _fail("candidate_mask: the candidate source selects its own mask and scores "
                  "unrestricted; pass candidate_mask only to Reindex layers")
        _tensor("candidate_mask", candidate_mask, torch.bool, (T, width))
    chunk_rows = logits_chunk_rows(config, width, max_logits_bytes)

    req = token_to_req_indices[:num_tokens].tolist()
    lens = compressed_lens[:num_tokens].tolist()
    table = index_block_table.tolist()
    for t in range(num_tokens):
        r, n = req[t], lens[t]
        if not 0 <= r < B:
            _fail(f"token_to_req_indices[{t}]: {r} outside [0, B={B})")
        if n < 0:
            _fail(f"compressed_lens[{t}]: {n} < 0")
        if n > width:
            _fail(f"compressed_lens[{t}]: position {n - 1} is at or past the block table "
                  f"capacity {width} ({pages} pages x {bs}) of request {r}")
        for page in range(-(-n // bs)):
            phys = table[r][page]
            if phys < 0:
                _fail(f"index_block_table[{r}, {page}]: {phys}, unallocated, but token {t} "
                      f"sees compressed positions up to {n - 1}")
            if phys >= nb:
                _fail(f"index_block_table[{r}, {page}]: block {phys} outside [0, "
                      f"num_blocks={nb})")

    topk = config.index.topk
    topk_rows = torch.full((T, topk), -1, dtype=torch.int32)
    mask_out = torch.zeros(T, width, dtype=torch.bool) if select_candidates else None
    scores_out = torch.full((T, width), _NEG_INF, dtype=torch.float32)
    if num_tokens == 0:
        return IndexerResult(topk_rows, mask_out, scores_out, 0)

    key_flat = index_key.view(-1, Dh // 2)
    scale_flat = index_key_scale.view(-1, Dh // grp)
    tbl = index_block_table.long()
    pos_all = torch.arange(width)
    phys_all = tbl[:, pos_all // bs] * bs + pos_all % bs  # [B, width], junk where unallocated
    lens_t = compressed_lens.long()
    req_t = token_to_req_indices.long()
    buffer = torch.empty(min(chunk_rows, num_tokens), max(width, topk), dtype=torch.float32)
    num_chunks = 0
    for c0 in range(0, num_tokens, chunk_rows):
        c1 = min(num_tokens, c0 + chunk_rows)
        num_chunks += 1
        scores = buffer[: c1 - c0, :width]
        scores.fill_(_NEG_INF)
        for r in sorted(set(req[c0:c1])):
            rows = torch.tensor([t for t in range(c0, c1) if req[t] == r], dtype=torch.long)
            L = int(lens_t[rows].max())
            if L == 0:
                continue
            phys = phys_all[r, :L]
            keys = dequantize_index_key(key_flat[phys], scale_flat[phys], grp)  # FP32 [L, Dh]
            dot = torch.einsum("nhd,ld->nhl", q[rows].to(torch.float64), keys.to(torch.float64))
            dot = dot.to(torch.float32).to(torch.bfloat16)
            s = (dot.relu().to(torch.float32) * weights[rows].to(torch.float32)[:, :, None])
            s = s.to(torch.bfloat16)
            score = s.to(torch.float64).sum(dim=1).to(torch.float32).to(torch.bfloat16)
            score = score.to(torch.float32)
            visible = pos_all[None, :L] < lens_t[rows][:, None]
            scores[rows - c0, :L] = torch.where(visible, score, _NEG_INF)
        if select_candidates:
            mask_out[c0:c1] = select_candidate_blocks(config, scores, lens_t[c0:c1])
        if candidate_mask is not None:
            scores.masked_fill_(~candidate_mask[c0:c1], _NEG_INF)
        logical = _topk_positions(config, scores)
        ok = logical >= 0
        r_chunk = req_t[c0:c1, None].expand_as(logical)
        phys = phys_all[r_chunk, logical.clamp(min=0)]
        topk_rows[c0:c1] = torch.where(ok, phys, torch.full_like(phys, -1)).to(torch.int32)
        scores_out[c0:c1] = scores
    return IndexerResult(topk_rows, mask_out, scores_out, num_chunks)
