"""Compressor golden: ratio-1 latent, ratio-2 paired pooling over the request-owned state
ring, and publication of compressed KV and index keys into a source's paged caches.

Math (rounding boundaries in brackets):

* Ratio 1 (C1A Full): ``latent = RMSNorm(bf16(x @ wkv), norm)`` [BF16], ``wkv`` BF16
  ``[hidden, head_dim]``; every token with a nonnegative position has a latent.
* Ratio 2 (C2A Full): ``kv = x @ wkv``, ``score = x @ wgate`` in FP32 (both weights FP32
  ``[hidden, head_dim]``).  A token at odd position ``p`` closes the pair ``(p-1, p)``:
  ``pooled = sum_j softmax_j(score)[c] * kv_j[c]`` per channel over the two rows [FP32],
  [BF16 round], ``latent = RMSNorm(pooled, norm)`` [BF16].
* Publication (Full attention owns it), at every token whose slot is ``>= 0``: compressed
  KV = ``RoPE(latent)`` on the last ``rope_dim`` channels at the *compressed position*
  (the group start ``p + 1 - ratio``, compressed YaRN profile) [BF16] -> MXFP4 g16 / E4M3
  scales; index key = ``RoPE(RMSNorm(bf16(latent @ index_wk), index_norm))`` at the same
  position [BF16] -> MXFP4 g32 / E8M0.  Index keys consume the UNROTATED latent.  Both go
  to the same physical row ``compressed_slots[t]`` (the source's compressed KV and index
  caches share one block table; ``metadata.index_slots == compressed_slots``).

Projections are the correctly rounded FP32 value of the exact dot product (computed in
FP64, then one FP32 rounding; :func:`goldens.exact.project_fp32`, shared with every FP32
projection of the goldens): this is the FP32-accumulation reference with the
summation-order dependence removed, so a row's result never depends on how many other rows
share the call (chunked and unchunked calls agree bit for bit).  RMSNorm is
:func:`goldens.norm.rms_norm` (FP64 row statistic, FP32 scaling, one BF16 cast).

State ring (ratio 2), exactly as the contract states.  ``state_cache`` is FP32
``[num_state_blocks, state_capacity, 2 * head_dim]``; a row is the token's FP32 KV
projection followed by its FP32 gate score.  For a valid token ``t`` at position ``p`` of
request ``r``: ``block = state_block_table[r, 0]`` (``-1`` disables the request: no
projection, state or cache access), ring row ``p % state_capacity`` of that block.  The
first closing token of a request chunk reads its predecessor from ring row
``(p - 1) % state_capacity``; later ones use the preceding row of the chunk.  ALL
historical reads (of every request) complete before any state write, and only the last
``min(chunk_length, state_capacity)`` rows of each request chunk are written, so each
ring row has at most one writer even when the chunk is longer than the ring.  Empty
requests, padding rows (``t >= num_tokens``) and tokens with negative positions touch
nothing.  The capacity is ``config.cache.state_capacity``; use ``dataclasses.replace`` on
the config for other rings.

Decisions:

* **In place.**  :func:`compress_and_publish` updates the caller's ``state_cache`` and the
  four paged cache tensors in place (the kernel's InOut ABI) and returns a
  :class:`CompressorResult` with the BF16 intermediates.  Every argument is validated
  first; a bad input raises :class:`ValueError` naming the field and the bound before any
  state or cache byte changes.  ``num_tokens == 0`` validates shapes only and touches
  nothing (no projection, state or cache access), whatever the padding rows hold.
* **Strict slots.**  A slot ``>= 0`` on a valid token that does not complete a group (an
  even ratio-2 position) or belongs to a disabled request raises (the released prefill
  reference raises on publishing an incomplete pair; the contract requires callers to
  disable inactive tokens' slots).  Duplicate live slots raise.  A closing token with slot
  ``-1`` simply does not publish.  Negative-position rows are inert: their slot and request
  entries are not read.
* **Stale index keys (v41-math-and-peers 1.12).**  The released reference reassigns
  ``shared_attn.index_k`` only when a latent is emitted but scores against it every step,
  so on decode steps where no ratio-2 group completes a source scores against the last
  publisher's keys (usually layer 20's).  This golden follows the FIXED semantics: each KV
  source owns its own paged index-key cache, keys are written only by that source's
  completed groups, and the indexer (``goldens.indexer``) scores only the source's own
  cache up to each token's causal ``compressed_lens`` -- a step with no completed group
  scores the source's previously published keys (or selects nothing).  The bug is not
  reproduced; a comparison against the unmodified reference will differ on such steps.

Pure torch: imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from goldens.checks import check_query_starts, check_tensor as _tensor, fail as _fail
from goldens.config import V41Config
from goldens.exact import project_fp32
from goldens.norm import rms_norm
from goldens.quant import cache_abi, quantize_compressed_kv, quantize_index_key
from goldens.rope import apply_rope_tail

__all__ = ["CompressorWeights", "SourceCaches", "CompressorResult", "compress_and_publish",
           "compressor_ratio1", "project_fp32", "rms_norm_bf16", "index_key_from_latent",
           "allocate_state_cache"]

_INT_DTYPES = (torch.int32, torch.int64)
_CACHE_NAMES = ("compressed_kv", "compressed_kv_scale", "index_key", "index_key_scale")


# ---- containers ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompressorWeights:
    """One KV source's compressor and index-key weights, input-major ``[K, N]``.

    ``wkv``: BF16 ``[hidden, head_dim]`` (ratio 1) or FP32 (ratio 2); ``wgate``: FP32
    ``[hidden, head_dim]`` (ratio 2 only, else None); ``norm``: ``[head_dim]``;
    ``index_wk``: BF16 ``[head_dim, index.head_dim]``; ``index_norm``: ``[index.head_dim]``.
    """

    wkv: torch.Tensor
    norm: torch.Tensor
    index_wk: torch.Tensor
    index_norm: torch.Tensor
    wgate: torch.Tensor | None = None


@dataclass
class SourceCaches:
    """A KV source's paged publication targets, ``[num_blocks, block_size, 1, .]`` each, as
    :func:`goldens.quant.cache_abi` lays them out (mutated in place)."""

    compressed_kv: torch.Tensor  # uint8 packed E2M1, head_dim / 2
    compressed_kv_scale: torch.Tensor  # float8_e4m3fn, head_dim / compressed_group
    index_key: torch.Tensor  # uint8 packed E2M1, index.head_dim / 2
    index_key_scale: torch.Tensor  # uint8 E8M0, index.head_dim / index_group

    @classmethod
    def allocate(cls, config: V41Config, num_blocks: int, fill: int = 0) -> "SourceCaches":
        """Fresh caches whose every byte is ``fill`` (a nonzero fill shows untouched rows)."""
        abi = cache_abi(config, num_blocks)

        def make(name):
            shape, dtype = abi[name]
            return torch.full(shape, fill, dtype=torch.uint8).view(dtype)

        return cls(make("compressed_kv"), make("compressed_kv_scale"), make("index_key"),
                   make("index_key_scale"))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"compressed_kv": self.compressed_kv,
                "compressed_kv_scale": self.compressed_kv_scale,
                "index_key": self.index_key, "index_key_scale": self.index_key_scale}

    @property
    def num_blocks(self) -> int:
        return int(self.compressed_kv.shape[0])


def allocate_state_cache(config: V41Config, num_state_blocks: int,
                         fill: float = 0.0) -> torch.Tensor:
    """FP32 ``[num_state_blocks, state_capacity, 2 * head_dim]`` ring filled with ``fill``."""
    if not isinstance(num_state_blocks, int) or num_state_blocks < 0:
        raise ValueError(f"num_state_blocks: {num_state_blocks!r}, expected an int >= 0")
    return torch.full((num_state_blocks, config.cache.state_capacity, config.state_width),
                      fill, dtype=torch.float32)


@dataclass(frozen=True)
class CompressorResult:
    """BF16 intermediates of one call, ``T`` rows (zeros where not produced).

    ``latent``: unrotated latent of every token that completes a group (ratio 1: every
    valid token; ratio 2: odd positions of enabled requests); ``produced`` marks those rows.
    ``compressed_kv`` / ``index_key``: rotated BF16 values before quantization, on
    ``published`` rows only; ``compressed_positions``: group start or -1.
    """

    latent: torch.Tensor  # BF16 [T, head_dim]
    produced: torch.Tensor  # bool [T]
    published: torch.Tensor  # bool [T]
    compressed_positions: torch.Tensor  # INT32 [T]
    compressed_kv: torch.Tensor  # BF16 [T, head_dim]
    index_key: torch.Tensor  # BF16 [T, index.head_dim]


# ---- math ------------------------------------------------------------------------------------

def rms_norm_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`goldens.norm.rms_norm` of ``x`` as BF16: FP32 math (FP64 row statistic), one
    cast to BF16 (the RMSNorm output boundary)."""
    return rms_norm(x.to(torch.bfloat16), weight, eps)


