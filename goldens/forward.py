"""The golden model: the full V4.1 forward over every layer of a preset, and greedy generation.

One forward (:func:`model_forward`) is the official Block chain over ``config.layers()``::

    x_hc = embed(token_ids)                      FP32 [T, hc, D], row replicated on every lane
    pre  = initial_pre_mix(T)                    one-hot lane 0
    for L in 0 .. num_layers-1:                  (layer_config(L) picks the attention mode)
      # Attention site
      mixes = hc_mixes(x_hc, hc_attn[L])         from the Block input
      x     = rms_norm(hc_pre(x_hc, pre), attn_norm[L])          collapse with the INCOMING pre
      y     = attention_half_layer(L, x, caches, batch)          mode of L, caches in place
      x_hc  = hc_post(y, x_hc, mixes.post, mixes.comb); pre = mixes.pre
      # FFN site
      mixes = hc_mixes(x_hc, hc_ffn[L])
      x     = rms_norm(hc_pre(x_hc, pre), ffn_norm[L])           collapse with the Attention pre
      y     = moe_block(x, route(x), experts[L] one at a time, shared[L])
      x_hc  = hc_post(y, x_hc, mixes.post, mixes.comb); pre = mixes.pre   -> next layer
    h      = final_norm(hc_head(x_hc, pre))      last delayed pre-mix, BF16
    logits = lm_head(h[logit rows])              FP32, last row of each request
    ids    = greedy_sample(logits)

Prefill and decode are the same function over different :class:`goldens.modes.ForwardBatch`
metadata (packed prompts with ``kv_seq_lens`` 0, or one row per request over the cached
prefix).  The caches (:class:`goldens.modes.ModelCaches`: a window per layer, compressed KV /
index keys per KV source, a state ring per ratio-2 source) are updated in place and carry
sequence state across forwards; Top-K rows and the candidate mask are per-forward scratch
(``caches.begin_forward``).  HC mixes are depth-local and never persisted.  Engram (layers
1 and 14 of FLASH) and DSpark are out of scope and not applied.

Weights come from any object with the :class:`ModelWeights` methods; :class:`CheckpointWeights`
reads a released-layout :class:`goldens.checkpoint.Checkpoint` lazily, one site at a time (the
forward drops a site's weights before loading the next), routed experts one at a time through
:class:`goldens.checkpoint.ExpertLoader` -- so a FLASH forward never holds more than one
layer-site's dequantized weights.  ``resident=True`` memoizes everything (TINY: fast
repeated forwards).

Batch invariance.  Every golden this forward composes gives a row the same bytes whatever
batch it is in: the FP32 products of :func:`goldens.mhc.hc_mixes`, the router's gate, the
routed experts and the LM head go through :func:`goldens.exact.matmul_fp32` (FP64
accumulation, one rounding to FP32) and their sigmoid/SiLU through the FP64-evaluated
:func:`goldens.exact.sigmoid_fp32` / :func:`goldens.exact.silu_fp32`; the MXFP8 linears,
compressor and indexer use exact dots; the attention half-layer reduces per row.  (A plain
FP32 torch matmul or sigmoid gives a row a value that depends on how many rows share the
call -- the CPU BLAS picks different kernels for M = 1 and M = 36, the elementwise kernels a
different vector/scalar split -- and the indexer's BF16 scores turn such a 1-ulp difference
into a different Top-K row.)  So the forward calls every golden on the whole batch, and a
prefill followed by carried-cache decode steps reproduces a prefill of the whole sequence
bit for bit (tests/goldens/test_forward.py).

:class:`PagedCaches` owns the cache pool and hands out blocks per request as sequences grow
(free lists, optionally permuted so physical pages are scattered); :func:`generate` runs one
packed prefill and then greedy decode steps, one row per request per step.

Pure torch: imports nothing from ``v41`` or ``harness``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from goldens.boundary import embed, final_norm, gather_logit_rows, greedy_sample, lm_head
from goldens.checkpoint import Checkpoint
from goldens.config import Mode, V41Config
from goldens.mhc import HcSiteWeights, hc_head, hc_mixes, hc_post, hc_pre, initial_pre_mix
from goldens.modes import (ForwardBatch, IndexerWeights, ModelCaches, ModeWeights, RopeTables,
                           attention_half_layer, build_forward_batch)
from goldens.moe import ExpertLookup, ExpertWeights, moe_block
from goldens.norm import rms_norm
from goldens.router import route
from goldens.tp import AttentionWeights

__all__ = ["AttentionSiteWeights", "FfnSiteWeights", "ModelWeights", "CheckpointWeights",
           "ForwardOutput", "model_forward", "GoldenModel", "PagedCaches", "StepRecord",
           "GenerationResult", "generate", "prefill_only"]

_I32 = torch.int32


# ---- weights -------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionSiteWeights:
    """One layer's Attention site: mHC parameters, ``attn_norm`` (FP32 ``[D]``) and the
    mode's :class:`goldens.modes.ModeWeights`."""

    hc: HcSiteWeights
    norm: torch.Tensor
    attention: ModeWeights


