"""The six attention modes as one half-layer golden each, for decode and packed prefill.

:func:`attention_half_layer` composes the tested building blocks (Q/KV projection, window
cache, compressor, indexer, sparse attention, output projection, TP wirings) into one
Attention half-layer of any layer ``L`` of a preset.  The mode comes from
``config.layer_config(L)``:

=============  ========================================================================
mode           what the half-layer does (every mode publishes its own window KV first)
=============  ========================================================================
SWA            window rows only, base RoPE profile
C2A/C1A Full   compressor publishes compressed KV + index keys of this layer's source
               (ratio 2: through its state ring), index query + paged indexer over the
               source's keys -> Top-K rows (C1A Full at the candidate source also selects
               the candidate-block mask), attention over window + Top-K rows
C1A Reindex    new index query over the KV source's (layer-20) index keys, restricted to
               the candidate source's mask -> this layer's Top-K rows; no compressor
C2A/C1A Reuse  the index source's physical Top-K rows unchanged; no compressor or
               indexer weights
=============  ========================================================================

Decode and prefill differ only in the metadata (:class:`ForwardBatch`): several packed rows
per request with or without a cached prefix, or 1-6 rows per request over long prefixes.

Decisions recorded here (the tests pin them):

* **Caches are updated in place** (the kernels' InOut ABI); the returned caches object is
  the one passed in.  :data:`OWNERSHIP` names the tensors a mode may write; every written
  tensor belongs to the layer itself (a Full layer is its own KV/index source, a Reindex
  layer its own index source, C1A Full the candidate source), see :func:`owned_keys`.
  Everything else -- other layers' windows, the source caches a Reindex/Reuse layer reads,
  the Top-K rows a Reuse layer consumes -- is left byte-identical.
* **Per-forward scratch.**  Top-K rows (per index source) and the candidate mask (at the
  candidate source) live for one forward in :class:`ForwardScratch`, allocated by
  :meth:`ModelCaches.begin_forward`.  A Reuse layer whose index source has not published in
  the current forward (or a Reindex layer whose candidate source has not) raises instead of
  reading stale rows from a previous step.  Fixtures can supply rows with
  :meth:`ForwardScratch.publish`.
* **Reserved capacity.**  ``x_norm`` has ``T = metadata.num_padded_tokens`` rows;
  ``active`` must equal ``metadata.num_tokens`` (the valid packed prefix; build the metadata
  with ``num_padded_tokens`` for a reserved-capacity batch).  Rows at or past ``active``
  publish nothing (their slots are -1), select nothing (Top-K -1) and give exactly zero
  output in both wirings; their ``x_norm`` contents are never read into any active value.
* **Validation first.**  Every check that a later step would make (window / compressed /
  index rows past a cache, unallocated visible pages, positions at or past the RoPE table
  capacity, state blocks out of range or shared by two live requests, missing scratch) runs
  before the first cache write and raises :class:`ValueError`; a failing call changes no
  cache byte.
* **Order inside Full**: compressor publication, then the indexer (a token sees the group it
  closes: ``compressed_lens = (p + 1) // ratio``), then window publication and attention.
* **Stale index keys** follow the fixed semantics of ``goldens.indexer`` (each source scores
  only its own keys), not the released reference's shared ``index_k``.
* **RoPE rows** are materialized here from the serving-owned full tables
  (:class:`RopeTables`) for the layer's profile (base for SWA, compressed YaRN otherwise);
  padding rows get identity rotation.

Output: ``"replicated"`` -> BF16 ``[T, hidden]`` (every rank's all-reduced output);
``"sharded"`` -> the ranks' BF16 ``[ceil(T / tp), hidden]`` slabs, padding rows zero.

Pure torch: imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from goldens.compressor import (CompressorResult, CompressorWeights, SourceCaches,
                                allocate_state_cache, compress_and_publish)
from goldens.config import (SUPPORTED_TP_SIZES, LayerConfig, Mode, V41Config, local_heads,
                            local_o_groups)
from goldens.indexer import index_query, paged_indexer, reuse_topk
from goldens.metadata import ForwardMetadata, build_forward_metadata, check_state_blocks
from goldens.qkv import q_lora
from goldens.quant import quantize_fp8_weight
from goldens.rope import materialize_rope_rows, precompute_rope_tables
from goldens.sparse_attention import gather_compressed_kv
from goldens.tp import AttentionBatch, AttentionWeights, decode_attention, random_attention_weights
from goldens.window_cache import empty_window_cache

__all__ = ["OWNERSHIP", "IndexerWeights", "ModeWeights", "random_mode_weights", "RopeTables",
           "ForwardBatch", "build_forward_batch", "WindowCache", "ForwardScratch",
           "ModelCaches", "ModeAux", "owned_keys", "snapshot_caches", "changed_keys",
           "attention_half_layer"]

_I32 = torch.int32
_WINDOW = frozenset({"window_kv", "window_kv_scale"})
_PUBLICATION = frozenset({"compressed_kv", "compressed_kv_scale", "index_key", "index_key_scale"})

#: Cache tensors each mode may write (all of them the layer's own; see :func:`owned_keys`).
OWNERSHIP: dict[Mode, frozenset[str]] = {
    Mode.SWA: _WINDOW,
    Mode.C2A_FULL: _WINDOW | _PUBLICATION | {"state_cache", "topk_rows"},
    Mode.C2A_REUSE: _WINDOW,
    Mode.C1A_FULL: _WINDOW | _PUBLICATION | {"topk_rows", "candidate_mask"},
    Mode.C1A_REINDEX: _WINDOW | {"topk_rows"},
    Mode.C1A_REUSE: _WINDOW,
}

_FULL = (Mode.C2A_FULL, Mode.C1A_FULL)
_REUSE = (Mode.C2A_REUSE, Mode.C1A_REUSE)
_INDEXED = (Mode.C2A_FULL, Mode.C1A_FULL, Mode.C1A_REINDEX)


def _fail(msg: str):
    raise ValueError(msg)


# ---- weights -------------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexerWeights:
    """Index-query weights of a Full or Reindex layer (the index keys' ``index_wk`` and
    ``index_norm`` belong to the KV source's compressor)."""

    wq_b: torch.Tensor  # E4M3 [index.n_heads * index.head_dim, q_lora_rank]
    wq_b_scale: torch.Tensor  # uint8 E8M0 [rows / 32, q_lora_rank / 32]
    weights_proj: torch.Tensor  # BF16 [hidden, index.n_heads]


@dataclass(frozen=True)
class ModeWeights:
    """One layer's Attention weights for its mode.  Full: ``compressor`` and ``indexer``;
    Reindex: ``indexer`` only; SWA and Reuse: neither (Reuse has no compressor or indexer
    weights).  Construction checks the parts match the mode."""

    mode: Mode
    attn: AttentionWeights
    compressor: CompressorWeights | None = None
    indexer: IndexerWeights | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.mode, Mode):
            _fail(f"mode: expected a Mode, got {self.mode!r}")
        if not isinstance(self.attn, AttentionWeights):
            _fail(f"attn: expected AttentionWeights, got {type(self.attn).__name__}")
        want_c, want_i = self.mode in _FULL, self.mode in _INDEXED
        if (self.compressor is not None) != want_c:
            _fail(f"compressor: mode {self.mode.value} "
                  f"{'needs' if want_c else 'has no'} compressor weights")
        if (self.indexer is not None) != want_i:
            _fail(f"indexer: mode {self.mode.value} "
                  f"{'needs' if want_i else 'has no'} indexer weights")


