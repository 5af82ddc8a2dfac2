"""Host transport of expert parallelism: EP dispatch and combine between the per-rank launches
of a multi-rank a5sim case (the device does the same with shmem puts and signals).

An EP world of ``ep`` ranks (DP groups x TP, ``rank = dp_group * tp + tp_rank``); rank ``r``
owns the ``L = n_routed / ep`` contiguous experts ``[r*L, (r+1)*L)`` and a token batch of
its own (at most ``capacity`` rows, the first ``active`` of them valid).  Like
:class:`harness.transport.TpGroup`, each collective has retained per-rank windows and
one-based consecutive epochs: a rank publishes epoch ``e`` into its own window, a reader
reads only when every peer has published ``e``; a missing publish or a skipped or repeated
epoch raises :class:`TransportError`.  The transport moves bytes only: no arithmetic.

* dispatch: source rank ``s`` publishes its rows ``x [active_s, D]`` BF16 with their Top-K
  ``indices [active_s, k]`` INT32 and route ``weights [active_s, k]`` FP32.  Destination
  rank ``d`` receives every (token, slot) pair whose expert it owns, ordered by local
  expert ascending, then source rank ascending, then token ascending: the rows, their
  route weights, their origin ``(source rank, token, slot, global expert)`` and
  ``expert_offsets [L + 1]`` (local expert ``j``'s rows are ``offsets[j] .. offsets[j+1]``).
* combine: destination rank ``d`` publishes its expert outputs ``y [N_d, D]`` BF16 in the
  order it received them; source rank ``s`` gets ``[capacity, k, D]`` BF16, row ``t`` holding
  its token ``t``'s ``k`` expert outputs ordered by ascending global expert index (the
  golden's accumulation order), and ``experts [capacity, k]`` INT32 in that order; rows at or
  past ``active_s`` are zero with expert ``-1``.  The FP32 sum is the combine kernel's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.transport import Epochs, TransportError

_I32 = torch.int32


@dataclass(frozen=True)
class Received:
    """What a destination rank receives from dispatch (see the module doc)."""

    x: torch.Tensor  # BF16 [N, D]
    weights: torch.Tensor  # FP32 [N]
    origin: torch.Tensor  # INT32 [N, 4]: source rank, token, slot, global expert
    expert_offsets: torch.Tensor  # INT32 [L + 1]


class EpGroup:
    """EP dispatch and combine of one EP world, with retained windows per collective."""

    def __init__(self, ep: int, n_routed: int, top_k: int, capacity: int, hidden: int):
        if ep < 1 or n_routed % ep:
            raise ValueError(f"ep: {ep} must be >= 1 and divide n_routed_experts {n_routed}")
        self.ep, self.n_local, self.k = ep, n_routed // ep, top_k
        self.capacity, self.hidden = capacity, hidden
        self._dispatch = Epochs("ep_dispatch", ep)
        self._combine = Epochs("ep_combine", ep)
        self._sent: list = [None] * ep  # dispatch windows: (x, indices, weights) per source
        self._back: list = [None] * ep  # combine windows: y per destination
        self._received: list = [None] * ep  # what each destination was sent (its row order)

    # ---- dispatch --------------------------------------------------------
    def publish_dispatch(self, rank: int, epoch: int, x: torch.Tensor, indices: torch.Tensor,
                         weights: torch.Tensor) -> None:
        """Source ``rank`` publishes its active rows, their Top-K indices and route weights."""
        n = x.shape[0]
        if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != self.hidden or n > self.capacity:
            raise TransportError(f"ep_dispatch: rank {rank} x must be bfloat16 [<= {self.capacity}, "
                                 f"{self.hidden}], got {x.dtype} {tuple(x.shape)}")
        if indices.dtype != _I32 or tuple(indices.shape) != (n, self.k):
            raise TransportError(f"ep_dispatch: rank {rank} indices must be int32 [{n}, {self.k}], "
                                 f"got {indices.dtype} {tuple(indices.shape)}")
        if weights.dtype != torch.float32 or tuple(weights.shape) != (n, self.k):
            raise TransportError(f"ep_dispatch: rank {rank} weights must be float32 [{n}, {self.k}], "
                                 f"got {weights.dtype} {tuple(weights.shape)}")
        top = self.ep * self.n_local
        if n and (int(indices.min()) < 0 or int(indices.max()) >= top):
            raise TransportError(f"ep_dispatch: rank {rank} indices must lie in [0, {top})")
        self._dispatch.publish(rank, epoch)
        self._sent[rank] = (x.clone(), indices.clone(), weights.clone())

    def receive(self, rank: int, epoch: int) -> Received:
        """Destination ``rank``'s rows in (local expert, source rank, token) order."""
        self._dispatch.ready(epoch)
        first = rank * self.n_local
        rows, wts, origin, offsets = [], [], [], [0]
        for j in range(self.n_local):
            for s, (x, idx, w) in enumerate(self._sent):
                tok, slot = torch.nonzero(idx == first + j, as_tuple=True)  # token ascending
                rows.append(x[tok])
                wts.append(w[tok, slot])
                origin.append(torch.stack([torch.full_like(tok, s), tok, slot,
                                           torch.full_like(tok, first + j)], 1))
            offsets.append(sum(r.shape[0] for r in rows))
        got = Received(torch.cat(rows) if rows else torch.zeros(0, self.hidden, dtype=torch.bfloat16),
                       torch.cat(wts) if wts else torch.zeros(0),
                       torch.cat(origin).to(_I32) if origin else torch.zeros(0, 4, dtype=_I32),
                       torch.tensor(offsets, dtype=_I32))
        self._received[rank] = got
        return got

    # ---- combine ---------------------------------------------------------
    def publish_combine(self, rank: int, epoch: int, y: torch.Tensor) -> None:
        """Destination ``rank`` returns one BF16 row per row it received, in that order."""
        got = self._received[rank]
        if got is None:
            raise TransportError(f"ep_combine: rank {rank} publishes before it received a dispatch")
        n = got.x.shape[0]
        if y.dtype != torch.bfloat16 or tuple(y.shape) != (n, self.hidden):
            raise TransportError(f"ep_combine: rank {rank} y must be bfloat16 [{n}, {self.hidden}] "
                                 f"(one row per received row), got {y.dtype} {tuple(y.shape)}")
        self._combine.publish(rank, epoch)
        self._back[rank] = y.clone()

    def collect(self, rank: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Source ``rank``'s ``([capacity, k, D] BF16, [capacity, k] INT32 experts)``: each of
        its tokens' expert outputs in ascending global expert order; unused rows zero / -1."""
        self._combine.ready(epoch)
        out = torch.zeros(self.capacity, self.k, self.hidden, dtype=torch.bfloat16)
        experts = torch.full((self.capacity, self.k), -1, dtype=_I32)
        _, idx, _ = self._sent[rank]
        order = torch.sort(idx.to(torch.int64), dim=1, stable=True).values  # ascending expert
        pos = {}
        for t, row in enumerate(order.tolist()):
            for c, e in enumerate(row):
                pos[(t, e)] = c
                experts[t, c] = e
        for d in range(self.ep):
            got, y = self._received[d], self._back[d]
            for i, (s, t, _slot, e) in enumerate(got.origin.tolist()):
                if s == rank:
                    out[t, pos[(t, e)]] = y[i]
        return out, experts