def compressor_ratio1(config: V41Config, x: torch.Tensor, wkv: torch.Tensor,
                      norm: torch.Tensor) -> torch.Tensor:
    """Ratio-1 latent ``RMSNorm(bf16(x @ wkv), norm)`` [BF16] for every row of ``x``."""
    return rms_norm_bf16(project_fp32(x, wkv).to(torch.bfloat16), norm, config.rms_norm_eps)


def pool_pairs(kv_prev: torch.Tensor, score_prev: torch.Tensor, kv_cur: torch.Tensor,
               score_cur: torch.Tensor) -> torch.Tensor:
    """FP32 per-channel softmax pooling of pair rows ``[n, D]``: ``sum_j softmax_j(s) kv_j``."""
    s = torch.stack((score_prev, score_cur)).to(torch.float32)
    kv = torch.stack((kv_prev, kv_cur)).to(torch.float32)
    return (torch.softmax(s, dim=0) * kv).sum(dim=0)


def index_key_from_latent(config: V41Config, latent: torch.Tensor, index_wk: torch.Tensor,
                          index_norm: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor) -> torch.Tensor:
    """Index key ``RoPE(RMSNorm(bf16(latent @ index_wk), index_norm))`` [BF16] from the
    UNROTATED latent; ``cos``/``sin`` are the ``[n, rope_dim/2]`` rows of the compressed
    position."""
    k = rms_norm_bf16(project_fp32(latent, index_wk).to(torch.bfloat16), index_norm,
                      config.rms_norm_eps)
    return apply_rope_tail(k, cos, sin)


