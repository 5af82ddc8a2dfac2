"""harness.compare.topk: Top-K acceptance (eligibility, uniqueness, order, padding, cutoff)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare.topk import check_topk

PAGE, K, W = 4, 6, 16
TABLE = torch.tensor([[5, 2, 7, -1], [1, 6, 3, 0]])  # nonidentity pages; row = table*PAGE + k%PAGE
T2R = torch.tensor([0, 0, 0, 1, 1, 1])
VIS = torch.tensor([9, 10, 11, 14, 16, 3])


def _scores(seed=0):
    """Distinct scores 0.5 apart, so any real swap is far outside the cutoff tolerance."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(W, generator=g).float() * 0.5 - 3.0 for _ in range(len(T2R))])


def _phys(t, k):
    return int(TABLE[T2R[t], k // PAGE]) * PAGE + k % PAGE


def _nominal(scores, cand=None):
    """Independent reference: top-K of eligible finite scores, ascending logical, -1 padded."""
    out = torch.full((len(T2R), K), -1, dtype=torch.int32)
    for t in range(len(T2R)):
        s = scores[t].clone()
        s[int(VIS[t]):] = -math.inf
        if cand is not None:
            s[~cand[t]] = -math.inf
        n = min(K, int(torch.isfinite(s).sum()))
        picks = sorted(torch.topk(s, n).indices.tolist())
        out[t, :n] = torch.tensor([_phys(t, k) for k in picks], dtype=torch.int32)
    return out


def _logical(t, rows):
    return [next(k for k in range(W) if _phys(t, k) == p) for p in rows if p >= 0]


def _run(actual, ref, scores, **kw):
    res = check_topk("topk_rows", actual, ref, scores, VIS, TABLE, T2R, page_size=PAGE, **kw)
    return res, {v.check: v for v in res.verdicts}


def _assert_only_failure(v, check, row):
    assert not v[check].passed and v[check].row == row and row in v[check].failing_rows
    assert v[check].bound == 0


def test_nominal_selection_passes_and_does_not_differ():
    scores = _scores()
    ref = _nominal(scores)
    res, v = _run(ref.clone(), ref, scores)
    assert res.passed and not res.differs and res.differing_tokens == ()
    assert list(v) == ["topk_padding", "topk_eligible", "topk_unique", "topk_order", "topk_count", "topk_cutoff"]
    assert (ref[5] == -1).sum() == K - 3  # token 5 sees only 3 positions: trailing padding is legal


def test_duplicate_fails_uniqueness():
    scores = _scores()
    ref = _nominal(scores)
    actual = ref.clone()
    actual[1, 2] = actual[1, 1]
    _, v = _run(actual, ref, scores)
    _assert_only_failure(v, "topk_unique", 1)
    assert v["topk_unique"].measured == 1


def test_mid_list_padding_fails():
    scores = _scores()
    ref = _nominal(scores)
    actual = ref.clone()
    actual[0, 2] = -1
    _, v = _run(actual, ref, scores)
    _assert_only_failure(v, "topk_padding", 0)
    _assert_only_failure(v, "topk_count", 0)
    actual = ref.clone()
    actual[3, 5] = -7
    _, v = _run(actual, ref, scores)
    _assert_only_failure(v, "topk_padding", 3)


def test_descending_order_fails():
    scores = _scores()
    ref = _nominal(scores)
    actual = ref.clone()
    actual[3] = ref[3].flip(0)
    res, v = _run(actual, ref, scores)
    _assert_only_failure(v, "topk_order", 3)
    assert v["topk_order"].measured == K - 1 and not res.differs  # same set, wrong order


def test_out_of_window_position_fails_eligibility():
    scores = _scores()
    scores[0, 10] = 100.0  # attractive but beyond token 0's visible length 9
    ref = _nominal(scores)
    actual = ref.clone()
    actual[0, K - 1] = _phys(0, 10)
    _, v = _run(actual, ref, scores)
    _assert_only_failure(v, "topk_eligible", 0)


@pytest.mark.parametrize("kind", ["candidate_mask", "minus_inf_score", "unmapped_row"])
def test_other_ineligible_rows_fail(kind):
    scores = _scores()
    cand = torch.ones(len(T2R), W, dtype=torch.bool)
    cand[4, 15] = False
    scores[4, 15] = 100.0
    ref = _nominal(scores, cand)
    actual = ref.clone()
    if kind == "candidate_mask":
        actual[4, K - 1] = _phys(4, 15)
    elif kind == "minus_inf_score":
        scores[4, 0] = -math.inf
        ref = _nominal(scores, cand)
        actual = ref.clone()
        actual[4, 0] = _phys(4, 0)
    else:
        actual[4, K - 1] = 4 * PAGE + 1  # physical page 4 is in no table
    _, v = _run(actual, ref, scores, candidate_mask=cand)
    _assert_only_failure(v, "topk_eligible", 4)


def test_worse_cutoff_fails_with_the_contract_bound():
    scores = _scores()
    ref = _nominal(scores)
    t = 2
    chosen = _logical(t, ref[t].tolist())
    kth = min(chosen, key=lambda k: scores[t, k])
    spare = max((k for k in range(int(VIS[t])) if k not in chosen), key=lambda k: scores[t, k])
    actual = ref.clone()
    actual[t] = torch.tensor([_phys(t, k) for k in sorted(set(chosen) - {kth} | {spare})])
    res, v = _run(actual, ref, scores)
    cut = v["topk_cutoff"]
    missing, repl = float(scores[t, kth]), float(scores[t, spare])
    assert not cut.passed and cut.row == t and cut.failing_rows == (t,)
    assert cut.measured == pytest.approx(missing - repl)
    assert cut.bound == pytest.approx(5e-5 + 1.5e-2 * abs(missing))
    assert res.differs and res.differing_tokens == (t,)
    assert all(v[c].passed for c in v if c != "topk_cutoff")


def test_tie_equivalent_swap_is_accepted_and_flagged_as_differing():
    scores = _scores()
    t = 4
    chosen = _logical(t, _nominal(scores)[t].tolist())
    kth = min(chosen, key=lambda k: scores[t, k])
    spare = next(k for k in range(int(VIS[t])) if k not in chosen)
    scores[t, spare] = scores[t, kth] - 1e-6  # a near tie just below the cutoff
    ref = _nominal(scores)
    actual = ref.clone()
    actual[t] = torch.tensor([_phys(t, k) for k in sorted(set(chosen) - {kth} | {spare})])
    res, v = _run(actual, ref, scores)
    assert res.passed and res.differs and res.differing_tokens == (t,)
    assert v["topk_cutoff"].row == t and v["topk_cutoff"].measured == pytest.approx(1e-6, rel=0.1)


def test_short_count_fails():
    scores = _scores()
    ref = _nominal(scores)
    actual = ref.clone()
    actual[3, K - 1] = -1
    _, v = _run(actual, ref, scores)
    _assert_only_failure(v, "topk_count", 3)
    assert v["topk_padding"].passed


def test_misuse_raises():
    scores = _scores()
    ref = _nominal(scores)
    with pytest.raises(ValueError, match="topk_rows: actual shape"):
        check_topk("topk_rows", ref[:, :3], ref, scores, VIS, TABLE, T2R, page_size=PAGE)
    bad_ref = ref.clone()
    bad_ref[0, 0] = 4 * PAGE
    with pytest.raises(ValueError, match="reference row 16 of token 0"):
        check_topk("topk_rows", ref, bad_ref, scores, VIS, TABLE, T2R, page_size=PAGE)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), t=st.integers(0, 4))
