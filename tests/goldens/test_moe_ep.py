"""EP MoE golden (goldens.moe_ep): dispatch order and contents, byte equality with the
single-rank moe_block for EP1/2/4/8 and one or several source ranks (DP groups x TP slabs,
empty ranks), experts without tokens, a token whose experts share one rank, refusals."""

from dataclasses import replace

import pytest
import torch

from goldens.config import TINY, with_overrides
from goldens.moe import moe_block, routed_partial
from goldens.moe_ep import (Received, combine, dispatch, expert_outputs, local_experts_of,
                            moe_block_dispatch, source_batches)
from moe_model import tiny_moe

E, D, I = TINY.moe.n_routed_experts, TINY.hidden_size, TINY.moe.intermediate_size
# k = 4: with k = 2 the FP32 sum of two rows is the same in either order (commutative), so
# only k >= 3 can tell the documented combine order from another
TINY_K4 = with_overrides(TINY, moe=replace(TINY.moe, num_experts_per_tok=4))


class Spy:
    """A global expert lookup that records every fetch."""

    def __init__(self, experts):
        self.experts, self.fetched = experts, []

    def __getitem__(self, e):
        self.fetched.append(e)
        return self.experts[e]


def _model(seed, t, cfg):
    return tiny_moe(seed, t, cfg)


@pytest.fixture(scope="module", params=[TINY, TINY_K4], ids=["k2", "k4"])
def model(request):
    cfg = request.param
    x, idx, wt, experts, shared = _model(11, 29, cfg)
    return cfg, x, idx, wt, experts, shared, moe_block(x, idx, wt, experts, shared, cfg), \
        routed_partial(x, idx, wt, experts, cfg)


# (ep, tp, DP group sizes): one source rank owning every token (tp None), or the EP world
# as ep/tp DP groups of tp TP slabs (source_batches); 24 + 5 at TP4 leaves an empty rank
LAYOUTS = [(1, None, None), (2, None, None), (4, None, None), (8, None, None),
           (2, 1, [24, 5]), (4, 2, [24, 5]), (4, 4, [29]), (8, 4, [24, 5]), (8, 8, [29]),
           (8, 2, [20, 5, 4, 0])]


@pytest.mark.parametrize("ep,tp,groups", LAYOUTS)
def test_ep_equals_moe_block_byte_for_byte(model, ep, tp, groups):
    cfg, x, idx, wt, experts, shared, block, routed = model
    if tp is None:
        xs, ids, ws = [x], [idx], [wt]
    else:
        assert sum(groups) == x.shape[0] and len(groups) * tp == ep
        xs, ids, ws = (source_batches(list(t.split(groups)), tp) for t in (x, idx, wt))
    got = moe_block_dispatch(xs, ids, ws, experts, shared, cfg, ep)
    assert [c.out.shape[0] for c in got] == [b.shape[0] for b in xs]
    out = torch.cat([c.out for c in got])
    routed_sum = torch.cat([c.routed_sum for c in got])
    assert out.dtype == torch.bfloat16 and routed_sum.dtype == torch.float32
    assert torch.equal(routed_sum, routed)
    assert torch.equal(out, block)


def test_several_layouts_have_an_empty_source_rank():
    sizes = [b.shape[0] for b in source_batches([torch.zeros(24, 1), torch.zeros(5, 1)], 4)]
    assert sizes == [6, 6, 6, 6, 2, 2, 1, 0]


def test_combine_sums_in_ascending_expert_order():
    """BF16 rows of similar size add exactly in FP32 in any order, so the order is shown with
    crafted returned rows: 2^25 + 1 rounds to 2^25 in FP32.  Slot order (experts 9, 2, 14,
    5) would give 1.5, ascending expert order (2, 5, 9, 14) gives 0.5."""
    cfg = TINY_K4
    idx = torch.tensor([[9, 2, 14, 5]], dtype=torch.int32)
    rec = dispatch([idx], [torch.ones(1, 4)], cfg, 4)
    value = {2: 2.0 ** 25, 5: 1.0, 9: -2.0 ** 25, 14: 0.5}
    outs = [torch.tensor([value[e] for e in r.expert.tolist()]).reshape(-1, 1)
            .expand(-1, D).to(torch.bfloat16) for r in rec]
    got = combine(rec, outs, [idx], [torch.zeros(1, D, dtype=torch.bfloat16)])[0]
    assert bool((got.routed_sum == 0.5).all()) and bool((got.out == 0.5).all())
    slot_order = torch.zeros((), dtype=torch.float32)
    for e in idx[0].tolist():
        slot_order = slot_order + torch.tensor(value[e], dtype=torch.float32)
    assert float(slot_order) == 1.5