# ---- validation --------------------------------------------------------------------------

def _validate_weights(config: V41Config, ratio: int, w: CompressorWeights) -> None:
    if not isinstance(w, CompressorWeights):
        _fail(f"weights: expected CompressorWeights, got {type(w).__name__}")
    h, d, di = config.hidden_size, config.head_dim, config.index.head_dim
    if ratio == 1:
        _tensor("weights.wkv", w.wkv, torch.bfloat16, (h, d))
        if w.wgate is not None:
            _fail("weights.wgate: ratio 1 has no gate; expected None")
    else:
        _tensor("weights.wkv", w.wkv, torch.float32, (h, d))
        _tensor("weights.wgate", w.wgate, torch.float32, (h, d))
    _tensor("weights.norm", w.norm, (torch.float32, torch.bfloat16), (d,))
    _tensor("weights.index_wk", w.index_wk, torch.bfloat16, (d, di))
    _tensor("weights.index_norm", w.index_norm, (torch.float32, torch.bfloat16), (di,))


def _validate_caches(config: V41Config, caches: SourceCaches) -> None:
    if not isinstance(caches, SourceCaches):
        _fail(f"caches: expected SourceCaches, got {type(caches).__name__}")
    nb = caches.compressed_kv.shape[0] if isinstance(caches.compressed_kv, torch.Tensor) else 0
    abi = cache_abi(config, int(nb))
    for name in _CACHE_NAMES:
        shape, dtype = abi[name]
        _tensor(f"caches.{name}", getattr(caches, name), dtype, shape)


