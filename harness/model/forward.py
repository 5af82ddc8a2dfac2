"""One forward of the whole model on v41 kernels: every layer of the schedule, TP ranks
with their own cache replicas, the host carrying only metadata, page tables, transports
and orchestration.

The layer loop (mirrors ``goldens.forward.model_forward``; nothing here computes model
math, every value below comes out of a v41 kernel)::

    per rank r (slab rows of the TP group):  x_hc = input_pack(ids)          epoch 0
    pre = one-hot lane 0 (the first site's delayed pre-mix: a constant)
    for L in config.layers():                                                 epoch L + 1
      Attention site (mode of L, decode_compose.KernelSite per rank):
        hc_mixes, hc_pre(x_hc, pre), rmsnorm(attn_norm)   over the rank's slab
        all_gather(epoch) -> attention_kernels.rank_partial on the rank's cache replica
        reduce_scatter(epoch) -> hc_post                  -> x_hc, pre  (ping)
      FFN site (harness.entries.moe.site_epoch, EP world = the TP ranks):
        hc_mixes, hc_pre, rmsnorm(ffn_norm), gate, shared_expert, EP dispatch(epoch),
        routed_experts, EP combine(epoch), moe_combine, hc_post  -> x_hc, pre  (pong)
    per rank: hc_head(x_hc, pre), rmsnorm(final norm) -> hidden slab
    all_gather(num_layers + 1) -> logit rows (host gather by metadata) -> lm_head per rank
    (its vocabulary shard) -> picks combined (lm_head.combine_rank_picks)

Cache-source ownership: each rank's :class:`goldens.modes.ModelCaches` replica holds a
window per layer, the compressed KV / index keys per KV source and the ratio-2 state
rings; a layer publishes only into what its mode owns (``attention_kernels.rank_partial``)
and Reuse / Reindex layers read their source's scratch from the same replica.  The TP and
EP transports are one group per forward with one epoch per layer (one-based, consecutive:
a stale window or a skipped layer raises).

Every launch goes through an ``attention_kernels.RankLauncher`` (counted: ``launched``
kernels run, ``reused`` launches answered by the a5sim launch memo from an identical
earlier launch); each site's estimated A5 time is its slowest rank's summed estimates.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch

from goldens.config import V41Config, rank_slab
from goldens.modes import ForwardBatch, ModelCaches, RopeTables, changed_keys, snapshot_caches
from harness.case import Case
from harness.entries import attention_kernels, lm_head, moe
from harness.entries.decode_compose import KernelSite
from harness.model import weights as kw
from harness.transport import TpGroup

_I32 = torch.int32


@dataclasses.dataclass
class SiteCost:
    """One site of a forward (``"input"``, ``"L3.attn"``, ``"L3.ffn"``, ``"head"``): its
    launchers, one per rank (or per rank and epoch)."""

    name: str
    launchers: list

    @property
    def launched(self) -> int:
        return sum(lc.launched for lc in self.launchers)

    @property
    def reused(self) -> int:
        return sum(lc.reused for lc in self.launchers)

    def estimate_us(self) -> float | None:
        """The slowest rank's summed estimated A5 time (None if a launch has no estimate)."""
        per_rank: dict[int, float] = {}
        for lc in self.launchers:
            for r in lc.records:
                us = r.get("aicore_e2e_us")
                if us is None:
                    return None
                per_rank[lc.rank] = per_rank.get(lc.rank, 0.0) + us
        return max(per_rank.values()) if per_rank else 0.0


@dataclasses.dataclass
class SiteTrace:
    """One site as the kernels ran it: ``x_in`` / ``pre_in`` its input lanes and delayed
    pre-mix, ``x_out`` / ``pre_out`` what it returned (``"head"``: ``x_out`` is the hidden
    ``[T, D]``, with the gathered ``logit_rows`` and their ``logits``); ``caches`` rank 0's
    caches before an Attention site, ``changed`` each rank's cache keys ``(name, layer)``
    the site changed and ``replicas_equal`` whether the ranks' caches stayed byte-equal."""

    layer: int
    kind: str  # "attn" | "ffn" | "head"
    x_in: torch.Tensor
    pre_in: torch.Tensor
    x_out: torch.Tensor
    pre_out: torch.Tensor | None
    caches: ModelCaches | None = None
    logit_rows: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    changed: list | None = None  # Attention: per rank, the cache keys whose bytes changed
    replicas_equal: bool = True  # Attention: every rank's caches byte-equal after the site


@dataclasses.dataclass
class KernelForwardOutput:
    """``hidden`` BF16 ``[T, D]`` (the final-normed rows, zero past the active count),
    ``logits`` FP32 ``[B, V]``, ``next_ids`` INT32 ``[B]`` and the forward's sites."""

    hidden: torch.Tensor
    logits: torch.Tensor
    next_ids: torch.Tensor
    sites: list

    @property
    def launched(self) -> int:
        return sum(s.launched for s in self.sites)

    @property
    def reused(self) -> int:
        return sum(s.reused for s in self.sites)

    def estimate_us(self) -> float | None:
        parts = [s.estimate_us() for s in self.sites]
        return None if None in parts else sum(parts)


