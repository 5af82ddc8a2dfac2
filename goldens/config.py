"""DeepSeek-V4.1-Flash model configuration: presets, layer schedule, parallel arithmetic.

Every shape downstream flows from a :class:`V41Config` object passed as an argument.
Nothing here reads argv or fixes a shape at import; ``FLASH`` and ``TINY`` are the two
presets.  ``FLASH`` carries the released checkpoint's values; ``TINY`` has the same
structure (all six attention modes, every source relation) with small dimensions.

A config that breaks a structural rule raises :class:`ConfigError` naming the rule.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

SUPPORTED_TP_SIZES = (1, 2, 4, 8)
SUPPORTED_EP_SIZES = (2, 4, 8)
MX_GROUP = 32  # MXFP8 activation / weight group (elements per E8M0 scale)


class ConfigError(ValueError):
    """A configuration or parallel layout that breaks a named rule."""


class AttentionKind(str, enum.Enum):
    SLIDING_WINDOW = "sliding_window"
    COMPRESSED_SPARSE = "compressed_sparse"


class Mode(str, enum.Enum):
    """The six attention modes; the value is the name used by entries and files."""

    SWA = "swa"
    C2A_FULL = "c2a_full"
    C2A_REUSE = "c2a_reuse"
    C1A_FULL = "c1a_full"
    C1A_REINDEX = "c1a_reindex"
    C1A_REUSE = "c1a_reuse"


@dataclass(frozen=True)
class RopeConfig:
    """RoPE profiles: ratio-0 layers use ``theta`` without YaRN; compressed layers use
    ``compress_theta`` with YaRN (``factor``, ``original_max_position``, betas)."""

    rope_dim: int = 64
    theta: float = 10000.0
    compress_theta: float = 160000.0
    factor: float = 16.0
    beta_fast: int = 32
    beta_slow: int = 1
    original_max_position: int = 65536
    max_position: int = 1048576


@dataclass(frozen=True)
class MoEConfig:
    n_routed_experts: int = 384
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    intermediate_size: int = 2304
    scoring_func: str = "sqrtsoftplus"
    gate_temperature: float = 1.0
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0


@dataclass(frozen=True)
class IndexerConfig:
    n_heads: int = 32
    head_dim: int = 128
    topk: int = 512
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8


@dataclass(frozen=True)
class HyperConnectionConfig:
    hc_mult: int = 4
    sinkhorn_iters: int = 20
    eps: float = 1e-6


@dataclass(frozen=True)
class EngramConfig:
    """Recorded for completeness; Engram execution is out of scope."""

    layer_ids: tuple[int, ...] = (1, 14)
    num_embeddings: tuple[int, ...] = (384006168, 384016682)
    max_ngram_size: int = 4
    vocab_size: int = 16000000
    n_heads: int = 8
    head_dim: int = 256
    pad_token_id: int = 2
    compressed_vocab_size: int = 99092


@dataclass(frozen=True)
class CacheConfig:
    """Paged cache geometry, quantization groups and service capacities."""

    block_size: int = 128  # scheduler block for window, compressed and index caches
    state_capacity: int = 4  # ratio-2 compressor ring rows per state block
    window_group: int = 32  # MXFP8 window KV, E8M0 scale per 32
    compressed_group: int = 16  # MXFP4 compressed KV, E4M3 scale per 16
    index_group: int = 32  # MXFP4 index keys, E8M0 scale per 32
    max_batch_per_dp: int = 32
    dspark_spec_tokens: int = 5
    decode_rows_per_request: int = 6
    decode_max_tokens: int = 192
    prefill_max_tokens: int = 4096


@dataclass(frozen=True)
class QuantConfig:
    dtype: str = "bfloat16"
    quant_method: str = "fp8"
    activation_scheme: str = "dynamic"
    weight_block_size: tuple[int, int] = (32, 32)
    expert_dtype: str = "fp4"
    scale_fmt: str = "ue8m0"


@dataclass(frozen=True)
class LayerConfig:
    """One layer's resolved schedule entry."""

    layer: int
    ratio: int
    kind: AttentionKind
    mode: Mode
    kv_source: int | None
    index_source: int | None
    candidate_source: int | None
    is_kv_source: bool
    is_index_source: bool
    is_candidate_source: bool

    @property
    def rope_profile(self) -> str:
        """``"base"`` for ratio-0 layers, ``"compressed"`` (YaRN) for every rotation of a
        compressed layer (query, window KV, compressed KV, index key and query)."""
        return "base" if self.ratio == 0 else "compressed"


