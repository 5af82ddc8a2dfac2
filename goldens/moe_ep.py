"""Expert-parallel MoE golden as a device performs it: dispatch, local experts, combine.

The EP world has ``ep`` ranks; rank ``r`` holds the ``L = n_routed / ep`` contiguous routed
experts ``[r*L, (r+1)*L)`` (the same layout as :func:`goldens.moe.ep_partial`).  Tokens are
owned by SOURCE ranks: a list of per-source batches ``x_s [T_s, D]`` with their routing
``indices_s INT [T_s, k]`` / ``weights_s FP32 [T_s, k]`` (:func:`goldens.router.route`).  On
the device every EP rank is a source and owns the rows of its TP slab of its DP group (the
EP world read as ``ep / tp`` DP groups of ``tp`` ranks, rank ``g*tp + tp_rank``):
:func:`source_batches` makes that split.  Any number of sources works here (one source
is the single-owner view); a source may hold no tokens.

Three phases:

1. :func:`dispatch` - each route ``(source s, token t, slot j)`` with global expert
   ``e = indices_s[t, j]`` becomes one row sent to rank ``e // L`` with its route weight.
   A destination's rows are ordered by LOCAL EXPERT ascending, inside an expert by source
   rank ascending, then by token ascending (so one expert's rows are a contiguous run,
   ``Received.counts`` long).  A token whose ``k`` experts all live on one rank sends ``k``
   rows there; a rank no route reaches receives zero rows.
2. :func:`expert_outputs` - per destination, each local expert WITH rows runs
   :func:`goldens.moe.routed_expert` on its gathered rows (weight applied before W2, BF16
   output); experts without rows are skipped and their weights never fetched.  The row
   payload is the token's BF16 ``x`` row (the device sends its MXFP8 codes and scales; MX
   quantization is per row, so the values are the same).
3. :func:`combine` - every output row returns to its owner: source ``s`` stages it at
   ``(token, slot)`` of a ``[T_s, k, D]`` BF16 buffer (the device's ``routed_output[t*k+j]``
   put); a slot left unfilled raises.  The owner then sums each token's ``k`` rows in FP32,
   starting from zero, in ASCENDING GLOBAL EXPERT index (whatever rank or slot they came
   from), and casts once: ``out = [BF16](shared_y + routed_sum)``.  (BF16 rows of similar
   magnitude add exactly in FP32 in any order; the fixed order decides the rare sums that
   need more than FP32's 24 significant bits.)

Why this equals :func:`goldens.moe.moe_block` byte for byte: a routed row does not depend
on the other rows of its call (``routed_expert`` is batch-invariant), the shared expert is
row-wise too, and ``moe_block``'s ``routed_partial`` adds each token's expert outputs into
a zero FP32 row in ascending expert index, the order used here.  ``tests/goldens/
test_moe_ep.py`` checks it for EP1/2/4/8 and one or several sources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from goldens.config import V41Config, rank_slab
from goldens.moe import ExpertLookup, ExpertWeights, routed_expert, shared_expert


@dataclass(frozen=True)
class Received:
    """The rows one destination rank receives, in dispatch order (see the module doc).

    ``source``, ``token``, ``slot``, ``expert`` are INT64 ``[R]`` (owner rank, row in the
    owner's batch, routing slot, GLOBAL expert id), ``weight`` FP32 ``[R]`` the route
    weight; ``counts`` INT64 ``[L]`` the rows of each local expert, in order."""

    rank: int
    source: torch.Tensor
    token: torch.Tensor
    slot: torch.Tensor
    expert: torch.Tensor
    weight: torch.Tensor
    counts: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.source.numel())


class Combined(NamedTuple):
    """One source rank's combine result: FP32 ``routed_sum [T_s, D]`` and the block output
    BF16 ``out [T_s, D]``."""

    routed_sum: torch.Tensor
    out: torch.Tensor


# ---- layout and validation ----------------------------------------------------------------

def n_local_experts(cfg: V41Config, ep: int) -> int:
    """``n_routed / ep``; raises ValueError naming ``ep`` unless it is a positive divisor."""
    n = cfg.moe.n_routed_experts
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or n % ep:
        raise ValueError(f"ep: {ep!r} must be a positive divisor of n_routed_experts {n}")
    return n // ep


def source_batches(groups: Sequence[torch.Tensor], tp: int) -> list[torch.Tensor]:
    """Per-source-rank batches of the EP world read as DP groups x TP: ``groups[g]`` is DP
    group ``g``'s token rows; rank ``g*tp + r`` owns TP slab ``r`` of them
    (:func:`goldens.config.rank_slab`: ``ceil(T_g / tp)`` rows, fewer or none at the end).
    Concatenating the result in rank order gives the groups' rows in order."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp: {tp!r} must be an int >= 1")
    out = []
    for g in groups:
        for r in range(tp):
            first, count = rank_slab(g.shape[0], tp, r)
            out.append(g[first:first + count])
    return out


def _check_routing(indices: Sequence[torch.Tensor], weights: Sequence[torch.Tensor],
                   cfg: V41Config) -> None:
    """Refuses (ValueError naming the field, source and row) routing a device would
    mis-dispatch: wrong dtype or shape, expert ids outside ``[0, n_routed)``, a token
    routed to one expert twice, non-finite route weights."""
    k, e = cfg.moe.num_experts_per_tok, cfg.moe.n_routed_experts
    if len(indices) == 0 or len(indices) != len(weights):
        raise ValueError(f"indices/weights: need one tensor per source rank each, got "
                         f"{len(indices)} and {len(weights)}")
    for s, (idx, w) in enumerate(zip(indices, weights)):
        if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"indices[{s}]: must be an INT32/INT64 torch.Tensor")
        if idx.dim() != 2 or idx.shape[1] != k:
            raise ValueError(f"indices[{s}]: shape {tuple(idx.shape)} must be [T, {k}]")
        bad = (idx < 0) | (idx >= e)
        if bool(bad.any()):
            t, j = (int(v) for v in torch.nonzero(bad)[0])
            raise ValueError(f"indices[{s}]: expert {int(idx[t, j])} at row {t} slot {j} "
                             f"outside [0, {e})")
        if idx.shape[0]:
            srt = idx.sort(dim=1).values
            dup = (srt[:, 1:] == srt[:, :-1]).any(dim=1)
            if bool(dup.any()):
                t = int(torch.nonzero(dup)[0])
                raise ValueError(f"indices[{s}]: row {t} routes to one expert twice "
                                 f"({idx[t].tolist()})")
        if not isinstance(w, torch.Tensor) or not w.is_floating_point():
            raise ValueError(f"weights[{s}]: must be a floating-point torch.Tensor")
        if tuple(w.shape) != tuple(idx.shape):
            raise ValueError(f"weights[{s}]: shape {tuple(w.shape)} must equal indices[{s}] "
                             f"shape {tuple(idx.shape)}")
        finite = torch.isfinite(w)
        if not bool(finite.all()):
            t, j = (int(v) for v in torch.nonzero(~finite)[0])
            raise ValueError(f"weights[{s}]: route weight at row {t} slot {j} is not finite")


