"""Host transports between per-rank launches of a multi-rank a5sim case.

A :class:`TpGroup` carries the TP collectives of one DP group the way the device does:
each collective has its own retained per-rank windows and a per-rank epoch counter.
Epochs are one-based and consecutive; a rank publishes its slab into its own window for
epoch ``e``, and a consumer reads only when every peer has published ``e``.  A missing
publish (a peer still at ``e - 1``) or a skipped/repeated epoch raises
:class:`TransportError`, so a stale window can never be consumed silently.

Semantics (contract, sequence-parallel boundary):
- ``all_gather``: rank slabs ``[width, D]`` -> ``[T, D]`` in rank order; only the active
  prefix is gathered, rows at or past ``active`` are zero.
- ``reduce_scatter``: FP32 partials ``[T, D]`` of every rank -> each rank's owned slab,
  summed in rank order in FP32 with one BF16 cast; inactive slab rows are zero.
- ``all_reduce``: FP32 partials summed in rank order, one BF16 cast, on every rank.
The a5 platform serves the same calls with pypto's shmem put/signal/wait.
"""

from __future__ import annotations

import torch

from goldens.config import rank_slab, slab_width


class TransportError(RuntimeError):
    """A stale window, a missing publish or an out-of-order epoch."""


class Epochs:
    """One collective's per-rank epoch counters: one-based and consecutive; a reader of
    epoch ``e`` needs every rank at ``e`` (shared by the TP and EP transports)."""

    def __init__(self, name: str, ranks: int):
        self.name, self.epoch = name, [0] * ranks

    def publish(self, rank: int, epoch: int) -> None:
        if epoch != self.epoch[rank] + 1:
            raise TransportError(f"{self.name}: rank {rank} publishes epoch {epoch}, expected "
                                 f"{self.epoch[rank] + 1} (epochs are one-based and consecutive)")
        self.epoch[rank] = epoch

    def ready(self, epoch: int) -> None:
        stale = [r for r, e in enumerate(self.epoch) if e != epoch]
        if stale:
            raise TransportError(f"{self.name}: epoch {epoch}: ranks {stale} have not published "
                                 f"(their windows hold epochs {[self.epoch[r] for r in stale]})")


class _Windows:
    def __init__(self, name: str, tp: int, rows: int, width: int, dtype: torch.dtype):
        self.name = name
        self.buf = torch.full((tp, rows, width), float("nan"), dtype=dtype)
        self.epochs = Epochs(name, tp)

    def publish(self, rank: int, epoch: int, rows: torch.Tensor) -> None:
        if rows.shape[0] > self.buf.shape[1] or rows.shape[1:] != self.buf.shape[2:]:
            raise TransportError(f"{self.name}: rank {rank} publishes {tuple(rows.shape)}, window "
                                 f"holds {tuple(self.buf.shape[1:])}")
        self.epochs.publish(rank, epoch)
        self.buf[rank, :rows.shape[0]] = rows.to(self.buf.dtype)

    def ready(self, epoch: int) -> None:
        self.epochs.ready(epoch)


class TpGroup:
    """The TP collectives of one DP group, with retained windows per collective."""

    def __init__(self, tp: int, capacity: int, hidden: int):
        self.tp, self.capacity, self.hidden = tp, capacity, hidden
        self.width = slab_width(capacity, tp)
        self.gather = _Windows("all_gather", tp, self.width, hidden, torch.bfloat16)
        self.scatter = _Windows("reduce_scatter", tp, capacity, hidden, torch.float32)
        self.reduce = _Windows("all_reduce", tp, capacity, hidden, torch.float32)

    # ---- all-gather ------------------------------------------------------
    def publish_gather(self, rank: int, epoch: int, slab: torch.Tensor) -> None:
        """Rank publishes its whole physical slab ``[width, D]`` (even when it has no
        active rows: zero-length puts are not allowed on the device)."""
        if slab.shape[0] != self.width:
            raise TransportError(f"all_gather: rank {rank} slab has {slab.shape[0]} rows, "
                                 f"expected width {self.width}")
        self.gather.publish(rank, epoch, slab)

    def all_gather(self, epoch: int, active: int) -> torch.Tensor:
        """``[capacity, D]`` BF16: the active rows of every slab in rank order, zeros after."""
        self.gather.ready(epoch)
        out = torch.zeros(self.capacity, self.hidden, dtype=torch.bfloat16)
        for r in range(self.tp):
            first, count = rank_slab(active, self.tp, r, self.capacity)
            out[first:first + count] = self.gather.buf[r, :count]
        return out

    # ---- reduce-scatter --------------------------------------------------
    def publish_partial(self, rank: int, epoch: int, partial: torch.Tensor) -> None:
        if partial.dtype != torch.float32 or partial.shape != (self.capacity, self.hidden):
            raise TransportError(f"reduce_scatter: rank {rank} partial must be float32 "
                                 f"[{self.capacity}, {self.hidden}], got {partial.dtype} "
                                 f"{tuple(partial.shape)}")
        self.scatter.publish(rank, epoch, partial)

    def reduce_scatter(self, rank: int, epoch: int, active: int) -> torch.Tensor:
        """Rank ``rank``'s slab ``[width, D]`` BF16: owned active rows summed over ranks in
        rank order in FP32, one cast; inactive slab rows are zero."""
        self.scatter.ready(epoch)
        out = torch.zeros(self.width, self.hidden, dtype=torch.bfloat16)
        first, count = rank_slab(active, self.tp, rank, self.capacity)
        acc = torch.zeros(count, self.hidden, dtype=torch.float32)
        for r in range(self.tp):
            acc += self.scatter.buf[r, first:first + count]
        out[:count] = acc.to(torch.bfloat16)
        return out

    # ---- all-reduce ------------------------------------------------------
    def publish_reduce(self, rank: int, epoch: int, partial: torch.Tensor) -> None:
        if partial.dtype != torch.float32 or partial.shape[1:] != (self.hidden,):
            raise TransportError(f"all_reduce: rank {rank} partial must be float32 [T, "
                                 f"{self.hidden}], got {partial.dtype} {tuple(partial.shape)}")
        self.reduce.publish(rank, epoch, partial)

    def all_reduce(self, epoch: int, rows: int) -> torch.Tensor:
        """``[rows, D]`` BF16: partials summed in rank order in FP32, one cast."""
        self.reduce.ready(epoch)
        acc = torch.zeros(rows, self.hidden, dtype=torch.float32)
        for r in range(self.tp):
            acc += self.reduce.buf[r, :rows]
        return acc.to(torch.bfloat16)