def random_mode_weights(config: V41Config, layer: int, seed: int = 0) -> ModeWeights:
    """Deterministic fixture weights for ``layer``'s mode (any preset, e.g. TINY or FLASH).

    Attention weights come from :func:`goldens.tp.random_attention_weights`; compressor
    weights follow the checkpoint formats (ratio 2: FP32 ``wkv``/``wgate``; ratio 1: BF16
    ``wkv``), ``N(0, 1/K)`` scaled; the index ``wq_b`` is checkpoint FP8.
    """
    lc = config.layer_config(layer)
    base = seed * 1009 + layer
    attn = random_attention_weights(config, base)
    g = torch.Generator().manual_seed(base + 7919)
    h, d, di = config.hidden_size, config.head_dim, config.index.head_dim
    comp = idx = None
    if lc.mode in _FULL:
        wkv = torch.randn(h, d, generator=g) * h ** -0.5
        comp = CompressorWeights(
            wkv=wkv if lc.ratio == 2 else wkv.bfloat16(),
            wgate=(torch.randn(h, d, generator=g) * 2 * h ** -0.5) if lc.ratio == 2 else None,
            norm=torch.rand(d, generator=g) + 0.5,
            index_wk=(torch.randn(d, di, generator=g) * d ** -0.5).bfloat16(),
            index_norm=torch.rand(di, generator=g) + 0.5)
    if lc.mode in _INDEXED:
        hi = config.index.n_heads
        wq = torch.randn(hi * di, config.q_lora_rank, generator=g) * config.q_lora_rank ** -0.5
        payload, scale = quantize_fp8_weight(wq)
        proj = (torch.randn(h, hi, generator=g) * h ** -0.5).bfloat16()
        idx = IndexerWeights(payload, scale, proj)
    return ModeWeights(lc.mode, attn, comp, idx)