def test_dispatch_order_counts_and_payload():
    cfg = TINY  # E = 16, k = 2; EP4: L = 4
    i0 = torch.tensor([[5, 1], [1, 0], [7, 4]], dtype=torch.int32)
    w0 = torch.tensor([[0.5, 0.25], [1.0, 2.0], [3.0, 4.0]])
    i1 = torch.tensor([[1, 6], [15, 12]], dtype=torch.int64)
    w1 = torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    rec = dispatch([i0, i1], [w0, w1], cfg, 4)
    assert [r.rank for r in rec] == [0, 1, 2, 3]
    r0 = rec[0]  # experts 0..3: expert 0 (s0 t1), expert 1 (s0 t0, s0 t1, s1 t0)
    assert r0.expert.tolist() == [0, 1, 1, 1]
    assert r0.source.tolist() == [0, 0, 0, 1]
    assert r0.token.tolist() == [1, 0, 1, 0]
    assert r0.slot.tolist() == [1, 1, 0, 0]
    assert r0.weight.tolist() == [2.0, 0.25, 1.0, 5.0]
    assert r0.counts.tolist() == [1, 3, 0, 0]
    r1 = rec[1]  # experts 4..7: 4 (s0 t2), 5 (s0 t0), 6 (s1 t0), 7 (s0 t2)
    assert list(zip(r1.expert.tolist(), r1.source.tolist(), r1.token.tolist())) == \
        [(4, 0, 2), (5, 0, 0), (6, 1, 0), (7, 0, 2)]
    assert r1.counts.tolist() == [1, 1, 1, 1]
    assert rec[2].rows == 0 and rec[2].counts.tolist() == [0, 0, 0, 0]  # an empty rank
    assert rec[3].expert.tolist() == [12, 15] and rec[3].weight.tolist() == [8.0, 7.0]
    assert sum(r.rows for r in rec) == 2 * (3 + 2)  # every route exactly once


def test_token_with_all_experts_on_one_rank_and_unfetched_experts():
    cfg = TINY
    x, idx, wt, experts, shared = _model(5, 6, cfg)
    idx = torch.tensor([[0, 1], [1, 0], [2, 3], [0, 3], [1, 2], [3, 0]], dtype=torch.int32)
    spy = Spy(experts)
    got = moe_block_dispatch([x[:4], x[4:]], [idx[:4], idx[4:]], [wt[:4], wt[4:]], spy,
                             shared, cfg, 4)
    assert sorted(set(spy.fetched)) == [0, 1, 2, 3]  # rank 0 only; 12 experts never fetched
    assert len(spy.fetched) == 4  # one fetch per expert with rows
    assert torch.equal(torch.cat([c.out for c in got]),
                       moe_block(x, idx, wt, experts, shared, cfg))


def test_empty_sources_and_all_empty():
    cfg = TINY
    x, idx, wt, experts, shared = _model(7, 5, cfg)
    empty = (x[:0], idx[:0], wt[:0])
    got = moe_block_dispatch([empty[0], x, empty[0]], [empty[1], idx, empty[1]],
                             [empty[2], wt, empty[2]], experts, shared, cfg, 8)
    assert [c.out.shape[0] for c in got] == [0, 5, 0]
    assert torch.equal(got[1].out, moe_block(x, idx, wt, experts, shared, cfg))
    spy = Spy(experts)
    none = moe_block_dispatch([empty[0]], [empty[1]], [empty[2]], spy, shared, cfg, 2)
    assert none[0].out.shape == (0, D) and spy.fetched == []
    assert all(r.rows == 0 for r in dispatch([empty[1]], [empty[2]], cfg, 2))