@dataclass(frozen=True)
class FfnSiteWeights:
    """One layer's FFN site: mHC parameters, ``ffn_norm``, FP32 router gate ``[E, D]`` and
    selection bias ``[E]``, the shared expert and a lookup of routed experts (indexed by
    expert id; a lazy loader reads one expert per access)."""

    hc: HcSiteWeights
    norm: torch.Tensor
    gate_weight: torch.Tensor
    gate_bias: torch.Tensor
    shared: ExpertWeights
    experts: ExpertLookup


class ModelWeights(Protocol):
    """What :func:`model_forward` reads.  Site weights are requested once per layer per
    forward, just before the site runs, and released after it."""

    config: V41Config

    def embed(self) -> torch.Tensor: ...  # BF16 [vocab, D]

    def attention_site(self, layer: int) -> AttentionSiteWeights: ...

    def ffn_site(self, layer: int) -> FfnSiteWeights: ...

    def final_norm(self) -> torch.Tensor: ...  # FP32 [D]

    def head(self) -> torch.Tensor: ...  # FP32 [vocab, D]


class _MemoExperts:
    """Expert lookup that loads each expert on first use and keeps it."""

    def __init__(self, inner: ExpertLookup) -> None:
        self._inner, self._memo = inner, {}

    def __getitem__(self, e: int) -> ExpertWeights:
        if e not in self._memo:
            self._memo[e] = self._inner[e]
        return self._memo[e]


class CheckpointWeights:
    """:class:`ModelWeights` read from a :class:`goldens.checkpoint.Checkpoint`.

    Lazy by default: every call reads that site's tensors from the shards (byte ranges) and
    the caller drops them after use; routed experts are read one at a time when the MoE
    visits them.  ``resident=True`` memoizes every site, expert and boundary tensor (only
    sensible for TINY-sized checkpoints).
    """

    def __init__(self, ckpt: Checkpoint, *, resident: bool = False) -> None:
        if not isinstance(ckpt, Checkpoint):
            raise ValueError(f"ckpt: expected a goldens.checkpoint.Checkpoint, got "
                             f"{type(ckpt).__name__}")
        self.ckpt = ckpt
        self.config = ckpt.config
        self.resident = resident
        self._memo: dict = {}

    @classmethod
    def open(cls, root, config: V41Config, *, resident: bool = False) -> "CheckpointWeights":
        return cls(Checkpoint(root, config), resident=resident)

    def _get(self, key, make: Callable):
        if not self.resident:
            return make()
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def embed(self) -> torch.Tensor:
        return self._get("embed", self.ckpt.embed)

    def final_norm(self) -> torch.Tensor:
        return self._get("norm", self.ckpt.final_norm)

    def head(self) -> torch.Tensor:
        return self._get("head", self.ckpt.head)

    def attention_site(self, layer: int) -> AttentionSiteWeights:
        return self._get(("attn", layer), lambda: self._load_attention(layer))

    def ffn_site(self, layer: int) -> FfnSiteWeights:
        return self._get(("ffn", layer), lambda: self._load_ffn(layer))

    def _load_attention(self, layer: int) -> AttentionSiteWeights:
        c = self.ckpt
        lc = self.config.layer_config(layer)
        attn = AttentionWeights(c.qkv_weights(layer), c.o_weights(layer),
                                c.attn_sink(layer).to(torch.float32))
        comp = c.compressor_weights(layer) if lc.is_kv_source else None
        idx = None
        if lc.is_index_source:
            iw = c.indexer_weights(layer)
            idx = IndexerWeights(iw.wq_b, iw.wq_b_scale, iw.weights_proj)
        return AttentionSiteWeights(c.hc_site(layer, "attn"), c.attn_norm(layer),
                                    ModeWeights(lc.mode, attn, comp, idx))

    def _load_ffn(self, layer: int) -> FfnSiteWeights:
        c = self.ckpt
        router = c.router(layer)
        experts = c.experts(layer)
        if self.resident:
            experts = _MemoExperts(experts)
        return FfnSiteWeights(c.hc_site(layer, "ffn"), c.ffn_norm(layer), router.weight,
                              router.bias, c.shared_expert(layer), experts)