def _check_x(xs: Sequence[torch.Tensor], indices: Sequence[torch.Tensor],
             cfg: V41Config) -> None:
    if len(xs) != len(indices):
        raise ValueError(f"x: need one batch per source rank ({len(indices)}), got {len(xs)}")
    for s, (x, idx) in enumerate(zip(xs, indices)):
        want = (idx.shape[0], cfg.hidden_size)
        if not isinstance(x, torch.Tensor) or x.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"x[{s}]: must be a BF16 (or FP32) torch.Tensor")
        if tuple(x.shape) != want:
            raise ValueError(f"x[{s}]: shape {tuple(x.shape)} must be {list(want)} "
                             f"(the rows of indices[{s}])")


# ---- the three phases ----------------------------------------------------------------------

def dispatch(indices: Sequence[torch.Tensor], weights: Sequence[torch.Tensor],
             cfg: V41Config, ep: int) -> list[Received]:
    """Phase 1: the rows every destination rank ``0 .. ep-1`` receives from the sources
    (``indices[s]`` / ``weights[s]`` of source ``s``), ordered by local expert, source,
    token (module doc).  Bad routing is refused first (:func:`_check_routing`)."""
    n_local = n_local_experts(cfg, ep)
    _check_routing(indices, weights, cfg)
    k = cfg.moe.num_experts_per_tok
    src, tok, slot, exp, wt = [], [], [], [], []
    for s, (idx, w) in enumerate(zip(indices, weights)):
        t = idx.shape[0]
        src.append(torch.full((t * k,), s, dtype=torch.int64))
        tok.append(torch.arange(t, dtype=torch.int64).repeat_interleave(k))
        slot.append(torch.arange(k, dtype=torch.int64).repeat(t))
        exp.append(idx.to(torch.int64).reshape(-1))
        wt.append(w.to(torch.float32).reshape(-1))
    src, tok, slot, exp, wt = (torch.cat(v) for v in (src, tok, slot, exp, wt))
    # (expert, source, token) ascending; each triple is unique (no repeated expert per token)
    t_max = int(tok.max()) + 1 if tok.numel() else 1
    order = torch.argsort((exp * len(indices) + src) * t_max + tok)
    src, tok, slot, exp, wt = (v[order] for v in (src, tok, slot, exp, wt))
    out = []
    for r in range(ep):
        mine = (exp >= r * n_local) & (exp < (r + 1) * n_local)
        counts = torch.bincount(exp[mine] - r * n_local, minlength=n_local)
        out.append(Received(r, src[mine], tok[mine], slot[mine], exp[mine], wt[mine], counts))
    return out


