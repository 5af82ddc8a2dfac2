"""Boundary golden: embedding lanes, final norm, TP vocab sharding, greedy tie rule, -1 rows."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from goldens.boundary import (boundary_forward, embed, final_norm, gather_logit_rows, greedy_sample,
                              lm_head, lm_head_shard, vocab_shard)
from goldens.config import TINY

V, D, HC = TINY.vocab_size, TINY.hidden_size, TINY.hc.hc_mult


def _weights(seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(V, D, generator=gen).to(torch.bfloat16),
            (1 + 0.1 * torch.randn(D, generator=gen)).to(torch.bfloat16),
            torch.randn(V, D, generator=gen) * 0.05)


def test_embed_replicates_rows_over_lanes_and_pads_with_zero():
    emb, _, _ = _weights(0)
    ids = torch.tensor([5, -1, 0, V - 1], dtype=torch.int32)
    x = embed(ids, emb, TINY)
    assert x.dtype == torch.float32 and x.shape == (4, HC, D)
    for t, i in enumerate(ids.tolist()):
        want = torch.zeros(D) if i < 0 else emb[i].float()
        for h in range(HC):
            assert torch.equal(x[t, h], want)
    with pytest.raises(ValueError, match="token_ids"):
        embed(torch.tensor([V]), emb, TINY)


def test_final_norm_formula():
    _, w, _ = _weights(1)
    x = torch.randn(3, D).to(torch.bfloat16)
    got = final_norm(x, w, TINY)
    xd = x.double()
    ref = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + TINY.rms_norm_eps) * w.double()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), ref.to(torch.bfloat16).double(), rtol=8e-3, atol=0)
    assert torch.equal(final_norm(torch.zeros(1, D), w, TINY), torch.zeros(1, D, dtype=torch.bfloat16))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_vocab_shards_reassemble_the_same_logits(tp):
    _, _, head = _weights(2)
    hidden = torch.randn(5, D).to(torch.bfloat16)
    ref = hidden.double() @ head.double().T
    got = lm_head(hidden, head, TINY, tp)
    assert got.dtype == torch.float32 and got.shape == (5, V)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, lm_head(hidden, head, TINY, 1))
    n = V // tp
    for r in range(tp):
        assert torch.equal(vocab_shard(head, TINY, tp, r), head[r * n:(r + 1) * n])
        assert torch.equal(got[:, r * n:(r + 1) * n],
                           lm_head_shard(hidden, vocab_shard(head, TINY, tp, r)))
    # reassembling in the wrong order is detectable
    if tp > 1:
        shards = [lm_head_shard(hidden, vocab_shard(head, TINY, tp, r)) for r in range(tp)]
        assert not torch.equal(got, torch.cat(shards[::-1], -1))


def test_greedy_sample_lowest_index_tie():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0],
                           [5.0, 5.0, 5.0, 5.0],
                           [-1.0, -2.0, -3.0, -1.0],
                           [0.0, 0.0, float("inf"), float("inf")]])
    ids = greedy_sample(logits)
    assert ids.dtype == torch.int32
    assert ids.tolist() == [1, 0, 0, 2]
    with pytest.raises(ValueError, match="NaN"):
        greedy_sample(torch.tensor([[0.0, float("nan")]]))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=40))
def test_greedy_sample_matches_first_maximum(values):
    logits = torch.tensor([values], dtype=torch.float32)
    assert int(greedy_sample(logits)[0]) == values.index(max(values))


def test_minus_one_rows_give_zero_hidden_and_zero_logits():
    _, _, head = _weights(3)
    hidden = torch.randn(4, D).to(torch.bfloat16)
    rows = torch.tensor([2, -1, 0, -1], dtype=torch.int32)
    g = gather_logit_rows(hidden, rows)
    assert torch.equal(g[0], hidden[2]) and torch.equal(g[2], hidden[0])
    assert bool((g[1] == 0).all()) and bool((g[3] == 0).all())
    logits = lm_head(g, head, TINY, 2)
    assert bool((logits[1] == 0).all()) and bool((logits[3] == 0).all())
    assert greedy_sample(logits)[1].item() == 0  # all-equal row: lowest index


def test_boundary_forward_skips_backbone_through_lane_zero():
    emb, w, head = _weights(4)
    ids = torch.tensor([7, 100, 3], dtype=torch.int32)
    logits, out = boundary_forward(ids, emb, w, head, TINY, tp=4,
                                   logit_rows=torch.tensor([2, -1], dtype=torch.int32))
    # one-hot lane-0 collapse of replicated rows is the embedding row itself
    hidden = final_norm(emb[ids.long()], w, TINY)
    ref = lm_head(gather_logit_rows(hidden, torch.tensor([2, -1], dtype=torch.int32)), head, TINY)
    assert torch.equal(logits, ref)
    assert out.tolist() == [int(ref[0].argmax()), 0]