class KernelModel:
    """The model of a checkpoint (``weights``: :class:`goldens.forward.CheckpointWeights`)
    on ``platform`` at TP size ``tp`` (one DP group; the EP world is its ``tp`` ranks)."""

    def __init__(self, platform, config: V41Config, weights, rope: RopeTables, tp: int, *,
                 preset: str = "tiny") -> None:
        if tp not in (1, 2, 4, 8) or config.num_heads % tp or config.o_groups % tp or config.vocab_size % tp:
            raise ValueError(f"tp: {tp} must be 1, 2, 4 or 8 and divide the {config.num_heads} heads, "
                             f"the {config.o_groups} output groups and the vocabulary ({config.vocab_size})")
        if config.moe.n_routed_experts % tp:
            raise ValueError(f"ep: {tp} must divide the {config.moe.n_routed_experts} routed experts")
        self.platform, self.config, self.weights, self.rope = platform, config, weights, rope
        self.tp, self.preset = tp, preset
        self.memo = attention_kernels.launch_memo(platform)
        self._ffn: dict = {}  # layer -> flat FFN weights (the stacked experts, built once)
        self._attn: dict = {}

    def replicas(self, pool: ModelCaches) -> list[ModelCaches]:
        """One cache replica per TP rank, each a copy of ``pool`` (the caches every rank
        keeps in full: the window, compressed and state caches are not head-sharded)."""
        return [copy.deepcopy(pool) for _ in range(self.tp)]

    def _launcher(self, rank: int) -> attention_kernels.RankLauncher:
        return attention_kernels.RankLauncher(self.platform, self.config, rank, self.preset, memo=self.memo)

    def _attention_weights(self, layer: int):
        if layer not in self._attn:
            self._attn[layer] = kw.attention_site(self.config, layer, self.weights.attention_site(layer))
        return self._attn[layer]

    def _ffn_weights(self, layer: int) -> dict:
        if layer not in self._ffn:
            self._ffn[layer] = kw.ffn_site(self.config, layer, self.weights.ffn_site(layer))
        return self._ffn[layer]

    def forward(self, token_ids: torch.Tensor, batch: ForwardBatch, caches: list[ModelCaches], *,
                on_site=None) -> KernelForwardOutput:
        """One forward of ``batch`` (``token_ids`` ``[T]``; rows at or past
        ``batch.active`` are padding); ``caches[r]`` is rank ``r``'s replica, updated in
        place by the kernels' publications.  ``on_site(SiteTrace)`` is called after every
        site with its inputs and outputs (and, for an Attention site, a copy of rank 0's
        caches as the site found them): what a replay of the golden site needs."""
        cfg, tp = self.config, self.tp
        T, N = batch.tokens, batch.active
        if tuple(token_ids.shape) != (T,):
            raise ValueError(f"token_ids: must be [{T}] (batch.tokens), got {tuple(token_ids.shape)}")
        if len(caches) != tp:
            raise ValueError(f"caches: {len(caches)} replicas, expected one per TP rank ({tp})")
        ids = token_ids.to(_I32).clone()
        ids[N:] = -1
        for c in caches:
            c.begin_forward(cfg, batch)
        sites: list[SiteCost] = []
        width = -(-T // tp)
        kind = "decode" if int(batch.metadata.kv_seq_lens.min()) > 0 else "prefill"
        tp_group = TpGroup(tp, T, cfg.hidden_size)
        moe_case = Case(entry="moe", tokens=T, active_tokens=N, tp=tp, ep=tp, wiring="sharded",
                        preset=self.preset)
        ep_group = moe.new_ep_group(cfg, moe_case)

        # input: each rank embeds its slab's ids
        x_hc = torch.zeros(T, cfg.hc.hc_mult, cfg.hidden_size)
        boundary = [self._launcher(r) for r in range(tp)]
        for r, launch in enumerate(boundary):
            first, count = rank_slab(N, tp, r, T)
            if count:
                x_hc[first:first + count] = launch(
                    "v41.input_pack", {"tokens": count},
                    {"token_ids": ids[first:first + count].contiguous(),
                     "num_tokens": torch.tensor([count], dtype=_I32), "embed": self._embed})["x_hc"]
        sites.append(SiteCost("input", boundary))
        pre = torch.zeros(T, cfg.hc.hc_mult)
        pre[:, 0] = 1.0  # the first site's delayed pre-mix: one-hot lane 0

        for lc in cfg.layers():
            L, epoch = lc.layer, lc.layer + 1
            # Attention site
            x_in, pre_in = x_hc, pre
            before = copy.deepcopy(caches[0]) if on_site is not None else None
            bytes_before = [snapshot_caches(c) for c in caches] if on_site is not None else None
            hc_flat, mode_w = self._attention_weights(L)
            case = Case(entry=f"{kind}_{lc.mode.value}", tokens=T, active_tokens=N, tp=tp,
                        wiring="sharded", preset=self.preset)
            launchers: dict = {}
            site = KernelSite(self.platform, cfg, case, {**hc_flat, "g0.x_hc": x_hc, "g0.pre_in": pre}, 0,
                              launchers, self.memo)
            for r in range(tp):
                first, count = rank_slab(N, tp, r, T)
                slab = torch.zeros(width, cfg.hidden_size, dtype=torch.bfloat16)
                slab[:count] = site.prepare(r, epoch)[:count]
                tp_group.publish_gather(r, epoch, slab)
            for r in range(tp):
                x = tp_group.all_gather(epoch, N)
                partial, _ = attention_kernels.rank_partial(site.launcher(r, epoch), cfg, L, x, mode_w, caches[r],
                                                            batch, self.rope, tp, r, N)
                tp_group.publish_partial(r, epoch, partial)
            for r in range(tp):
                site.finish(r, epoch, tp_group.reduce_scatter(r, epoch, N))
            x_hc, pre = site.x_hc_out, site.pre_out
            sites.append(SiteCost(f"L{L}.attn", list(launchers.values())))
            if on_site is not None:
                changed = [changed_keys(b, c) for b, c in zip(bytes_before, caches)]
                now = [snapshot_caches(c) for c in caches]
                same = all(now[r].keys() == now[0].keys() and all(torch.equal(now[r][k], now[0][k]) for k in now[0])
                           for r in range(1, tp))
                on_site(SiteTrace(L, "attn", x_in, pre_in, x_hc, pre, before, changed=changed, replicas_equal=same))
            # FFN site
            x_in, pre_in = x_hc, pre
            flat = {**self._ffn_weights(L), "g0.x_hc": x_hc, "g0.pre_in": pre}
            ffn_launchers = [self._launcher(r) for r in range(tp)]
            out = moe.site_epoch(self.platform, cfg, moe_case, flat, ffn_launchers, ep_group, epoch)
            x_hc, pre = out["x_hc_out"][0], out["pre_out"][0]
            sites.append(SiteCost(f"L{L}.ffn", ffn_launchers))
            if on_site is not None:
                on_site(SiteTrace(L, "ffn", x_in, pre_in, x_hc, pre))

        # head: final collapse and norm per slab, hidden gathered, logits per vocab shard
        epoch = cfg.num_layers + 1
        head = [self._launcher(r) for r in range(tp)]
        for r, launch in enumerate(head):
            first, count = rank_slab(N, tp, r, T)
            slab = torch.zeros(width, cfg.hidden_size, dtype=torch.bfloat16)
            if count:
                rows = slice(first, first + count)
                y = launch("v41.hc_head", {"tokens": count},
                           {"x_hc": x_hc[rows].contiguous(), "last_pre_mix": pre[rows].contiguous()})["y"]
                slab[:count] = launch("v41.rmsnorm", {"tokens": count},
                                      {"x": y, "weight": self._final_norm})["y"]
            tp_group.publish_gather(r, epoch, slab)
        hidden = tp_group.all_gather(epoch, N)
        logit_rows = batch.metadata.logit_row_indices.to(torch.int64)
        R = int(logit_rows.numel())
        rows = torch.zeros(R, cfg.hidden_size, dtype=torch.bfloat16)
        live = logit_rows >= 0
        rows[live] = hidden[logit_rows[live]]
        vl = cfg.vocab_size // tp
        logits = torch.empty(R, cfg.vocab_size)
        values, indices = torch.empty(tp, R), torch.empty(tp, R, dtype=_I32)
        head_w = self._head
        for r, launch in enumerate(head):
            out = launch("v41.lm_head", {"tokens": R, "tp": tp, "rank": r},
                         {"hidden": rows, "head": head_w[r * vl:(r + 1) * vl].contiguous(),
                          "num_rows": torch.tensor([R], dtype=_I32)})
            logits[:, r * vl:(r + 1) * vl] = out["logits"]
            values[r], indices[r] = out["best_value"][:, 0], out["best_index"][:, 0]
        _, next_ids = lm_head.combine_rank_picks(values, indices)
        sites.append(SiteCost("head", head))
        if on_site is not None:
            on_site(SiteTrace(cfg.num_layers, "head", x_hc, pre, hidden, None, logit_rows=rows, logits=logits))
        return KernelForwardOutput(hidden, logits, next_ids.to(_I32), sites)

    @functools.cached_property
    def _embed(self) -> torch.Tensor:
        return kw.exact_bf16(self.weights.embed(), "embed")

    @functools.cached_property
    def _final_norm(self) -> torch.Tensor:
        return kw.exact_bf16(self.weights.final_norm(), "norm (final)")

    @functools.cached_property
    def _head(self) -> torch.Tensor:
        return self.weights.head().to(torch.float32).contiguous()