class _LocalExperts:
    """``local[j]`` = global expert ``base + j`` of a global lookup (fetched on demand)."""

    def __init__(self, experts: ExpertLookup, base: int):
        self.experts, self.base = experts, base

    def __getitem__(self, j: int) -> ExpertWeights:
        return self.experts[self.base + j]


def local_experts_of(experts: ExpertLookup, cfg: V41Config, ep: int, rank: int) -> _LocalExperts:
    """Rank ``rank``'s local expert lookup over a globally indexed ``experts``."""
    n_local = n_local_experts(cfg, ep)
    if not 0 <= rank < ep:
        raise ValueError(f"rank: {rank} outside [0, {ep})")
    return _LocalExperts(experts, rank * n_local)


def expert_outputs(received: Received, xs: Sequence[torch.Tensor], local: ExpertLookup,
                   cfg: V41Config) -> torch.Tensor:
    """Phase 2 on one destination: BF16 ``[R, D]``, row ``i`` the output of received row
    ``i``'s expert on its token (``routed_expert``, route weight before W2).  ``local[j]``
    is local expert ``j``; experts with no rows are never fetched."""
    y = torch.zeros(received.rows, cfg.hidden_size, dtype=torch.bfloat16)
    if received.rows == 0:
        return y
    sizes = torch.tensor([0] + [x.shape[0] for x in xs[:-1]], dtype=torch.int64)
    gathered = torch.cat(list(xs))[sizes.cumsum(0)[received.source] + received.token]
    start = 0
    for j, c in enumerate(received.counts.tolist()):
        if c == 0:
            continue
        rows = slice(start, start + c)
        y[rows] = routed_expert(gathered[rows], received.weight[rows], local[j], cfg)
        start += c
    return y