# ---- the entry -------------------------------------------------------------------------------

def compress_and_publish(
    config: V41Config,
    ratio: int,
    x: torch.Tensor,
    weights: CompressorWeights,
    *,
    query_start_loc: torch.Tensor,
    position_ids: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    num_tokens: int,
    compressed_slots: torch.Tensor,
    freqs_cos: torch.Tensor,
    freqs_sin: torch.Tensor,
    caches: SourceCaches,
    state_block_table: torch.Tensor | None = None,
    state_cache: torch.Tensor | None = None,
) -> CompressorResult:
    """Run one KV source's compressor over a packed batch and publish in place.

    ``x`` BF16 ``[T, hidden]`` (the source layer's normalized attention input; rows
    ``>= num_tokens`` are padding); ``query_start_loc`` INT32 ``[B+1]`` with
    ``query_start_loc[-1] == num_tokens``; ``position_ids`` / ``token_to_req_indices``
    INT32 ``[T]``; ``compressed_slots`` INT64/INT32 ``[T]`` physical rows of
    ``caches`` (``-1`` = do not publish); ``freqs_cos`` / ``freqs_sin`` the serving-owned
    FP32 ``[capacity, rope_dim/2]`` tables of the compressed profile.  Ratio 2 also needs
    ``state_block_table`` INT32 ``[B, 1]`` and the FP32 ``state_cache`` ring.
    See the module docstring for the math, the ring rules and the decisions.
    """
    plan = _validate(config, ratio, x, weights, query_start_loc, position_ids,
                     token_to_req_indices, num_tokens, compressed_slots, freqs_cos, freqs_sin,
                     caches, state_block_table, state_cache)
    T = x.shape[0]
    d, di = config.head_dim, config.index.head_dim
    latent = torch.zeros(T, d, dtype=torch.bfloat16)
    rot_kv = torch.zeros(T, d, dtype=torch.bfloat16)
    rot_key = torch.zeros(T, di, dtype=torch.bfloat16)
    produced = torch.zeros(T, dtype=torch.bool)
    published = torch.zeros(T, dtype=torch.bool)
    cpos = torch.full((T,), -1, dtype=torch.int32)
    if num_tokens == 0 or not plan.active:
        return CompressorResult(latent, produced, published, cpos, rot_kv, rot_key)

    active = torch.tensor(plan.active, dtype=torch.long)
    pos = position_ids.long()
    if ratio == 1:
        latent[active] = compressor_ratio1(config, x[active], weights.wkv, weights.norm)
        produced[active] = True
    else:
        _ratio2(config, x, weights, plan, pos, state_cache, latent, produced)

    cpos[produced] = (pos[produced] + 1 - ratio).to(torch.int32)
    pub = torch.tensor(plan.publish, dtype=torch.long)
    if pub.numel():
        slots = compressed_slots.long()[pub]
        p = cpos[pub].long()
        cos, sin = freqs_cos[p], freqs_sin[p]
        rot_kv[pub] = apply_rope_tail(latent[pub], cos, sin)
        rot_key[pub] = index_key_from_latent(config, latent[pub], weights.index_wk,
                                             weights.index_norm, cos, sin)
        published[pub] = True
        cc = config.cache
        kv_payload, kv_scale = quantize_compressed_kv(rot_kv[pub], cc.compressed_group)
        ik_payload, ik_scale = quantize_index_key(rot_key[pub], cc.index_group)
        for cache, value in ((caches.compressed_kv, kv_payload),
                             (caches.compressed_kv_scale, kv_scale),
                             (caches.index_key, ik_payload), (caches.index_key_scale, ik_scale)):
            # float8 index_put is not implemented on CPU: write the bytes.
            flat = cache.view(torch.uint8).view(-1, cache.shape[-1])
            flat[slots] = value.view(torch.uint8)
    return CompressorResult(latent, produced, published, cpos, rot_kv, rot_key)