# ---- per-forward inputs --------------------------------------------------------------------

@dataclass(frozen=True)
class RopeTables:
    """Serving-owned full FP32 ``[capacity, rope_dim / 2]`` tables of both profiles."""

    base_cos: torch.Tensor
    base_sin: torch.Tensor
    compressed_cos: torch.Tensor
    compressed_sin: torch.Tensor

    @classmethod
    def build(cls, config: V41Config, capacity: int) -> "RopeTables":
        bc, bs = precompute_rope_tables(config, False, capacity)
        cc, cs = precompute_rope_tables(config, True, capacity)
        return cls(bc, bs, cc, cs)

    def profile(self, lc: LayerConfig) -> tuple[torch.Tensor, torch.Tensor]:
        if lc.rope_profile == "base":
            return self.base_cos, self.base_sin
        return self.compressed_cos, self.compressed_sin


@dataclass(frozen=True)
class ForwardBatch:
    """One forward's lowered metadata plus the compressed block tables the indexer pages
    through (``metadata`` carries slots, not tables)."""

    metadata: ForwardMetadata
    compressed_block_tables: Mapping[int, torch.Tensor]  # {kv source: INT32 [B, pages]}

    @property
    def tokens(self) -> int:
        return self.metadata.num_padded_tokens

    @property
    def active(self) -> int:
        return self.metadata.num_tokens


def build_forward_batch(config: V41Config, query_start_loc: torch.Tensor,
                        kv_seq_lens: torch.Tensor, window_block_table: torch.Tensor,
                        compressed_block_tables: Mapping[int, torch.Tensor],
                        state_block_tables: Mapping[int, torch.Tensor], *,
                        num_padded_tokens: int | None = None,
                        num_state_blocks: int | None = None, tp: int = 1) -> ForwardBatch:
    """:func:`goldens.metadata.build_forward_metadata` plus the tables it was built from."""
    md = build_forward_metadata(config, query_start_loc, kv_seq_lens, window_block_table,
                                compressed_block_tables, state_block_tables,
                                num_padded_tokens=num_padded_tokens,
                                num_state_blocks=num_state_blocks, tp=tp)
    return ForwardBatch(md, dict(compressed_block_tables))


# ---- caches --------------------------------------------------------------------------------

@dataclass
class WindowCache:
    """A layer's paged MXFP8 window KV (``goldens.window_cache`` ABI)."""

    payload: torch.Tensor  # E4M3 [blocks, block_size, 1, head_dim]
    scales: torch.Tensor  # uint8 E8M0 [blocks, block_size, 1, head_dim / 32]

    @property
    def rows(self) -> int:
        return int(self.payload.shape[0] * self.payload.shape[1])


