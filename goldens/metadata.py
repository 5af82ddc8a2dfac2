"""Forward metadata: lower a packed ragged batch to per-token cache addressing.

One lowering serves packed prefill (several rows per request, ``kv_seq_lens`` zero or a
cached prefix) and continuous-batch decode (1-6 rows per request over long prefixes).
Inputs are the engine's view of the batch:

* ``query_start_loc`` INT32 ``[B+1]`` -- packed row boundaries; equal neighbours are an
  empty request.
* ``kv_seq_lens`` INT32 ``[B]`` -- tokens already cached per request; the new rows of
  request ``r`` sit at absolute positions ``kv_seq_lens[r] .. kv_seq_lens[r]+len-1``.
* ``window_block_table`` INT32 ``[B, pages]`` -- window-KV pages (block ``config.cache
  .block_size``); ``-1`` is an unallocated page.
* ``compressed_block_tables`` ``{source: INT32 [B, pages]}`` -- one table per compressed
  KV source (``config.kv_source_layer_ids``); compressed KV and index keys of a source share
  it.  Index-only (reindex) and reuse layers read their KV source's caches, so all
  compressed metadata is keyed by KV source; find a layer's source with
  ``config.layer_config(layer).kv_source``.
* ``state_block_tables`` ``{source: INT32 [B, 1]}`` -- the engine-owned compressor state
  block of every request, required for ratio-2 sources only (ratio 1 has no state);
  ``-1`` disables that request's compressor.

Decisions recorded here (the tests pin them):

* **Padding rows.**  ``T = num_padded_tokens`` may exceed ``num_tokens =
  query_start_loc[-1]``; rows ``num_tokens .. T-1`` are storage padding and get
  ``token_to_req_indices = -1``, ``position_ids = -1``, every slot ``-1`` (window,
  compressed, index), ``window_indices`` all ``-1``, ``window_lens = 0``,
  ``compressed_lens = 0`` and ``compressed_rope_position_ids = -1``.  ``moe_token_owners``
  covers the whole padded extent (``arange(T) % tp``): TP owner slabs include padding rows.
* **Same-ratio table sharing.**  Sources with the same ratio must share one compressed
  block table: the tables must be the same tensor object *or* have equal shape and
  contents.  Equal contents are accepted because a table reloaded from a replay file
  cannot keep object identity; what matters is that the sources address the same pages.
* **Disabled compressor.**  A ratio-2 request whose state block is ``-1`` gets
  ``compressed_slots``/``index_slots`` ``-1`` for its rows.  Its lengths, compressor
  groups (``compressor_output_start_loc`` etc.) and ``compressed_rope_position_ids`` are
  still derived from positions alone -- they describe the geometry, and the slots are what
  suppress publication.  Its visible compressed pages must still be allocated (readers
  address them).
* **Strict keys.**  ``compressed_block_tables`` must hold exactly the KV sources;
  ``state_block_tables`` exactly the ratio-2 KV sources.

Every validation failure raises :class:`ValueError` naming the field, the request where
there is one, and the violated bound; all validation runs before anything is built.
Pure torch: this module imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import torch

from goldens.checks import check_query_starts, check_tensor, fail as _fail
from goldens.config import V41Config

__all__ = ["ForwardMetadata", "build_forward_metadata", "compressed_sources"]

_I32 = torch.int32
_I64 = torch.int64
_I32_MAX = 2**31 - 1


@dataclass(frozen=True)
class ForwardMetadata:
    """Lowered batch metadata.  ``B`` requests, ``T`` padded token rows, ``G[src]`` new
    compressor groups of a source.  Per-source mappings are keyed by KV source layer id."""

    num_tokens: int  # valid packed rows = query_start_loc[-1]
    num_padded_tokens: int  # T, the tensor extent (>= num_tokens)
    source_ratios: Mapping[int, int]  # KV source layer -> compression ratio
    query_start_loc: torch.Tensor  # INT32 [B+1]
    query_lens: torch.Tensor  # INT32 [B]
    logit_row_indices: torch.Tensor  # INT32 [B], last row of each request or -1
    token_to_req_indices: torch.Tensor  # INT32 [T], batch row, -1 on padding
    moe_token_owners: torch.Tensor  # INT32 [T], arange(T) % tp
    position_ids: torch.Tensor  # INT32 [T], absolute position, -1 on padding
    kv_seq_lens: torch.Tensor  # INT32 [B], before this step
    new_kv_seq_lens: torch.Tensor  # INT32 [B], kv_seq_lens + query_lens
    window_slots: torch.Tensor  # INT64 [T], physical window row of the token
    window_indices: torch.Tensor  # INT32 [T, sliding_window], ascending, -1 padded
    window_lens: torch.Tensor  # INT32 [T], min(p+1, sliding_window)
    compressed_slots: Mapping[int, torch.Tensor]  # INT64 [T]
    index_slots: Mapping[int, torch.Tensor]  # INT64 [T], equal to compressed_slots
    state_block_tables: Mapping[int, torch.Tensor]  # INT32 [B, 1], ratio-2 sources
    compressed_seq_lens: Mapping[int, torch.Tensor]  # INT32 [B], new_kv_len // ratio
    compressed_seq_remainders: Mapping[int, torch.Tensor]  # INT32 [B], new_kv_len % ratio
    compressed_lens: Mapping[int, torch.Tensor]  # INT32 [T], (p+1) // ratio
    compressor_output_start_loc: Mapping[int, torch.Tensor]  # INT32 [B+1]
    compressor_source_token_indices: Mapping[int, torch.Tensor]  # INT32 [G]
    compressor_position_ids: Mapping[int, torch.Tensor]  # INT32 [G], g * ratio
    compressed_rope_position_ids: Mapping[int, torch.Tensor]  # INT32 [T]

    @property
    def num_requests(self) -> int:
        return int(self.query_lens.shape[0])


def compressed_sources(config: V41Config) -> dict[int, int]:
    """``{kv source layer: ratio}``: the layers that own compressed KV and index caches."""
    return {src: config.compress_ratios[src] for src in config.kv_source_layer_ids}


# ---- validation ------------------------------------------------------------

def _check_tensor(name: str, t, shape: tuple) -> None:
    """An INT32 tensor; ``shape`` entries are ints or None (any extent)."""
    check_tensor(name, t, _I32, shape)


def _check_pages(name: str, table: list[list[int]], r: int, rows: int, bs: int) -> None:
    """Request ``r`` addresses logical rows ``0 .. rows-1`` through ``table[r]``."""
    need = -(-rows // bs)
    width = len(table[r]) if table else 0
    if need > width:
        _fail(f"{name}: request {r} needs {need} pages for {rows} rows (block size {bs}) "
              f"but the table has {width} columns")
    for page in range(need):
        phys = table[r][page]
        if phys < 0:
            _fail(f"{name}: request {r} page {page} (rows {page * bs}..{page * bs + bs - 1}) "
                  f"is {phys}, unallocated; {rows} rows need pages 0..{need - 1} >= 0")
        if phys * bs + bs - 1 > _I32_MAX:
            _fail(f"{name}: request {r} page {page} = {phys} overflows INT32 rows "
                  f"(block size {bs}, bound {_I32_MAX})")


def _validate(config, query_start_loc, kv_seq_lens, window_block_table,
              compressed_block_tables, state_block_tables, num_padded_tokens,
              num_state_blocks, tp) -> None:
    _check_tensor("query_start_loc", query_start_loc, (None,))
    if query_start_loc.shape[0] < 1:
        _fail("query_start_loc: shape [0], expected [B+1] with B >= 0")
    B = query_start_loc.shape[0] - 1
    _check_tensor("kv_seq_lens", kv_seq_lens, (B,))
    _check_tensor("window_block_table", window_block_table, (B, None))
    if not isinstance(tp, int) or tp < 1:
        _fail(f"tp: {tp!r}, expected an int >= 1")
    if num_state_blocks is not None and (not isinstance(num_state_blocks, int)
                                         or num_state_blocks < 0):
        _fail(f"num_state_blocks: {num_state_blocks!r}, expected an int >= 0")

    sources = compressed_sources(config)
    ratio2 = [s for s, r in sources.items() if r == 2]
    if not isinstance(compressed_block_tables, Mapping):
        _fail("compressed_block_tables: expected a dict {source layer: INT32 [B, pages]}")
    if not isinstance(state_block_tables, Mapping):
        _fail("state_block_tables: expected a dict {ratio-2 source layer: INT32 [B, 1]}")
    for src in sources:
        if src not in compressed_block_tables:
            _fail(f"compressed_block_tables[{src}]: missing; every compressed KV source "
                  f"{sorted(sources)} needs a table")
    for key in compressed_block_tables:
        if key not in sources:
            _fail(f"compressed_block_tables[{key}]: layer {key} is not a compressed KV source "
                  f"{sorted(sources)}")
    for src in ratio2:
        if src not in state_block_tables:
            _fail(f"state_block_tables[{src}]: missing; ratio-2 source {src} needs an "
                  f"INT32 [B, 1] state block table")
    for key in state_block_tables:
        if key not in ratio2:
            _fail(f"state_block_tables[{key}]: layer {key} is not a ratio-2 KV source "
                  f"{ratio2}; only ratio-2 compressors own state")
    for src in sources:
        _check_tensor(f"compressed_block_tables[{src}]", compressed_block_tables[src], (B, None))
    for src in ratio2:
        _check_tensor(f"state_block_tables[{src}]", state_block_tables[src], (B, 1))

    # same-ratio sources share one table (same object or equal shape and contents)
    first_of_ratio: dict[int, int] = {}
    for src, ratio in sources.items():
        if ratio not in first_of_ratio:
            first_of_ratio[ratio] = src
            continue
        a, b = compressed_block_tables[first_of_ratio[ratio]], compressed_block_tables[src]
        if a is not b and (a.shape != b.shape or not torch.equal(a, b)):
            _fail(f"compressed_block_tables[{src}]: ratio-{ratio} sources must share one "
                  f"compressed block table, but it differs from compressed_block_tables"
                  f"[{first_of_ratio[ratio]}]")

    qsl = query_start_loc.tolist()
    kv = kv_seq_lens.tolist()
    check_query_starts(qsl)
    num_tokens = qsl[-1]
    if num_padded_tokens is not None:
        if not isinstance(num_padded_tokens, int) or num_padded_tokens < num_tokens:
            _fail(f"num_padded_tokens: {num_padded_tokens!r}, expected an int >= num_tokens "
                  f"= query_start_loc[-1] = {num_tokens}")
    max_pos = config.rope.max_position
    for r in range(B):
        if kv[r] < 0:
            _fail(f"kv_seq_lens: request {r} has kv_seq_lens = {kv[r]}, expected >= 0")
        new_len = kv[r] + qsl[r + 1] - qsl[r]
        if new_len > max_pos:
            _fail(f"kv_seq_lens: request {r} new length {new_len} exceeds rope.max_position "
                  f"{max_pos}")

    bs = config.cache.block_size
    window = window_block_table.tolist()
    ctables = {src: compressed_block_tables[src].tolist() for src in sources}
    for r in range(B):
        if qsl[r + 1] == qsl[r]:
            continue  # an empty request reads and writes nothing
        new_len = kv[r] + qsl[r + 1] - qsl[r]
        _check_pages("window_block_table", window, r, new_len, bs)
        for src, ratio in sources.items():
            _check_pages(f"compressed_block_tables[{src}]", ctables[src], r, new_len // ratio, bs)

    for src in ratio2:
        check_state_blocks(f"state_block_tables[{src}]", state_block_tables[src], qsl,
                           num_state_blocks)


def check_state_blocks(name: str, table: torch.Tensor, qsl: list[int],
                       num_state_blocks: int | None) -> None:
    """State blocks are -1 (disabled) or in ``[0, num_state_blocks)``, and live requests
    (non-empty, block >= 0) own distinct blocks; raises naming the request and the bound."""
    owner: dict[int, int] = {}
    for r, blk in enumerate(table[:, 0].tolist()):
        if blk < -1:
            _fail(f"{name}: request {r} state block {blk} < -1 (-1 disables, else >= 0)")
        if num_state_blocks is not None and blk >= num_state_blocks:
            _fail(f"{name}: request {r} state block {blk} >= num_state_blocks "
                  f"{num_state_blocks} (block id out of range)")
        if blk < 0 or qsl[r + 1] == qsl[r]:
            continue
        if blk in owner:
            _fail(f"{name}: live requests must own distinct state blocks: request {r} "
                  f"and request {owner[blk]} both own block {blk}")
        owner[blk] = r


# ---- lowering --------------------------------------------------------------

def _paged_rows(table: torch.Tensor, req: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor,
                bs: int) -> torch.Tensor:
    """INT64 ``table[req, rows // bs] * bs + rows % bs`` where ``valid``, else -1."""
    if not bool(valid.any()):
        return torch.full(rows.shape, -1, dtype=_I64)
    safe_req = torch.where(valid, req, torch.zeros_like(req)).long()
    safe_rows = torch.where(valid, rows, torch.zeros_like(rows)).long()
    page = table.long()[safe_req, (safe_rows // bs).clamp(max=table.shape[1] - 1)]
    return torch.where(valid, page * bs + safe_rows % bs, torch.full_like(page, -1))


def build_forward_metadata(
    config: V41Config,
    query_start_loc: torch.Tensor,
    kv_seq_lens: torch.Tensor,
    window_block_table: torch.Tensor,
    compressed_block_tables: Mapping[int, torch.Tensor],
    state_block_tables: Mapping[int, torch.Tensor],
    *,
    num_padded_tokens: int | None = None,
    num_state_blocks: int | None = None,
    tp: int = 1,
) -> ForwardMetadata:
    """Validate the batch description, then lower it to :class:`ForwardMetadata`.

    ``num_padded_tokens`` (default ``query_start_loc[-1]``) is the token extent ``T``;
    ``num_state_blocks`` bounds state block ids when given; ``tp`` sets
    ``moe_token_owners``.  Raises :class:`ValueError` on the first broken rule.
    """
    _validate(config, query_start_loc, kv_seq_lens, window_block_table,
              compressed_block_tables, state_block_tables, num_padded_tokens,
              num_state_blocks, tp)

    bs = config.cache.block_size
    W = config.sliding_window
    qsl = query_start_loc.long()
    kv = kv_seq_lens.long()
    B = qsl.shape[0] - 1
    N = int(qsl[-1])
    T = N if num_padded_tokens is None else num_padded_tokens
    qlens = qsl[1:] - qsl[:-1]
    new_kv = kv + qlens

    # token -> request, position (padding rows are -1)
    req_valid = torch.repeat_interleave(torch.arange(B, dtype=_I64), qlens)
    req = torch.full((T,), -1, dtype=_I64)
    req[:N] = req_valid
    valid = req >= 0
    safe_req = req.clamp(min=0)
    offset = torch.arange(T, dtype=_I64) - (qsl[safe_req] if B else torch.zeros(T, dtype=_I64))
    pos = torch.where(valid, (kv[safe_req] if B else 0) + offset, torch.full_like(req, -1))

    logit_rows = torch.where(qlens > 0, qsl[1:] - 1, torch.full_like(qlens, -1))

    # sliding window
    window_slots = _paged_rows(window_block_table, req, pos, valid, bs)
    wlen = torch.where(valid, torch.clamp(pos + 1, max=W), torch.zeros_like(pos))
    j = torch.arange(W, dtype=_I64)[None, :]
    wpos = pos[:, None] - wlen[:, None] + 1 + j
    wvalid = valid[:, None] & (j < wlen[:, None])
    window_indices = _paged_rows(window_block_table, req[:, None].expand(T, W), wpos, wvalid, bs)

    sources = compressed_sources(config)
    out: dict[str, dict[int, torch.Tensor]] = {k: {} for k in (
        "compressed_slots", "index_slots", "state_block_tables", "compressed_seq_lens",
        "compressed_seq_remainders", "compressed_lens", "compressor_output_start_loc",
        "compressor_source_token_indices", "compressor_position_ids",
        "compressed_rope_position_ids")}
    for src, ratio in sources.items():
        table = compressed_block_tables[src]
        completes = valid & ((pos + 1) % ratio == 0)
        enabled = completes
        if ratio == 2:
            state = state_block_tables[src]
            out["state_block_tables"][src] = state.clone()
            if B:
                enabled = completes & (state[:, 0].long()[safe_req] >= 0)
        slots = _paged_rows(table, req, pos // ratio, enabled, bs)
        out["compressed_slots"][src] = slots
        out["index_slots"][src] = slots.clone()
        out["compressed_seq_lens"][src] = (new_kv // ratio).to(_I32)
        out["compressed_seq_remainders"][src] = (new_kv % ratio).to(_I32)
        out["compressed_lens"][src] = torch.where(valid, (pos + 1) // ratio,
                                                  torch.zeros_like(pos)).to(_I32)
        out["compressed_rope_position_ids"][src] = torch.where(
            completes, pos + 1 - ratio, torch.full_like(pos, -1)).to(_I32)
        new_groups = new_kv // ratio - kv // ratio
        start = torch.zeros(B + 1, dtype=_I64)
        start[1:] = torch.cumsum(new_groups, 0)
        out["compressor_output_start_loc"][src] = start.to(_I32)
        g_req = torch.repeat_interleave(torch.arange(B, dtype=_I64), new_groups)
        g = (kv // ratio)[g_req] + torch.arange(g_req.shape[0], dtype=_I64) - start[g_req]
        src_pos = (g + 1) * ratio - 1
        out["compressor_source_token_indices"][src] = (qsl[g_req] + src_pos - kv[g_req]).to(_I32)
        out["compressor_position_ids"][src] = (g * ratio).to(_I32)

    frozen = {k: MappingProxyType(v) for k, v in out.items()}
    return ForwardMetadata(
        num_tokens=N,
        num_padded_tokens=T,
        source_ratios=MappingProxyType(dict(sources)),
        query_start_loc=qsl.to(_I32),
        query_lens=qlens.to(_I32),
        logit_row_indices=logit_rows.to(_I32),
        token_to_req_indices=req.to(_I32),
        moe_token_owners=(torch.arange(T, dtype=_I64) % tp).to(_I32),
        position_ids=pos.to(_I32),
        kv_seq_lens=kv.to(_I32),
        new_kv_seq_lens=new_kv.to(_I32),
        window_slots=window_slots,
        window_indices=window_indices.to(_I32),
        window_lens=wlen.to(_I32),
        **frozen,
    )