# ---- one forward ---------------------------------------------------------------------------

@dataclass
class ForwardOutput:
    """One forward's results.  ``hidden``: BF16 ``[T, D]`` final-normed hidden of every row
    (the LM head input); ``logit_rows`` INT32 ``[B]`` (last row of each request, -1 for an
    empty request); ``logits`` FP32 ``[B, V]``; ``next_ids`` INT32 ``[B]`` greedy;
    ``layers`` the ``(layer, mode)`` pairs visited, in order; ``last_pre`` the FP32
    ``[T, hc]`` delayed pre-mix the head collapsed with; ``x_hc`` the final residual lanes."""

    hidden: torch.Tensor
    logit_rows: torch.Tensor
    logits: torch.Tensor
    next_ids: torch.Tensor
    layers: list[tuple[int, Mode]]
    last_pre: torch.Tensor
    x_hc: torch.Tensor


def _finite(t: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(t).all()):
        raise FloatingPointError(f"{what}: non-finite values")


def site_mixes(config: V41Config, x_hc: torch.Tensor, w: HcSiteWeights):
    """:func:`goldens.mhc.hc_mixes` of the site input (batch-invariant, whole batch)."""
    return hc_mixes(x_hc, w, config)


def attention_site(config: V41Config, layer: int, x_hc: torch.Tensor, pre: torch.Tensor,
                   w: AttentionSiteWeights, caches: ModelCaches, batch: ForwardBatch,
                   rope: RopeTables) -> tuple[torch.Tensor, torch.Tensor]:
    """The Attention site of ``layer``: mixes from the Block input, collapse with the
    incoming ``pre``, attn_norm, the mode's half-layer (caches in place), hc_post.
    Returns ``(x_hc, this site's pre)``."""
    mixes = site_mixes(config, x_hc, w.hc)
    x = rms_norm(hc_pre(x_hc, pre, config), w.norm, config.rms_norm_eps)
    y, _, _ = attention_half_layer(config, layer, x, w.attention, caches, batch, rope)
    return hc_post(y, x_hc, mixes.post, mixes.comb, config), mixes.pre