def combine(received: Sequence[Received], outputs: Sequence[torch.Tensor],
            indices: Sequence[torch.Tensor], shared_y: Sequence[torch.Tensor]
            ) -> list[Combined]:
    """Phase 3: every destination's ``outputs[r]`` rows return to their owners and each
    source ``s`` combines its tokens: FP32 ``routed_sum`` from zero in ascending global
    expert index, then ``[BF16](shared_y[s] + routed_sum)`` (one cast).  Raises if a route
    got no row back, or got two."""
    if len(received) != len(outputs):
        raise ValueError(f"outputs: need one tensor per destination ({len(received)}), got "
                         f"{len(outputs)}")
    if len(shared_y) != len(indices):
        raise ValueError(f"shared_y: need one tensor per source rank ({len(indices)}), got "
                         f"{len(shared_y)}")
    staged, filled = [], []
    for s, (idx, sy) in enumerate(zip(indices, shared_y)):
        t, k = idx.shape
        if sy.dim() != 2 or sy.shape[0] != t:
            raise ValueError(f"shared_y[{s}]: shape {tuple(sy.shape)} must be [{t}, D]")
        staged.append(torch.zeros(t, k, sy.shape[1], dtype=torch.bfloat16))
        filled.append(torch.zeros(t, k, dtype=torch.int64))
    for rec, y in zip(received, outputs):  # the return puts: row -> (owner, token, slot)
        if rec.rows and int(rec.source.max()) >= len(indices):
            raise ValueError(f"received[{rec.rank}]: source {int(rec.source.max())} has no "
                             f"batch (sources: {len(indices)})")
        if tuple(y.shape[:1]) != (rec.rows,):
            raise ValueError(f"outputs[{rec.rank}]: {y.shape[0]} rows, received {rec.rows}")
        for s in range(len(indices)):
            mine = rec.source == s
            tok, slot = rec.token[mine], rec.slot[mine]
            staged[s][tok, slot] = y[mine].to(torch.bfloat16)
            filled[s].index_put_((tok, slot), torch.ones_like(tok), accumulate=True)
    result = []
    for s, (idx, sy) in enumerate(zip(indices, shared_y)):
        if bool((filled[s] != 1).any()):
            t, j = (int(v) for v in torch.nonzero(filled[s] != 1)[0])
            raise ValueError(f"combine: source {s} row {t} slot {j} got "
                             f"{int(filled[s][t, j])} rows back, expected 1")
        order = torch.argsort(idx.to(torch.int64), dim=1)  # ascending global expert
        acc = torch.zeros(sy.shape, dtype=torch.float32)
        for j in range(idx.shape[1]):
            pick = order[:, j:j + 1, None].expand(-1, 1, sy.shape[1])
            acc = acc + torch.gather(staged[s], 1, pick)[:, 0].to(torch.float32)
        result.append(Combined(acc, (sy.to(torch.float32) + acc).to(torch.bfloat16)))
    return result


def moe_block_dispatch(xs: Sequence[torch.Tensor], indices: Sequence[torch.Tensor],
                       weights: Sequence[torch.Tensor], experts: ExpertLookup,
                       shared: ExpertWeights, cfg: V41Config, ep: int) -> list[Combined]:
    """The MoE sub-layer over ``ep`` ranks for source batches ``xs`` (module doc): dispatch,
    every rank's local experts, the shared expert on each source's own rows, combine.
    ``experts`` is indexed globally.  Everything is validated before any expert runs."""
    n_local_experts(cfg, ep)
    _check_routing(indices, weights, cfg)
    _check_x(xs, indices, cfg)
    received = dispatch(indices, weights, cfg, ep)
    outputs = [expert_outputs(rec, xs, local_experts_of(experts, cfg, ep, rec.rank), cfg)
               for rec in received]
    shared_y = [shared_expert(x, shared, cfg) if x.shape[0] else
                torch.zeros(0, cfg.hidden_size, dtype=torch.bfloat16) for x in xs]
    return combine(received, outputs, indices, shared_y)


__all__ = ["Received", "Combined", "n_local_experts", "source_batches", "dispatch",
           "local_experts_of", "expert_outputs", "combine", "moe_block_dispatch"]