def test_combine_refuses_a_missing_return_row():
    cfg = TINY
    x, idx, wt, experts, shared = _model(3, 4, cfg)
    rec = dispatch([idx], [wt], cfg, 2)
    outs = [expert_outputs(r, [x], local_experts_of(experts, cfg, 2, r.rank), cfg) for r in rec]
    r = rec[0]
    short = Received(r.rank, r.source[1:], r.token[1:], r.slot[1:], r.expert[1:], r.weight[1:],
                     r.counts)
    with pytest.raises(ValueError, match=rf"combine: source 0 row {int(r.token[0])} slot "
                                         rf"{int(r.slot[0])} got 0 rows back"):
        combine([short, rec[1]], [outs[0][1:], outs[1]], [idx], [torch.zeros(4, D)])


def _bad(idx=None, wt=None, xs=None, ep=4):
    x, i, w, experts, shared = _model(9, 4, TINY)
    return ([x] if xs is None else xs, [i if idx is None else idx], [w if wt is None else wt],
            experts, shared, ep)


@pytest.mark.parametrize("case,match", [
    (dict(ep=3), r"ep: 3 must be a positive divisor of n_routed_experts 16"),
    (dict(ep=0), r"ep: 0 must be a positive divisor"),
    (dict(ep=32), r"ep: 32 must be a positive divisor"),
    (dict(idx=torch.tensor([[0, 1], [2, 16], [3, 4], [5, 6]], dtype=torch.int32)),
     r"indices\[0\]: expert 16 at row 1 slot 1 outside \[0, 16\)"),
    (dict(idx=torch.tensor([[0, 1], [2, 3], [-1, 4], [5, 6]], dtype=torch.int32)),
     r"indices\[0\]: expert -1 at row 2 slot 0 outside \[0, 16\)"),
    (dict(idx=torch.tensor([[0, 1], [2, 3], [4, 4], [5, 6]], dtype=torch.int32)),
     r"indices\[0\]: row 2 routes to one expert twice \(\[4, 4\]\)"),
    (dict(idx=torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)),
     r"weights\[0\]: shape \(4, 2\) must equal indices\[0\] shape \(3, 2\)"),
    (dict(idx=torch.zeros(4, 3, dtype=torch.int32)),
     r"indices\[0\]: shape \(4, 3\) must be \[T, 2\]"),
    (dict(idx=torch.zeros(4, 2)), r"indices\[0\]: must be an INT32/INT64"),
    (dict(wt=torch.tensor([[0.5, 0.5], [0.5, float("nan")], [1.0, 1.0], [1.0, 1.0]])),
     r"weights\[0\]: route weight at row 1 slot 1 is not finite"),
    (dict(wt=torch.tensor([[0.5, 0.5], [0.5, 0.5], [float("inf"), 1.0], [1.0, 1.0]])),
     r"weights\[0\]: route weight at row 2 slot 0 is not finite"),
    (dict(xs=[torch.zeros(3, D, dtype=torch.bfloat16)]),
     r"x\[0\]: shape \(3, 256\) must be \[4, 256\]"),
    (dict(xs=[]), r"x: need one batch per source rank \(1\), got 0"),
])
def test_refusals_name_the_field_before_any_expert_runs(case, match):
    xs, ids, ws, experts, shared, ep = _bad(**case)
    spy = Spy(experts)
    with pytest.raises(ValueError, match=match):
        moe_block_dispatch(xs, ids, ws, spy, shared, TINY, ep)
    assert spy.fetched == []


def test_dispatch_refuses_mismatched_source_lists():
    i = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"indices/weights: need one tensor per source rank"):
        dispatch([i, i], [torch.zeros(2, 2)], TINY, 2)
    with pytest.raises(ValueError, match=r"ep: 5 must be a positive divisor"):
        dispatch([i], [torch.zeros(2, 2)], TINY, 5)