def test_property_nominal_passes_and_any_real_swap_fails(seed, t):
    scores = _scores(seed)
    ref = _nominal(scores)
    assert check_topk("topk_rows", ref, ref, scores, VIS, TABLE, T2R, page_size=PAGE).passed
    chosen = _logical(t, ref[t].tolist())
    spare = [k for k in range(int(VIS[t])) if k not in chosen][0]
    actual = ref.clone()
    actual[t] = torch.tensor([_phys(t, k) for k in sorted(chosen[1:] + [spare])])
    res, v = _run(actual, ref, scores)
    assert not v["topk_cutoff"].passed and v["topk_cutoff"].row == t and res.differs


def test_padding_token_must_hold_only_minus_one():
    scores = _scores()
    t2r = T2R.clone()
    t2r[5] = -1  # token 5 is storage padding
    ref = _nominal(scores)
    ref[5] = -1
    args = (scores, VIS, TABLE, t2r)
    assert check_topk("topk_rows", ref, ref, *args, page_size=PAGE).passed
    actual = ref.clone()
    actual[5, 0] = _phys(0, 0)
    v = {v.check: v for v in check_topk("topk_rows", actual, ref, *args, page_size=PAGE).verdicts}
    _assert_only_failure(v, "topk_eligible", 5)
    _assert_only_failure(v, "topk_count", 5)
