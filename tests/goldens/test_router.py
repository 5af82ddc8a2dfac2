"""Router golden: sqrt-softplus formula, bias selects but does not weight, tie rule, scaling."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from goldens.config import TINY, with_overrides
from goldens.router import gate_scores, route, select_experts, softplus

E = TINY.moe.n_routed_experts
K = TINY.moe.num_experts_per_tok
D = TINY.hidden_size


def _inputs(seed, t=6):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, D, generator=gen).to(torch.bfloat16)
    w = torch.randn(E, D, generator=gen) * 0.05
    return x, w


def test_softplus_formula_and_no_overflow():
    x = torch.tensor([-100.0, -10.0, -1.0, 0.0, 1.0, 10.0, 100.0])
    ref = torch.tensor([math.log1p(math.exp(v)) if v < 50 else v for v in x.tolist()],
                       dtype=torch.float64)
    torch.testing.assert_close(softplus(x).double(), ref, rtol=1e-6, atol=1e-30)
    assert softplus(torch.tensor([1e4])).item() == 1e4


def test_gate_scores_are_sqrt_softplus_of_fp32_logits():
    x, w = _inputs(0, t=3)
    s = gate_scores(x, w, TINY)
    assert s.dtype == torch.float32 and s.shape == (3, E)
    for t in range(3):
        for e in range(E):
            logit = float((x[t].double() * w[e].double()).sum())
            ref = math.sqrt(math.log1p(math.exp(logit)))
            assert math.isclose(float(s[t, e]), ref, rel_tol=1e-5)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_weights_normalized_times_scaling_factor(seed):
    x, w = _inputs(seed)
    idx, wt = route(x, w, torch.zeros(E), TINY)
    assert idx.dtype == torch.int32 and idx.shape == (6, K)
    assert wt.dtype == torch.float32 and wt.shape == (6, K)
    torch.testing.assert_close(wt.sum(-1).double(), torch.full((6,), 1.5, dtype=torch.float64),
                               rtol=0, atol=1e-6)
    # distinct experts, sorted by score descending, and exactly the top-k of s
    s = gate_scores(x, w, TINY)
    for t in range(6):
        chosen = idx[t].tolist()
        assert len(set(chosen)) == K
        rest = [e for e in range(E) if e not in chosen]
        assert min(s[t, chosen].tolist()) >= max(s[t, rest].tolist())
        sel = s[t, idx[t].long()].double()
        torch.testing.assert_close(wt[t].double(), sel / (sel.sum() + 1e-20) * 1.5,
                                   rtol=1e-6, atol=0)


def test_bias_changes_selection_but_not_weight_values():
    x, w = _inputs(5)
    s = gate_scores(x, w, TINY)
    idx0, wt0 = route(x, w, torch.zeros(E), TINY)
    # push a never-selected expert of row 0 to the top via the bias only
    loser = int(s[0].argmin())
    bias = torch.zeros(E)
    bias[loser] = 100.0
    idx1, wt1 = route(x, w, bias, TINY)
    assert loser not in idx0[0].tolist() and int(idx1[0, 0]) == loser
    # its weight uses the UNBIASED score
    sel = s[0, idx1[0].long()].double()
    torch.testing.assert_close(wt1[0].double(), sel / (sel.sum() + 1e-20) * 1.5, rtol=1e-6, atol=0)
    assert float(wt1[0, 0]) < float(wt1[0, 1:].min())
    # a uniform bias moves nothing
    idx2, wt2 = route(x, w, torch.full((E,), 3.0), TINY)
    assert torch.equal(idx2, idx0) and torch.equal(wt2, wt0)


def test_tie_rule_lower_expert_index_first():
    # zero input makes every logit 0, so every score is sqrt(ln 2): a full tie
    x = torch.zeros(2, D, dtype=torch.bfloat16)
    w = torch.randn(E, D)
    idx, wt = route(x, w, torch.zeros(E), TINY)
    assert idx.tolist() == [list(range(K))] * 2
    torch.testing.assert_close(wt, torch.full((2, K), 1.5 / K), rtol=1e-6, atol=0)
    # crafted equal biased scores among otherwise-lower experts: 3, 9 and 12 tie at the top
    bias = torch.zeros(E)
    bias[[12, 3, 9]] = 1.0
    idx, _ = route(x, w, bias, TINY)
    assert idx[0].tolist() == [3, 9][:K]
    biased = torch.tensor([[0.5, 2.0, 2.0, 1.0, 2.0, 2.0]])
    assert select_experts(biased, 3).tolist() == [[1, 2, 4]]
    # FLASH width: 128 experts tie at the top (every third one); the lowest six win, in order
    wide = torch.zeros(2, 384)
    wide[:, ::3] = 1.0
    assert select_experts(wide, 6).tolist() == [[0, 3, 6, 9, 12, 15]] * 2


def test_inactive_rows_get_index_zero_weight_zero():
    x, w = _inputs(7)
    idx, wt = route(x, w, torch.zeros(E), TINY, num_active=4)
    full_idx, full_wt = route(x, w, torch.zeros(E), TINY)
    assert torch.equal(idx[:4], full_idx[:4]) and torch.equal(wt[:4], full_wt[:4])
    assert bool((idx[4:] == 0).all()) and bool((wt[4:] == 0).all())


def test_no_normalization_when_disabled():
    cfg = with_overrides(TINY, moe=TINY.moe.__class__(n_routed_experts=E, num_experts_per_tok=K,
                                                       intermediate_size=64, norm_topk_prob=False))
    x, w = _inputs(8)
    idx, wt = route(x, w, torch.zeros(E), cfg)
    s = gate_scores(x, w, cfg)
    torch.testing.assert_close(wt, s.gather(-1, idx.long()) * 1.5, rtol=0, atol=0)


def test_errors_name_the_argument():
    x, w = _inputs(0)
    with pytest.raises(ValueError, match="correction_bias"):
        route(x, w, torch.zeros(E + 1), TINY)
    with pytest.raises(ValueError, match="gate_weight"):
        route(x, w[:-1], torch.zeros(E), TINY)
    with pytest.raises(ValueError, match="biased"):
        select_experts(torch.tensor([[float("nan"), 1.0]]), 1)