@dataclass
class ForwardScratch:
    """Forward-scoped selection workspaces: Top-K physical rows per index source (INT32
    ``[T, topk]``, -1 padded) and the candidate mask at the candidate source (bool
    ``[T, width]``).  ``published`` holds the layers that wrote theirs this forward."""

    tokens: int
    topk_rows: dict[int, torch.Tensor]
    candidate_mask: dict[int, torch.Tensor]
    published: set[int] = field(default_factory=set)

    def publish(self, layer: int, topk_rows: torch.Tensor | None = None,
                candidate_mask: torch.Tensor | None = None) -> None:
        """Fixture hook: write a source's rows / mask in place and mark it published."""
        if topk_rows is not None:
            self.topk_rows[layer].copy_(topk_rows)
        if candidate_mask is not None:
            self.candidate_mask[layer].copy_(candidate_mask)
        self.published.add(layer)


@dataclass
class ModelCaches:
    """All cache storage of a model (or of the layers a fixture needs).

    ``windows[layer]``: every layer's window cache.  ``sources[kv source]``: compressed KV and
    index keys (:class:`goldens.compressor.SourceCaches`).  ``states[ratio-2 source]``: the
    FP32 compressor ring.  ``scratch``: the current forward's :class:`ForwardScratch`.
    """

    windows: dict[int, WindowCache]
    sources: dict[int, SourceCaches]
    states: dict[int, torch.Tensor]
    scratch: ForwardScratch | None = None

    @classmethod
    def allocate(cls, config: V41Config, *, window_blocks: int, compressed_blocks: int,
                 state_blocks: int, layers=None, fill: int = 0) -> "ModelCaches":
        """Caches for ``layers`` (default all) and the KV sources they read.  Every byte of
        the window / compressed / index caches is ``fill`` and the state ring holds
        ``float(fill)`` (a nonzero fill makes untouched rows visible)."""
        layers = range(config.num_layers) if layers is None else layers
        windows, sources, states = {}, {}, {}
        for layer in layers:
            lc = config.layer_config(layer)
            payload, scales = empty_window_cache(config, window_blocks)
            payload.view(torch.uint8).fill_(fill)
            scales.fill_(fill)
            windows[layer] = WindowCache(payload, scales)
            src = lc.kv_source
            if src is not None and src not in sources:
                sources[src] = SourceCaches.allocate(config, compressed_blocks, fill)
                if config.compress_ratios[src] == 2:
                    states[src] = allocate_state_cache(config, state_blocks, float(fill))
        return cls(windows, sources, states)

    def begin_forward(self, config: V41Config, batch: ForwardBatch) -> ForwardScratch:
        """Fresh scratch for a forward of ``batch.tokens`` rows: Top-K rows (-1) for every
        index source in ``config`` and the candidate mask (False) of width
        ``pages * block_size`` of the candidate source's compressed block table."""
        T = batch.tokens
        topk = {s: torch.full((T, config.index.topk), -1, dtype=_I32)
                for s in config.index_source_layer_ids}
        cand = config.candidate_source_layer_id
        table = batch.compressed_block_tables.get(cand)
        width = 0 if table is None else int(table.shape[1]) * config.cache.block_size
        self.scratch = ForwardScratch(T, topk, {cand: torch.zeros(T, width, dtype=torch.bool)})
        return self.scratch

    def tensors(self) -> dict[tuple[str, int], torch.Tensor]:
        """Every cache tensor as ``{(name, owner layer): tensor}`` (names of OWNERSHIP)."""
        out: dict[tuple[str, int], torch.Tensor] = {}
        for layer, wc in self.windows.items():
            out[("window_kv", layer)] = wc.payload
            out[("window_kv_scale", layer)] = wc.scales
        for src, sc in self.sources.items():
            for name, t in sc.tensors().items():
                out[(name, src)] = t
        for src, st in self.states.items():
            out[("state_cache", src)] = st
        if self.scratch is not None:
            for layer, t in self.scratch.topk_rows.items():
                out[("topk_rows", layer)] = t
            for layer, t in self.scratch.candidate_mask.items():
                out[("candidate_mask", layer)] = t
        return out

    def clone(self) -> "ModelCaches":
        """A deep copy (scratch included)."""
        s = self.scratch
        scratch = None if s is None else ForwardScratch(
            s.tokens, {k: v.clone() for k, v in s.topk_rows.items()},
            {k: v.clone() for k, v in s.candidate_mask.items()}, set(s.published))
        return ModelCaches(
            {k: WindowCache(v.payload.clone(), v.scales.clone()) for k, v in self.windows.items()},
            {k: SourceCaches(**{n: t.clone() for n, t in v.tensors().items()})
             for k, v in self.sources.items()},
            {k: v.clone() for k, v in self.states.items()}, scratch)


