"""EP dispatch and combine on the host: who receives which rows in which order, every row
back at its owner in ascending-expert order, and the epoch and window checks."""

import pytest
import torch

from harness.ep_transport import EpGroup
from harness.transport import TransportError

D, K = 8, 3


def _routing(n, n_routed, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(n_routed, generator=g)[:K] for _ in range(n)]) if n else \
        torch.zeros(0, K, dtype=torch.int64)
    return idx.to(torch.int32), torch.rand(n, K, generator=g)


def _world(ep, n_routed, counts, seed=0):
    grp = EpGroup(ep, n_routed, K, capacity=max(counts + [1]), hidden=D)
    batches = []
    for s, n in enumerate(counts):
        # row t of rank s carries its identity in column 0 (exact in BF16)
        x = torch.zeros(n, D, dtype=torch.bfloat16)
        x[:, 0] = torch.arange(n) + 10 * s
        idx, w = _routing(n, n_routed, seed + s)
        batches.append((x, idx, w))
    return grp, batches


@pytest.mark.parametrize("ep,n_routed,counts", [(2, 8, [5, 3]), (4, 8, [4, 0, 6, 1]),
                                                (8, 16, [3, 1, 0, 2, 5, 1, 1, 4]), (1, 8, [6])])
def test_dispatch_order_and_combine_round_trip(ep, n_routed, counts):
    grp, batches = _world(ep, n_routed, counts)
    for s, (x, idx, w) in enumerate(batches):
        grp.publish_dispatch(s, 1, x, idx, w)
    L = n_routed // ep
    for d in range(ep):
        got = grp.receive(d, 1)
        origin = got.origin.tolist()
        # every (token, slot) pair of an owned expert arrives exactly once, in order
        expect = [(s, t, c, d * L + j) for j in range(L) for s, (_, idx, _) in enumerate(batches)
                  for t in range(idx.shape[0]) for c in range(K) if int(idx[t, c]) == d * L + j]
        assert [tuple(o) for o in origin] == expect
        assert got.expert_offsets.tolist() == [0] + [
            sum(1 for o in expect if o[3] < d * L + j + 1) for j in range(L)]
        for i, (s, t, c, _) in enumerate(origin):
            assert float(got.x[i, 0]) == 10 * s + t
            assert float(got.weights[i]) == float(batches[s][2][t, c])
        # the "expert" answers with the row's identity plus its expert id in column 1
        y = got.x.clone()
        y[:, 1] = got.origin[:, 3].to(torch.bfloat16)
        grp.publish_combine(d, 1, y)
    for s, (x, idx, _) in enumerate(batches):
        rows, experts = grp.collect(s, 1)
        n = x.shape[0]
        assert experts[:n].tolist() == torch.sort(idx.to(torch.int64), 1).values.tolist()
        assert bool((rows[:n, :, 0] == x[:, :1].float()).all())  # every row came back home
        assert bool((rows[:n, :, 1].float() == experts[:n].float()).all())  # in expert order
        assert torch.count_nonzero(rows[n:]) == 0 and bool((experts[n:] == -1).all())


def test_a_rank_that_owns_no_routed_row_receives_nothing_and_returns_nothing():
    grp = EpGroup(2, 4, 2, capacity=2, hidden=D)
    idx = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)  # only rank 0's experts
    grp.publish_dispatch(0, 1, torch.ones(2, D, dtype=torch.bfloat16), idx, torch.ones(2, 2))
    grp.publish_dispatch(1, 1, torch.zeros(0, D, dtype=torch.bfloat16),
                         torch.zeros(0, 2, dtype=torch.int32), torch.zeros(0, 2))
    assert grp.receive(1, 1).x.shape[0] == 0
    assert grp.receive(0, 1).expert_offsets.tolist() == [0, 2, 4]
    grp.publish_combine(1, 1, torch.zeros(0, D, dtype=torch.bfloat16))
    grp.publish_combine(0, 1, torch.ones(4, D, dtype=torch.bfloat16))
    rows, experts = grp.collect(0, 1)
    assert experts.tolist() == [[0, 1], [0, 1]] and bool((rows == 1).all())


def test_stale_windows_and_out_of_order_epochs_raise():
    grp, batches = _world(2, 8, [2, 2])
    grp.publish_dispatch(0, 1, *batches[0])
    with pytest.raises(TransportError, match=r"ep_dispatch: epoch 1: ranks \[1\] have not published"):
        grp.receive(0, 1)
    with pytest.raises(TransportError, match="publishes epoch 3, expected 2"):
        grp.publish_dispatch(0, 3, *batches[0])
    with pytest.raises(TransportError, match="publishes epoch 1, expected 2"):
        grp.publish_dispatch(0, 1, *batches[0])
    grp.publish_dispatch(1, 1, *batches[1])
    got = grp.receive(0, 1)
    grp.publish_combine(0, 1, got.x)
    with pytest.raises(TransportError, match=r"ep_combine: epoch 1: ranks \[1\] have not published"):
        grp.collect(0, 1)
    with pytest.raises(TransportError, match="publishes before it received"):
        grp.publish_combine(1, 1, got.x)


def test_bad_payloads_are_refused_naming_the_field():
    grp = EpGroup(2, 8, K, capacity=4, hidden=D)
    x, idx, w = torch.zeros(2, D, dtype=torch.bfloat16), torch.zeros(2, K, dtype=torch.int32), torch.zeros(2, K)
    with pytest.raises(TransportError, match="x must be bfloat16"):
        grp.publish_dispatch(0, 1, x.float(), idx, w)
    with pytest.raises(TransportError, match="indices must be int32"):
        grp.publish_dispatch(0, 1, x, idx.long(), w)
    with pytest.raises(TransportError, match=r"indices must lie in \[0, 8\)"):
        grp.publish_dispatch(0, 1, x, idx + 8, w)
    with pytest.raises(TransportError, match="x must be bfloat16 \\[<= 4"):
        grp.publish_dispatch(0, 1, torch.zeros(5, D, dtype=torch.bfloat16), idx, w)
    with pytest.raises(ValueError, match="ep: 3 must be >= 1 and divide n_routed_experts 8"):
        EpGroup(3, 8, K, 4, D)
