"""Host transports: slab semantics, rank-order FP32 sums, epoch and window checks."""

import pytest
import torch

from goldens.config import rank_slab
from harness.transport import TpGroup, TransportError


def _partials(tp, cap, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(cap, d, generator=g) for _ in range(tp)]


@pytest.mark.parametrize("tp,cap,active", [(4, 2, 2), (4, 5, 5), (4, 33, 31), (4, 32, 24),
                                           (2, 7, 0), (8, 192, 190), (1, 3, 3)])
def test_gather_and_scatter_follow_the_slab_contract(tp, cap, active):
    d = 16
    grp = TpGroup(tp, cap, d)
    full = torch.randn(cap, d).bfloat16()
    for r in range(tp):
        first, count = rank_slab(active, tp, r, cap)
        slab = torch.full((grp.width, d), 99.0).bfloat16()  # padding rows hold junk
        slab[:count] = full[first:first + count]
        grp.publish_gather(r, 1, slab)
    gathered = grp.all_gather(1, active)
    assert torch.equal(gathered[:active], full[:active])
    assert torch.count_nonzero(gathered[active:]) == 0

    parts = _partials(tp, cap, d)
    for r in range(tp):
        grp.publish_partial(r, 1, parts[r])
    expect = torch.zeros(cap, d)
    for p in parts:  # rank order
        expect += p
    expect = expect.bfloat16()
    for r in range(tp):
        out = grp.reduce_scatter(r, 1, active)
        first, count = rank_slab(active, tp, r, cap)
        assert torch.equal(out[:count], expect[first:first + count])
        assert torch.count_nonzero(out[count:]) == 0  # inactive rows zero


def test_all_reduce_sums_in_rank_order_with_one_cast():
    tp, d = 4, 8
    grp = TpGroup(tp, 3, d)
    parts = [torch.full((3, d), v) for v in (1.0, 2.0 ** -9, 2.0 ** -9, -1.0)]
    for r in range(tp):
        grp.publish_reduce(r, 1, parts[r])
    out = grp.all_reduce(1, 3)
    # FP32 rank-order sum keeps 2^-8; per-rank BF16 casts or pairwise BF16 would not
    assert torch.equal(out, torch.full((3, d), 2.0 ** -8).bfloat16())


def test_missing_publish_is_a_stale_window():
    grp = TpGroup(4, 8, 4)
    for r in (0, 1, 3):
        grp.publish_gather(r, 1, torch.zeros(2, 4).bfloat16())
    with pytest.raises(TransportError, match=r"ranks \[2\] have not published"):
        grp.all_gather(1, 8)


def test_epochs_are_one_based_and_consecutive():
    grp = TpGroup(2, 4, 4)
    with pytest.raises(TransportError, match="expected 1"):
        grp.publish_partial(0, 0, torch.zeros(4, 4))
    grp.publish_partial(0, 1, torch.zeros(4, 4))
    with pytest.raises(TransportError, match="publishes epoch 3, expected 2"):
        grp.publish_partial(0, 3, torch.zeros(4, 4))
    grp.publish_partial(1, 1, torch.zeros(4, 4))
    grp.publish_partial(0, 2, torch.zeros(4, 4))  # rank 0 moved on: epoch 1 is gone
    with pytest.raises(TransportError, match=r"ranks \[0\]"):
        grp.reduce_scatter(1, 1, 4)


def test_window_shape_and_dtype_checked():
    grp = TpGroup(4, 5, 4)
    with pytest.raises(TransportError, match="expected width 2"):
        grp.publish_gather(0, 1, torch.zeros(1, 4).bfloat16())
    with pytest.raises(TransportError, match="must be float32"):
        grp.publish_partial(0, 1, torch.zeros(5, 4).bfloat16())