def owned_keys(config: V41Config, layer: int) -> frozenset[tuple[str, int]]:
    """The ``(name, layer)`` keys of :meth:`ModelCaches.tensors` that ``layer`` may write."""
    return frozenset((name, layer) for name in OWNERSHIP[config.layer_config(layer).mode])


def snapshot_caches(caches: ModelCaches) -> dict[tuple[str, int], torch.Tensor]:
    """Byte copies of every cache tensor (for ownership comparisons)."""
    return {k: t.contiguous().view(torch.uint8).clone() if t.dtype != torch.bool
            else t.clone() for k, t in caches.tensors().items()}


def changed_keys(before: Mapping[tuple[str, int], torch.Tensor],
                 caches: ModelCaches) -> set[tuple[str, int]]:
    """Keys whose bytes differ from ``before`` (or that appeared / disappeared)."""
    now = snapshot_caches(caches)
    keys = set(before) | set(now)
    return {k for k in keys if k not in before or k not in now
            or before[k].shape != now[k].shape or not torch.equal(before[k], now[k])}


# ---- the half-layer ------------------------------------------------------------------------

@dataclass(frozen=True)
class ModeAux:
    """What the harness checks besides the output.

    ``topk_rows``: the INT32 ``[T, topk]`` physical compressed rows the layer attended to
    (None for SWA); ``candidate_mask``: published (C1A Full) or consumed (Reindex) mask;
    ``compressor``: the Full layer's :class:`CompressorResult`; ``index_scores``: FP32
    ``[T, width]`` indexer scores of Full / Reindex.
    """

    mode: Mode
    layer: int
    topk_rows: torch.Tensor | None = None
    candidate_mask: torch.Tensor | None = None
    compressor: CompressorResult | None = None
    index_scores: torch.Tensor | None = None


def _check_rows(name: str, idx: torch.Tensor, rows: int, valid: torch.Tensor | None = None):
    """``idx`` entries (where ``valid``) are -1 or in ``[0, rows)``."""
    v = idx.long()
    if valid is not None:
        v = v[valid]
    if v.numel() == 0:
        return
    lo, hi = int(v.min()), int(v.max())
    if lo < -1 or hi >= rows:
        bad = lo if lo < -1 else hi
        _fail(f"{name}: row {bad} outside [-1, {rows}) (block id out of range of the cache)")