@dataclass
class _Plan:
    active: list[int]  # valid rows that are projected (ratio 2: of enabled requests)
    chunks: list[tuple[int, list[int]]]  # ratio 2: (state block, rows) per live request
    publish: list[int]  # rows whose latent goes to compressed_slots


def _ratio2(config, x, weights, plan: _Plan, pos, state_cache, latent, produced) -> None:
    cap = config.cache.state_capacity
    d = config.head_dim
    active = torch.tensor(plan.active, dtype=torch.long)
    kv_all = torch.zeros(x.shape[0], d, dtype=torch.float32)
    sc_all = torch.zeros(x.shape[0], d, dtype=torch.float32)
    xa = x[active]
    kv_all[active] = project_fp32(xa, weights.wkv)
    sc_all[active] = project_fp32(xa, weights.wgate)

    # phase 1: every historical read, before any write
    ring_reads: dict[int, torch.Tensor] = {}
    for block, rows in plan.chunks:
        p0 = int(pos[rows[0]])
        if p0 % 2 == 1:
            ring_reads[rows[0]] = state_cache[block, (p0 - 1) % cap].clone()

    # phase 2: pooling of every closing row
    prev_kv, prev_sc, closing = [], [], []
    for block, rows in plan.chunks:
        for i, t in enumerate(rows):
            if int(pos[t]) % 2 == 0:
                continue
            if i == 0:
                row = ring_reads[t]
                prev_kv.append(row[:d])
                prev_sc.append(row[d:])
            else:
                prev_kv.append(kv_all[rows[i - 1]])
                prev_sc.append(sc_all[rows[i - 1]])
            closing.append(t)
    if closing:
        c = torch.tensor(closing, dtype=torch.long)
        pooled = pool_pairs(torch.stack(prev_kv), torch.stack(prev_sc), kv_all[c], sc_all[c])
        latent[c] = rms_norm_bf16(pooled.to(torch.bfloat16), weights.norm, config.rms_norm_eps)
        produced[c] = True

    # phase 3: ring writes, the last min(chunk, capacity) rows of each request chunk
    for block, rows in plan.chunks:
        for t in rows[-min(len(rows), cap):]:
            slot = int(pos[t]) % cap
            state_cache[block, slot, :d] = kv_all[t]
            state_cache[block, slot, d:] = sc_all[t]