def ffn_site(config: V41Config, x_hc: torch.Tensor, pre: torch.Tensor, w: FfnSiteWeights,
             active: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The FFN site: mixes first, collapse with the Attention site's ``pre``, ffn_norm once,
    router, shared + routed experts (one at a time, :func:`goldens.moe.moe_block`), hc_post.
    Only the ``active`` rows are routed; padding rows get no expert output (zero).  Returns
    ``(x_hc, pre)``."""
    mixes = site_mixes(config, x_hc, w.hc)
    x = rms_norm(hc_pre(x_hc, pre, config), w.norm, config.rms_norm_eps)
    y = torch.zeros(x.shape, dtype=torch.bfloat16)
    if active:
        xa = x[:active]
        idx, wts = route(xa, w.gate_weight, w.gate_bias, config)
        y[:active] = moe_block(xa, idx, wts, w.experts, w.shared, config)
    return hc_post(y, x_hc, mixes.post, mixes.comb, config), mixes.pre


def model_forward(config: V41Config, weights: ModelWeights, token_ids: torch.Tensor,
                  batch: ForwardBatch, caches: ModelCaches, rope: RopeTables, *,
                  check_finite: bool = True,
                  on_site: Callable[[int, str, torch.Tensor, torch.Tensor], None] | None = None
                  ) -> ForwardOutput:
    """One forward over all layers (see the module docstring).

    ``token_ids`` INT32/INT64 ``[T]`` (``T = batch.tokens``; rows at or past
    ``batch.active`` are padding, id -1); ``caches`` is updated in place (a fresh scratch is
    begun here).  ``check_finite`` raises :class:`FloatingPointError` naming the layer and
    site at the first non-finite residual.  ``on_site(layer, "attn"|"ffn", x_hc, pre)`` is
    called after every site (tracing).
    """
    if not isinstance(batch, ForwardBatch):
        raise ValueError(f"batch: expected a ForwardBatch, got {type(batch).__name__}")
    T, N = batch.tokens, batch.active
    if not isinstance(token_ids, torch.Tensor) or tuple(token_ids.shape) != (T,):
        raise ValueError(f"token_ids: must be a 1-D tensor of {T} ids (batch.tokens)")
    ids = token_ids.clone()
    ids[N:] = -1
    x_hc = embed(ids, weights.embed(), config)
    pre = initial_pre_mix(T, config)
    caches.begin_forward(config, batch)
    visited: list[tuple[int, Mode]] = []
    for lc in config.layers():
        L = lc.layer
        w_attn = weights.attention_site(L)
        x_hc, pre = attention_site(config, L, x_hc, pre, w_attn, caches, batch, rope)
        del w_attn
        if check_finite:
            _finite(x_hc[:N], f"layer {L} attention site ({lc.mode.value}) residual")
        if on_site is not None:
            on_site(L, "attn", x_hc, pre)
        w_ffn = weights.ffn_site(L)
        x_hc, pre = ffn_site(config, x_hc, pre, w_ffn, N)
        del w_ffn
        if check_finite:
            _finite(x_hc[:N], f"layer {L} FFN site residual")
        if on_site is not None:
            on_site(L, "ffn", x_hc, pre)
        visited.append((L, lc.mode))
    hidden = final_norm(hc_head(x_hc, pre, config), weights.final_norm(), config)
    hidden[N:] = 0
    rows = batch.metadata.logit_row_indices
    head = weights.head()
    logits = lm_head(gather_logit_rows(hidden, rows), head, config)
    if check_finite:
        _finite(hidden[:N], "final hidden")
        _finite(logits, "logits")
    return ForwardOutput(hidden, rows.clone(), logits, greedy_sample(logits), visited, pre,
                         x_hc)


# ---- the model: weights + RoPE tables ------------------------------------------------------

class GoldenModel:
    """A config, its weights and the serving-owned RoPE tables (both profiles, positions
    ``0 .. rope_capacity-1``; default ``min(rope.max_position, 65536)``)."""

    def __init__(self, config: V41Config, weights: ModelWeights, *,
                 rope_capacity: int | None = None) -> None:
        self.config = config
        self.weights = weights
        cap = min(config.rope.max_position, 65536) if rope_capacity is None else rope_capacity
        self.rope = RopeTables.build(config, cap)
        self.rope_capacity = cap

    @classmethod
    def from_checkpoint(cls, root, config: V41Config, *, resident: bool = False,
                        rope_capacity: int | None = None) -> "GoldenModel":
        return cls(config, CheckpointWeights.open(root, config, resident=resident),
                   rope_capacity=rope_capacity)

    def forward(self, token_ids: torch.Tensor, batch: ForwardBatch, caches: ModelCaches,
                **kw) -> ForwardOutput:
        return model_forward(self.config, self.weights, token_ids, batch, caches, self.rope,
                             **kw)


# ---- paged caches --------------------------------------------------------------------------

@dataclass
class _Request:
    kv_len: int = 0
    window_pages: list[int] = field(default_factory=list)
    compressed_pages: dict[int, list[int]] = field(default_factory=dict)  # ratio -> pages
    state_block: int = -1


class PagedCaches:
    """The cache pool of a serving session and its block allocation.

    Pool: ``window_blocks`` window blocks per layer (one block table shared by the layers),
    ``compressed_blocks`` compressed/index blocks per KV source (one table per ratio, shared
    by the same-ratio sources), ``max_requests`` state blocks per ratio-2 source (one per
    live request).  Pages are taken from free lists as a request grows (``page_seed``
    permutes the free lists, scattering physical pages) and returned by :meth:`release`.
    """

    def __init__(self, config: V41Config, *, max_requests: int, window_blocks: int,
                 compressed_blocks: int, page_seed: int | None = None, fill: int = 0) -> None:
        self.config = config
        self.ratios = sorted({config.compress_ratios[s] for s in config.kv_source_layer_ids})
        self.caches = ModelCaches.allocate(config, window_blocks=window_blocks,
                                           compressed_blocks=compressed_blocks,
                                           state_blocks=max_requests, fill=fill)
        self.num_state_blocks = max_requests
        rng = random.Random(page_seed)

        def pool(n):
            ids = list(range(n))
            if page_seed is not None:
                rng.shuffle(ids)
            return ids[::-1]  # pop() takes from the end

        self._free_window = pool(window_blocks)
        self._free_comp = {r: pool(compressed_blocks) for r in self.ratios}
        self._free_state = pool(max_requests)
        self.requests: dict[object, _Request] = {}

    @classmethod
    def for_lengths(cls, config: V41Config, lengths: Sequence[int], *,
                    page_seed: int | None = None, spare_blocks: int = 1,
                    fill: int = 0) -> "PagedCaches":
        """A pool just large enough for requests of the given final lengths (plus
        ``spare_blocks`` never-addressed blocks per pool)."""
        bs = config.cache.block_size
        ratios = {config.compress_ratios[s] for s in config.kv_source_layer_ids} or {1}
        wb = sum(-(-n // bs) for n in lengths) + spare_blocks
        cb = max(sum(-(-(n // r) // bs) for n in lengths) for r in ratios) + spare_blocks
        return cls(config, max_requests=max(1, len(lengths)), window_blocks=wb,
                   compressed_blocks=max(1, cb), page_seed=page_seed, fill=fill)

    def add(self, rid) -> None:
        if rid in self.requests:
            raise ValueError(f"request {rid!r}: already live")
        if not self._free_state:
            raise ValueError(f"request {rid!r}: no free state block "
                             f"({self.num_state_blocks} live requests max)")
        self.requests[rid] = _Request(state_block=self._free_state.pop(),
                                      compressed_pages={r: [] for r in self.ratios})

    def release(self, rid) -> None:
        req = self.requests.pop(rid)
        self._free_window.extend(reversed(req.window_pages))
        for r, pages in req.compressed_pages.items():
            self._free_comp[r].extend(reversed(pages))
        self._free_state.append(req.state_block)

    def kv_len(self, rid) -> int:
        return self.requests[rid].kv_len

    def _grow(self, rid, new_len: int) -> None:
        bs = self.config.cache.block_size
        req = self.requests[rid]
        while len(req.window_pages) * bs < new_len:
            if not self._free_window:
                raise ValueError(f"request {rid!r}: window pool exhausted at length {new_len}")
            req.window_pages.append(self._free_window.pop())
        for r in self.ratios:
            pages = req.compressed_pages[r]
            while len(pages) * bs < new_len // r:
                if not self._free_comp[r]:
                    raise ValueError(f"request {rid!r}: ratio-{r} compressed pool exhausted "
                                     f"at length {new_len}")
                pages.append(self._free_comp[r].pop())

    def batch(self, rids: Sequence, new_rows: Sequence[int]) -> ForwardBatch:
        """Allocate pages for ``new_rows`` more tokens of each request (in ``rids`` order)
        and lower the forward's metadata; call :meth:`advance` after the forward."""
        if len(rids) != len(new_rows):
            raise ValueError("rids/new_rows: lengths differ")
        for rid, n in zip(rids, new_rows):
            self._grow(rid, self.requests[rid].kv_len + n)
        reqs = [self.requests[r] for r in rids]
        B = len(reqs)

        def table(lists):
            width = max([len(p) for p in lists] + [1])
            t = torch.full((B, width), -1, dtype=_I32)
            for i, p in enumerate(lists):
                t[i, :len(p)] = torch.tensor(p, dtype=_I32)
            return t

        wtable = table([q.window_pages for q in reqs])
        per_ratio = {r: table([q.compressed_pages[r] for q in reqs]) for r in self.ratios}
        ctables = {s: per_ratio[self.config.compress_ratios[s]]
                   for s in self.config.kv_source_layer_ids}
        state = torch.tensor([[q.state_block] for q in reqs], dtype=_I32).view(B, 1)
        stables = {s: state for s in self.config.kv_source_layer_ids
                   if self.config.compress_ratios[s] == 2}
        qsl = torch.zeros(B + 1, dtype=_I32)
        qsl[1:] = torch.cumsum(torch.tensor(list(new_rows), dtype=torch.int64), 0).to(_I32)
        kv = torch.tensor([q.kv_len for q in reqs], dtype=_I32)
        return build_forward_batch(self.config, qsl, kv, wtable, ctables, stables,
                                   num_state_blocks=self.num_state_blocks)

    def advance(self, rids: Sequence, new_rows: Sequence[int]) -> None:
        for rid, n in zip(rids, new_rows):
            self.requests[rid].kv_len += n


# ---- generation ----------------------------------------------------------------------------

@dataclass
class StepRecord:
    """One forward of a generation: its kind, rows per request, wall seconds, the
    final-normed hidden rows (BF16 ``[T, D]``, when kept) with their ``(request, position)``
    and the ids it sampled."""

    kind: str  # "prefill" | "decode"
    rows: list[int]
    seconds: float
    positions: list[tuple[int, int]]
    next_ids: list[int]
    hidden: torch.Tensor | None = None
    layers: list[tuple[int, Mode]] = field(default_factory=list)


@dataclass
class GenerationResult:
    prompts: list[list[int]]
    generated: list[list[int]]
    steps: list[StepRecord]

    @property
    def prefill_seconds(self) -> float:
        return sum(s.seconds for s in self.steps if s.kind == "prefill")

    @property
    def decode_seconds(self) -> list[float]:
        return [s.seconds for s in self.steps if s.kind == "decode"]

    def hidden_rows(self, request: int) -> torch.Tensor:
        """BF16 ``[positions, D]``: the final hidden of every position fed for ``request``
        (prompt then generated ids, the last generated id excluded), in position order."""
        rows = {}
        for s in self.steps:
            if s.hidden is None:
                raise ValueError("hidden rows were not kept (generate(..., keep_hidden=True))")
            for t, (r, p) in enumerate(s.positions):
                if r == request:
                    rows[p] = s.hidden[t]
        return torch.stack([rows[p] for p in sorted(rows)])


def _normalize_prompts(prompt_ids) -> tuple[list[list[int]], bool]:
    if isinstance(prompt_ids, torch.Tensor):
        prompt_ids = prompt_ids.tolist()
    if not isinstance(prompt_ids, (list, tuple)) or not prompt_ids:
        raise ValueError("prompt_ids: expected a non-empty list of ids or list of prompts")
    single = all(isinstance(t, int) for t in prompt_ids)
    prompts = [list(prompt_ids)] if single else [list(p) for p in prompt_ids]
    for i, p in enumerate(prompts):
        if not p or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            raise ValueError(f"prompt_ids[{i}]: must be a non-empty list of int token ids")
    return prompts, single


def _check_ids(model: GoldenModel, prompts, max_new_tokens: int) -> None:
    v = model.config.vocab_size
    for i, p in enumerate(prompts):
        bad = [t for t in p if not 0 <= t < v]
        if bad:
            raise ValueError(f"prompt_ids[{i}]: id {bad[0]} outside [0, vocab_size={v})")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: {max_new_tokens!r}, expected an int >= 0")
    longest = max(len(p) for p in prompts) + max_new_tokens
    if longest > model.rope_capacity:
        raise ValueError(f"prompt + max_new_tokens: {longest} positions exceed the model's "
                         f"RoPE capacity {model.rope_capacity}")


def _run(model: GoldenModel, pc: PagedCaches, kind: str, rids: list[int], feeds: list[list[int]],
         keep_hidden: bool) -> StepRecord:
    rows = [len(f) for f in feeds]
    t0 = time.perf_counter()
    batch = pc.batch(rids, rows)
    ids = torch.tensor([t for f in feeds for t in f], dtype=torch.int64)
    out = model.forward(ids, batch, pc.caches)
    pc.advance(rids, rows)
    seconds = time.perf_counter() - t0
    md = batch.metadata
    positions = [(rids[int(r)], int(p)) for r, p in
                 zip(md.token_to_req_indices[:md.num_tokens].tolist(),
                     md.position_ids[:md.num_tokens].tolist())]
    return StepRecord(kind, rows, seconds, positions, out.next_ids.tolist(),
                      out.hidden[:md.num_tokens].clone() if keep_hidden else None, out.layers)


def generate(model: GoldenModel, prompt_ids, max_new_tokens: int, *,
             page_seed: int | None = None, keep_hidden: bool = False,
             return_result: bool = False):
    """Greedy generation: one packed prefill of every prompt, then ``max_new_tokens - 1``
    decode steps of one row per request (the caches carried across steps).

    ``prompt_ids``: one prompt (a list of ints) or a list of prompts.  Returns the generated
    ids (a list, or a list of lists for several prompts), ``max_new_tokens`` per request;
    with ``return_result=True`` the :class:`GenerationResult` (timings per step and, with
    ``keep_hidden``, every fed position's final hidden row).  ``page_seed`` scatters the
    physical cache pages.
    """
    prompts, single = _normalize_prompts(prompt_ids)
    _check_ids(model, prompts, max_new_tokens)
    B = len(prompts)
    generated: list[list[int]] = [[] for _ in range(B)]
    steps: list[StepRecord] = []
    if max_new_tokens > 0:
        lengths = [len(p) + max_new_tokens - 1 for p in prompts]
        pc = PagedCaches.for_lengths(model.config, lengths, page_seed=page_seed)
        rids = list(range(B))
        for r in rids:
            pc.add(r)
        rec = _run(model, pc, "prefill", rids, prompts, keep_hidden)
        steps.append(rec)
        for r in rids:
            generated[r].append(rec.next_ids[r])
        for _ in range(max_new_tokens - 1):
            rec = _run(model, pc, "decode", rids, [[g[-1]] for g in generated], keep_hidden)
            steps.append(rec)
            for r in rids:
                generated[r].append(rec.next_ids[r])
        for r in rids:
            pc.release(r)
    result = GenerationResult(prompts, generated, steps)
    if return_result:
        return result
    return generated[0] if single else generated


def prefill_only(model: GoldenModel, prompt_ids, *, page_seed: int | None = None
                 ) -> tuple[ForwardOutput, ForwardBatch]:
    """One packed prefill of the prompts over fresh caches: ``(ForwardOutput, batch)``
    (the reference a carried-cache generation is compared against)."""
    prompts, _ = _normalize_prompts(prompt_ids)
    _check_ids(model, prompts, 0)
    pc = PagedCaches.for_lengths(model.config, [len(p) for p in prompts], page_seed=page_seed)
    rids = list(range(len(prompts)))
    for r in rids:
        pc.add(r)
    batch = pc.batch(rids, [len(p) for p in prompts])
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64)
    return model.forward(ids, batch, pc.caches), batch