def _validate(config: V41Config, lc: LayerConfig, x: torch.Tensor, w: ModeWeights,
              caches: ModelCaches, batch: ForwardBatch, rope: RopeTables, tp: int,
              wiring: str, active: int | None) -> int:
    """Every check a later step would make, before any cache write; returns ``active``."""
    if not isinstance(batch, ForwardBatch):
        _fail(f"metadata: expected a ForwardBatch, got {type(batch).__name__}")
    md = batch.metadata
    T, N = md.num_padded_tokens, md.num_tokens
    if not isinstance(w, ModeWeights):
        _fail(f"weights: expected ModeWeights, got {type(w).__name__}")
    if w.mode is not lc.mode:
        _fail(f"weights: mode {w.mode.value} but layer {lc.layer} runs {lc.mode.value}")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or \
            tuple(x.shape) != (T, config.hidden_size):
        _fail(f"x_norm: must be bfloat16 [{T}, {config.hidden_size}] (T = "
              f"metadata.num_padded_tokens), got "
              f"{getattr(x, 'dtype', None)} {list(getattr(x, 'shape', []))}")
    active = N if active is None else active
    if isinstance(active, bool) or not isinstance(active, int) or active != N:
        _fail(f"active: {active!r} must equal metadata.num_tokens = query_start_loc[-1] = {N}; "
              f"build the metadata with num_padded_tokens for a reserved-capacity batch")
    if tp not in SUPPORTED_TP_SIZES:
        _fail(f"tp: {tp!r} is not one of {SUPPORTED_TP_SIZES}")
    local_heads(config, tp)
    local_o_groups(config, tp)
    if wiring not in ("replicated", "sharded"):
        _fail(f"wiring: {wiring!r} is not 'replicated' or 'sharded'")

    # RoPE: every valid position below the profile table's capacity
    cos, sin = rope.profile(lc)
    cap = int(cos.shape[0])
    pos = md.position_ids[:N].long()
    if pos.numel() and int(pos.max()) >= cap:
        t = int((pos >= cap).nonzero()[0, 0])
        _fail(f"position_ids[{t}]: {int(pos[t])} is at or past the RoPE table capacity {cap}")

    # window cache of this layer
    wc = caches.windows.get(lc.layer)
    if wc is None:
        _fail(f"caches.windows[{lc.layer}]: missing; every layer owns a window cache")
    slots = md.window_slots.long()
    _check_rows("window_slots", slots, wc.rows)
    live = slots[slots >= 0]
    if torch.unique(live).numel() != live.numel():
        _fail("window_slots: two valid tokens publish to the same window row (a physical "
              "block shared by two requests)")
    _check_rows("window_indices", md.window_indices, wc.rows)
    if lc.mode is Mode.SWA:
        return active

    src = lc.kv_source
    sc = caches.sources.get(src)
    if sc is None:
        _fail(f"caches.sources[{src}]: missing; layer {lc.layer} reads KV source {src}")
    rows = sc.num_blocks * config.cache.block_size
    scratch = caches.scratch
    if scratch is None or scratch.tokens != T:
        _fail(f"caches.scratch: call caches.begin_forward(config, batch) for this forward "
              f"({T} rows) first")

    if lc.mode in _FULL:
        cslots = md.compressed_slots[src].long()
        _check_rows(f"compressed_slots[{src}]", cslots, rows)
        live = cslots[cslots >= 0]
        if torch.unique(live).numel() != live.numel():
            _fail(f"compressed_slots[{src}]: two tokens publish to the same compressed row")
        if lc.ratio == 2:
            state = caches.states.get(src)
            if state is None:
                _fail(f"caches.states[{src}]: missing; ratio-2 source {src} owns a state ring")
            check_state_blocks(f"state_block_tables[{src}]", md.state_block_tables[src],
                               md.query_start_loc.tolist(), int(state.shape[0]))

    if lc.mode in _INDEXED:
        table = batch.compressed_block_tables.get(src)
        if not isinstance(table, torch.Tensor) or table.dtype != _I32 or table.dim() != 2 \
                or table.shape[0] != md.num_requests:
            _fail(f"compressed_block_tables[{src}]: must be INT32 [{md.num_requests}, pages]")
        bs, pages = config.cache.block_size, int(table.shape[1])
        lens = md.compressed_lens[src][:N].tolist()
        req = md.token_to_req_indices[:N].tolist()
        tbl = table.tolist()
        for t in range(N):
            n, r = lens[t], req[t]
            if n > pages * bs:
                _fail(f"compressed_lens[{src}][{t}]: position {n - 1} is at or past the block "
                      f"table capacity {pages * bs} of request {r}")
            for page in range(-(-n // bs)):
                phys = tbl[r][page]
                if phys < 0:
                    _fail(f"compressed_block_tables[{src}][{r}, {page}]: {phys}, unallocated, "
                          f"but token {t} sees compressed positions up to {n - 1}")
                if phys >= sc.num_blocks:
                    _fail(f"compressed_block_tables[{src}][{r}, {page}]: block {phys} outside "
                          f"[0, num_blocks={sc.num_blocks}) (block id out of range)")
    if lc.mode is Mode.C1A_REINDEX:
        cand = lc.candidate_source
        if cand not in scratch.published:
            _fail(f"caches.scratch: candidate source {cand} has not published its candidate "
                  f"mask in this forward (run layer {cand} first)")
        width = int(batch.compressed_block_tables[src].shape[1]) * config.cache.block_size
        if tuple(scratch.candidate_mask[cand].shape) != (T, width):
            _fail(f"caches.scratch.candidate_mask[{cand}]: shape "
                  f"{list(scratch.candidate_mask[cand].shape)}, expected [{T}, {width}]")
    if lc.mode in _REUSE:
        isrc = lc.index_source
        if isrc not in scratch.published:
            _fail(f"caches.scratch: index source {isrc} has not published Top-K rows in this "
                  f"forward (run layer {isrc} first)")
        _check_rows(f"caches.scratch.topk_rows[{isrc}]", scratch.topk_rows[isrc][:N], rows)
    return active


def attention_half_layer(config: V41Config, layer: int, x_norm: torch.Tensor,
                         weights: ModeWeights, caches: ModelCaches, metadata: ForwardBatch,
                         rope: RopeTables, *, tp: int = 1, wiring: str = "replicated",
                         active: int | None = None):
    """One Attention half-layer of ``layer`` in its mode; see the module docstring.

    ``x_norm`` BF16 ``[T, hidden]`` is the RMS-normalized attention input (mHC collapse and
    attn_norm are the caller's); ``metadata`` the forward's :class:`ForwardBatch`; ``rope``
    the full tables of both profiles; ``caches`` is updated in place (only the tensors in
    ``OWNERSHIP[mode]`` of this layer) and returned.  Returns ``(output, caches, aux)``:
    output BF16 ``[T, hidden]`` (replicated) or a list of ``tp`` BF16 ``[ceil(T/tp),
    hidden]`` slabs (sharded); ``aux`` a :class:`ModeAux`.
    """
    lc = config.layer_config(layer)
    active = _validate(config, lc, x_norm, weights, caches, metadata, rope, tp, wiring, active)
    md = metadata.metadata
    T = md.num_padded_tokens
    cos_t, sin_t = rope.profile(lc)
    half = config.rope_dim // 2
    rc, rs = torch.ones(T, half), torch.zeros(T, half)
    materialize_rope_rows(cos_t, sin_t, md.position_ids, active, rc, rs)

    aux = dict(mode=lc.mode, layer=layer)
    compressed = None
    if lc.mode is not Mode.SWA:
        src = lc.kv_source
        sc = caches.sources[src]
        scratch = caches.scratch
        if lc.mode in _FULL:
            aux["compressor"] = compress_and_publish(
                config, lc.ratio, x_norm, weights.compressor,
                query_start_loc=md.query_start_loc, position_ids=md.position_ids,
                token_to_req_indices=md.token_to_req_indices, num_tokens=active,
                compressed_slots=md.compressed_slots[src], freqs_cos=rope.compressed_cos,
                freqs_sin=rope.compressed_sin, caches=sc,
                state_block_table=md.state_block_tables.get(src),
                state_cache=caches.states.get(src))
        if lc.mode in _INDEXED:
            iw = weights.indexer
            qr = q_lora(x_norm, weights.attn.qkv, config)
            iq = index_query(config, qr, iw.wq_b, iw.wq_b_scale, x_norm, iw.weights_proj,
                             md.position_ids, active, rope.compressed_cos, rope.compressed_sin)
            cand_in = None
            if lc.mode is Mode.C1A_REINDEX:
                cand_in = scratch.candidate_mask[lc.candidate_source]
                aux["candidate_mask"] = cand_in.clone()
            res = paged_indexer(config, iq.q, iq.weights, sc.index_key, sc.index_key_scale,
                                metadata.compressed_block_tables[src], md.token_to_req_indices,
                                md.compressed_lens[src], active, candidate_mask=cand_in,
                                select_candidates=lc.is_candidate_source)
            scratch.topk_rows[layer].copy_(res.topk_rows)
            if lc.is_candidate_source:
                scratch.candidate_mask[layer].copy_(res.candidate_mask)
                aux["candidate_mask"] = res.candidate_mask
            scratch.published.add(layer)
            aux["index_scores"] = res.scores
            topk = res.topk_rows.clone()
        else:
            topk = reuse_topk(scratch.topk_rows[lc.index_source])
        topk[active:] = -1
        aux["topk_rows"] = topk
        compressed = gather_compressed_kv(sc.compressed_kv, sc.compressed_kv_scale, topk)

    wc = caches.windows[layer]
    batch = AttentionBatch(rc, rs, md.window_slots, md.window_indices, wc.payload, wc.scales,
                           compressed)
    out = decode_attention(x_norm, weights.attn, batch, config, tp, wiring, active)
    return out, caches, ModeAux(**aux)