def _validate(config, ratio, x, weights, qsl_t, pos_t, req_t, num_tokens, slots_t,
              freqs_cos, freqs_sin, caches, sbt, state_cache) -> _Plan:
    if not isinstance(config, V41Config):
        _fail(f"config: expected V41Config, got {type(config).__name__}")
    if ratio not in (1, 2):
        _fail(f"ratio: {ratio!r}, expected 1 or 2 (ratio 0 layers have no compressor)")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        _fail(f"x: expected a BF16 [T, {config.hidden_size}] tensor")
    T = x.shape[0]
    _tensor("x", x, torch.bfloat16, (T, config.hidden_size))
    _validate_weights(config, ratio, weights)
    _tensor("query_start_loc", qsl_t, torch.int32, (None,))
    if qsl_t.shape[0] < 1:
        _fail("query_start_loc: shape [0], expected [B+1] with B >= 0")
    B = qsl_t.shape[0] - 1
    _tensor("position_ids", pos_t, torch.int32, (T,))
    _tensor("token_to_req_indices", req_t, torch.int32, (T,))
    _tensor("compressed_slots", slots_t, _INT_DTYPES, (T,))
    half = config.rope_dim // 2
    _tensor("freqs_cos", freqs_cos, torch.float32, (None, half))
    _tensor("freqs_sin", freqs_sin, torch.float32, tuple(freqs_cos.shape))
    _validate_caches(config, caches)
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 <= num_tokens <= T:
        _fail(f"num_tokens: {num_tokens!r}, expected an int in [0, T={T}]")
    nsb = 0
    if ratio == 1:
        if sbt is not None or state_cache is not None:
            _fail("state_block_table/state_cache: ratio 1 has no recurrent compressor state; "
                  "pass None")
    else:
        _tensor("state_block_table", sbt, torch.int32, (B, 1))
        cap = config.cache.state_capacity
        if not isinstance(state_cache, torch.Tensor) or state_cache.dim() != 3:
            _fail(f"state_cache: expected FP32 [num_state_blocks, {cap}, {config.state_width}]")
        nsb = state_cache.shape[0]
        _tensor("state_cache", state_cache, torch.float32, (nsb, cap, config.state_width))

    qsl = qsl_t.tolist()
    check_query_starts(qsl)
    if qsl[-1] != num_tokens:
        _fail(f"num_tokens: {num_tokens} != query_start_loc[-1] = {qsl[-1]} (the valid packed "
              f"prefix)")
    plan = _Plan([], [], [])
    if num_tokens == 0:
        return plan  # no projection, state or output access

    pos = pos_t[:num_tokens].tolist()
    req = req_t[:num_tokens].tolist()
    slots = slots_t[:num_tokens].tolist()
    blocks = sbt[:, 0].tolist() if ratio == 2 else None
    capacity = freqs_cos.shape[0]
    rows_total = caches.num_blocks * config.cache.block_size
    owner: dict[int, int] = {}
    seen_slot: dict[int, int] = {}
    for r in range(B):
        s, e = qsl[r], qsl[r + 1]
        if s == e:
            continue  # empty request: no state access
        rows = []
        for t in range(s, e):
            if pos[t] < 0:
                continue  # inert row
            if req[t] != r:
                _fail(f"token_to_req_indices[{t}]: {req[t]}, expected {r} (the batch row "
                      f"whose query_start_loc range [{s}, {e}) holds token {t})")
            if rows and pos[t] != pos[rows[-1]] + 1:
                _fail(f"position_ids[{t}]: {pos[t]}, expected {pos[rows[-1]] + 1}; positions "
                      f"must be consecutive within request {r}'s chunk")
            rows.append(t)
        if not rows:
            continue
        enabled = True
        if ratio == 2:
            blk = blocks[r]
            if blk < -1 or blk >= nsb:
                _fail(f"state_block_table[{r}, 0]: {blk} outside [-1, num_state_blocks={nsb}) "
                      f"(-1 disables request {r})")
            enabled = blk >= 0
            if enabled:
                if blk in owner:
                    _fail(f"state_block_table[{r}, 0]: live requests must own distinct state "
                          f"blocks: requests {owner[blk]} and {r} both own block {blk}")
                owner[blk] = r
                plan.chunks.append((blk, rows))
        for t in rows:
            closes = (pos[t] + 1) % ratio == 0 and enabled
            if enabled:
                plan.active.append(t)
            if closes and pos[t] + 1 - ratio >= capacity:
                _fail(f"position_ids[{t}]: compressed position {pos[t] + 1 - ratio} is at or past "
                      f"the RoPE table capacity {capacity}")
            slot = slots[t]
            if slot < 0:
                if slot != -1:
                    _fail(f"compressed_slots[{t}]: {slot}, expected -1 or a row in "
                          f"[0, {rows_total})")
                continue
            if not enabled:
                _fail(f"compressed_slots[{t}]: {slot} >= 0 but request {r}'s compressor is "
                      f"disabled (state block -1); callers must pass -1")
            if not closes:
                _fail(f"compressed_slots[{t}]: {slot} >= 0 at position {pos[t]}, which does not "
                      f"complete a ratio-{ratio} group (incomplete group publication)")
            if slot >= rows_total:
                _fail(f"compressed_slots[{t}]: {slot} at or past the cache rows {rows_total} "
                      f"({caches.num_blocks} blocks x {config.cache.block_size})")
            if slot in seen_slot:
                _fail(f"compressed_slots[{t}]: row {slot} is also published by token "
                      f"{seen_slot[slot]}; each cache row has one writer")
            seen_slot[slot] = t
            plan.publish.append(t)
    return plan