@dataclass(frozen=True)
class V41Config:
    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    sliding_window: int
    compress_ratios: tuple[int, ...]
    kv_source_layer_ids: tuple[int, ...]
    index_source_layer_ids: tuple[int, ...]
    candidate_source_layer_id: int
    rms_norm_eps: float = 1e-20
    rope: RopeConfig = field(default_factory=RopeConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    index: IndexerConfig = field(default_factory=IndexerConfig)
    hc: HyperConnectionConfig = field(default_factory=HyperConnectionConfig)
    engram: EngramConfig = field(default_factory=EngramConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)

    def __post_init__(self) -> None:
        _validate(self)

    # ---- derived dimensions ------------------------------------------------
    @property
    def rope_dim(self) -> int:
        return self.rope.rope_dim

    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope.rope_dim

    @property
    def o_group_in(self) -> int:
        """Input width of one output group: heads * head_dim / o_groups."""
        return self.num_heads * self.head_dim // self.o_groups

    @property
    def hc_dim(self) -> int:
        return self.hc.hc_mult * self.hidden_size

    @property
    def mix_hc(self) -> int:
        """mHC mix width: (2 + hc_mult) * hc_mult (pre, post, then the hc_mult^2 matrix)."""
        return (2 + self.hc.hc_mult) * self.hc.hc_mult

    @property
    def state_width(self) -> int:
        """Ratio-2 ring row: head_dim KV channels followed by head_dim gate scores."""
        return 2 * self.head_dim

    @property
    def softmax_scale(self) -> float:
        return self.head_dim ** -0.5

    # ---- schedule ----------------------------------------------------------
    def layer_config(self, layer: int) -> LayerConfig:
        """Resolve ``layer``'s kind, mode and KV / index / candidate sources.

        A compressed layer's KV (index) source is the last KV (index) source at or before
        it with the same compression ratio.  Mode is FULL for a KV source, REINDEX for an
        index source that is not a KV source, REUSE otherwise.  The candidate source
        applies to layers of its own ratio at or after it.
        """
        if not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ConfigError(f"layer: {layer!r} is outside [0, {self.num_layers})")
        ratio = self.compress_ratios[layer]
        if ratio == 0:
            return LayerConfig(layer, 0, AttentionKind.SLIDING_WINDOW, Mode.SWA,
                               None, None, None, False, False, False)
        kv_src = _active_source(self, self.kv_source_layer_ids, layer)
        idx_src = _active_source(self, self.index_source_layer_ids, layer)
        is_kv = layer in self.kv_source_layer_ids
        is_idx = layer in self.index_source_layer_ids
        if is_kv:
            suffix = "full"
        elif is_idx:
            suffix = "reindex"
        else:
            suffix = "reuse"
        mode = Mode(f"c{ratio}a_{suffix}")
        cand = self.candidate_source_layer_id
        cand_src = cand if (self.compress_ratios[cand] == ratio and layer >= cand) else None
        return LayerConfig(layer, ratio, AttentionKind.COMPRESSED_SPARSE, mode, kv_src, idx_src,
                           cand_src, is_kv, is_idx, layer == cand)

    def layers(self) -> list[LayerConfig]:
        return [self.layer_config(i) for i in range(self.num_layers)]

    def representative_layer(self, mode: Mode) -> int:
        """The first layer that runs ``mode``."""
        for lc in self.layers():
            if lc.mode is mode:
                return lc.layer
        raise ConfigError(f"mode: {mode.value} does not occur in preset {self.name}")


def layer_config(layer: int, config: V41Config | None = None) -> LayerConfig:
    """``config.layer_config(layer)``; ``config`` defaults to ``FLASH``."""
    return (FLASH if config is None else config).layer_config(layer)


def _active_source(cfg: V41Config, sources: tuple[int, ...], layer: int) -> int | None:
    ratio = cfg.compress_ratios[layer]
    found = None
    for src in sources:
        if src <= layer and cfg.compress_ratios[src] == ratio:
            found = src
    return found


def _require(ok: bool, rule: str) -> None:
    if not ok:
        raise ConfigError(rule)


def _validate(c: V41Config) -> None:
    r = c.rope
    _require(c.num_heads % c.o_groups == 0,
             f"num_heads % o_groups == 0: {c.num_heads} % {c.o_groups} != 0")
    _require(c.head_dim > r.rope_dim, f"head_dim > rope_dim: {c.head_dim} <= {r.rope_dim}")
    _require(r.rope_dim % 2 == 0, f"rope_dim is even: got {r.rope_dim}")
    _require(c.index.head_dim >= r.rope_dim,
             f"index head_dim >= rope_dim: {c.index.head_dim} < {r.rope_dim}")
    _require(len(c.compress_ratios) == c.num_layers,
             f"len(compress_ratios) == num_layers: {len(c.compress_ratios)} != {c.num_layers}")
    _require(set(c.compress_ratios) <= {0, 1, 2},
             f"compress_ratios within {{0, 1, 2}}: got {sorted(set(c.compress_ratios))}")
    for name, ids in (("kv_source_layer_ids", c.kv_source_layer_ids),
                      ("index_source_layer_ids", c.index_source_layer_ids)):
        _require(list(ids) == sorted(set(ids)), f"{name} sorted and unique: got {ids}")
        for s in ids:
            _require(0 <= s < c.num_layers, f"{name}: layer {s} outside [0, {c.num_layers})")
            _require(c.compress_ratios[s] != 0,
                     f"{name}: layer {s} has ratio 0, a source must be compressed")
    for s in c.kv_source_layer_ids:
        _require(s in c.index_source_layer_ids,
                 f"every KV source is an index source (FULL publishes index keys): layer {s}")
    for layer, ratio in enumerate(c.compress_ratios):
        if ratio == 0:
            continue
        _require(_active_source(c, c.kv_source_layer_ids, layer) is not None,
                 f"every compressed layer has a KV source of its ratio at or before it: "
                 f"layer {layer} (ratio {ratio})")
        _require(_active_source(c, c.index_source_layer_ids, layer) is not None,
                 f"every compressed layer has an index source of its ratio at or before it: "
                 f"layer {layer} (ratio {ratio})")
    cand = c.candidate_source_layer_id
    _require(cand in c.kv_source_layer_ids and cand in c.index_source_layer_ids,
             f"candidate source is both a KV and an index source: layer {cand}")
    # quantization groups must tile the dimensions they scale
    g = MX_GROUP
    for name, dim in (("hidden_size", c.hidden_size), ("q_lora_rank", c.q_lora_rank),
                      ("o_lora_rank", c.o_lora_rank), ("head_dim", c.head_dim),
                      ("moe.intermediate_size", c.moe.intermediate_size)):
        _require(dim % g == 0, f"{name} % {g} == 0 (MX group): got {dim}")
    cc = c.cache
    _require(c.head_dim % cc.window_group == 0,
             f"head_dim % window_group == 0: {c.head_dim} % {cc.window_group}")
    _require(c.head_dim % cc.compressed_group == 0 and c.head_dim % 2 == 0,
             f"head_dim % compressed_group == 0: {c.head_dim} % {cc.compressed_group}")
    _require(c.index.head_dim % cc.index_group == 0,
             f"index head_dim % index_group == 0: {c.index.head_dim} % {cc.index_group}")
    _require(c.sliding_window >= 1, f"sliding_window >= 1: got {c.sliding_window}")
    _require(cc.block_size >= 1 and cc.state_capacity >= 1,
             f"block_size and state_capacity >= 1: got {cc.block_size}, {cc.state_capacity}")
    _require(cc.decode_max_tokens == cc.max_batch_per_dp * cc.decode_rows_per_request,
             f"decode_max_tokens == max_batch_per_dp * decode_rows_per_request: "
             f"{cc.decode_max_tokens} != {cc.max_batch_per_dp} * {cc.decode_rows_per_request}")
    _require(cc.decode_rows_per_request == cc.dspark_spec_tokens + 1,
             f"decode_rows_per_request == dspark_spec_tokens + 1: "
             f"{cc.decode_rows_per_request} != {cc.dspark_spec_tokens} + 1")
    m = c.moe
    _require(1 <= m.num_experts_per_tok <= m.n_routed_experts,
             f"1 <= num_experts_per_tok <= n_routed_experts: {m.num_experts_per_tok}")
    _require(c.index.topk >= 1 and c.index.candidate_block_size >= 1
             and c.index.candidate_topk_blocks >= 1, "indexer topk and candidate sizes >= 1")


# ---- presets --------------------------------------------------------------

FLASH = V41Config(
    name="deepseek_v4_1_flash",
    vocab_size=129280,
    hidden_size=5120,
    num_layers=40,
    num_heads=64,
    head_dim=512,
    q_lora_rank=1280,
    o_lora_rank=1024,
    o_groups=8,
    sliding_window=128,
    compress_ratios=(0, 0) + (2,) * 18 + (1,) * 20,
    kv_source_layer_ids=(2, 8, 14, 20),
    index_source_layer_ids=(2, 8, 14, 20, 24, 28, 32, 36),
    candidate_source_layer_id=20,
)

# Small dimensions, same structure: 2 SWA, C2A Full 2 and 4 (two same-ratio sources),
# C2A Reuse 3 and 5, C1A Full 6 (candidate source), C1A Reuse 7 and 9, C1A Reindex 8.
TINY = V41Config(
    name="tiny",
    vocab_size=512,
    hidden_size=256,
    num_layers=10,
    num_heads=8,
    head_dim=64,
    q_lora_rank=64,
    o_lora_rank=64,
    o_groups=8,
    sliding_window=8,
    compress_ratios=(0, 0, 2, 2, 2, 2, 1, 1, 1, 1),
    kv_source_layer_ids=(2, 4, 6),
    index_source_layer_ids=(2, 4, 6, 8),
    candidate_source_layer_id=6,
    rope=RopeConfig(rope_dim=32, original_max_position=512, max_position=8192),
    moe=MoEConfig(n_routed_experts=16, num_experts_per_tok=2, intermediate_size=64),
    index=IndexerConfig(n_heads=4, head_dim=32, topk=8, candidate_topk_blocks=4,
                        candidate_block_size=4),
    engram=EngramConfig(layer_ids=(1, 4), num_embeddings=(4096, 4096), vocab_size=4096,
                        n_heads=2, head_dim=32, compressed_vocab_size=512),
    cache=CacheConfig(block_size=16),
)

PRESETS = {"flash": FLASH, "tiny": TINY}


def preset(name: str) -> V41Config:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ConfigError(f"preset: {name!r} is not one of {sorted(PRESETS)}") from None


def with_overrides(config: V41Config, **changes) -> V41Config:
    """A copy of ``config`` with top-level fields replaced; revalidated."""
    return replace(config, **changes)


# ---- parallel arithmetic --------------------------------------------------

@dataclass(frozen=True)
class Parallel:
    """A launch's parallel layout.  Attention runs TP x DP; an expert-parallel launch
    sets ``ep`` and then ``dp == ep // tp`` (the EP world reinterpreted as DP groups)."""

    tp: int = 1
    dp: int = 1
    ep: int | None = None

    def __post_init__(self) -> None:
        _require(self.tp in SUPPORTED_TP_SIZES,
                 f"tp: {self.tp} is not one of {SUPPORTED_TP_SIZES}")
        _require(self.dp >= 1, f"dp: {self.dp} must be >= 1")
        if self.ep is not None:
            _require(self.ep in SUPPORTED_EP_SIZES,
                     f"ep: {self.ep} is not one of {SUPPORTED_EP_SIZES}")
            _require(self.ep % self.tp == 0, f"ep % tp == 0: {self.ep} % {self.tp} != 0")
            _require(self.dp == self.ep // self.tp,
                     f"dp == ep // tp for expert parallelism: {self.dp} != {self.ep // self.tp}")

    @property
    def world_size(self) -> int:
        return self.ep if self.ep is not None else self.tp * self.dp

    def tp_rank(self, rank: int) -> int:
        self._check_rank(rank)
        return rank % self.tp

    def dp_rank(self, rank: int) -> int:
        self._check_rank(rank)
        return rank // self.tp

    def group_base(self, rank: int) -> int:
        return rank - self.tp_rank(rank)

    def _check_rank(self, rank: int) -> None:
        _require(0 <= rank < self.world_size,
                 f"rank: {rank} outside [0, {self.world_size})")


def local_heads(config: V41Config, tp: int) -> int:
    _require(config.num_heads % tp == 0, f"num_heads % tp == 0: {config.num_heads} % {tp} != 0")
    return config.num_heads // tp


def local_o_groups(config: V41Config, tp: int) -> int:
    _require(config.o_groups % tp == 0, f"o_groups % tp == 0: {config.o_groups} % {tp} != 0")
    return config.o_groups // tp


def local_o_width(config: V41Config, tp: int) -> int:
    return local_o_groups(config, tp) * config.o_lora_rank


def local_experts(config: V41Config, ep: int) -> int:
    n = config.moe.n_routed_experts
    _require(n % ep == 0, f"n_routed_experts % ep == 0: {n} % {ep} != 0")
    return n // ep


def local_vocab(config: V41Config, tp: int) -> int:
    _require(config.vocab_size % tp == 0,
             f"vocab_size % tp == 0: {config.vocab_size} % {tp} != 0")
    return config.vocab_size // tp


def slab_width(capacity: int, tp: int) -> int:
    """Rows each TP rank owns: the fixed physical slab ceil(capacity / tp)."""
    _require(capacity >= 0, f"capacity: {capacity} must be >= 0")
    _require(tp >= 1, f"tp: {tp} must be >= 1")
    return math.ceil(capacity / tp)


def rank_slab(active: int, tp: int, tp_rank: int, capacity: int | None = None) -> tuple[int, int]:
    """(first, count) of the active rows rank ``tp_rank`` owns.

    The slab is ``tp_rank * width`` .. ``+ width`` with ``width = slab_width(capacity, tp)``
    (``capacity`` defaults to ``active``); the active count masks the slab suffix, so
    ``count = max(0, min(width, active - tp_rank * width))``.  ``first`` is clamped to
    ``active`` so that ``[first, first + count)`` always slices the active prefix.
    """
    capacity = active if capacity is None else capacity
    _require(0 <= active <= capacity, f"active: {active} outside [0, capacity={capacity}]")
    _require(0 <= tp_rank < tp, f"tp_rank: {tp_rank} outside [0, {tp})")
    width = slab_width(capacity, tp)
    start = tp_rank * width
    return min(start, active), max(0, min(width, active - start))
