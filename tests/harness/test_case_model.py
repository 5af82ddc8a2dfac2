"""Case model validation: every rule names the axis and its bound."""

import pytest

from harness.case import Case, CaseError, Support, standard_matrix, validate_case

DECODE = Support(phase="decode", tp_sizes=(1, 2, 4, 8), dp_sizes=(1, 2),
                 wirings=("replicated", "sharded"), kinds=("mixed", "zero"))


def test_good_case_passes_and_counts_cards():
    c = Case(entry="x", tp=4, dp=2, tokens=33, requests=6, epochs=2)
    validate_case(c, DECODE)
    assert c.cards == 8
    assert Case(entry="m", tp=2, dp=2, ep=4).cards == 4


@pytest.mark.parametrize("changes,needle", [
    (dict(tp=3), "tp: 3"),
    (dict(tp=8, preset="tiny", dp=1), None),  # TINY has 8 heads: tp 8 is fine
    (dict(dp=4), "dp: 4"),
    (dict(tokens=193), "tokens: 193 outside [1, 192]"),
    (dict(tokens=0), "tokens: 0"),
    (dict(active_tokens=7), "active_tokens: 7 < tokens 8"),
    (dict(active_tokens=9), "active_tokens: 9 outside"),
    (dict(requests=9), "requests: 9 outside [1, min(32, tokens 8)]"),
    (dict(tokens=64, requests=33), "requests: 33"),
    (dict(epochs=0), "epochs: 0"),
    (dict(wiring="ring"), "wiring: 'ring'"),
    (dict(kind="long"), "kind: 'long'"),
    (dict(preset="huge"), "preset"),
    (dict(platform="gpu"), "platform: 'gpu'"),
    (dict(ep=4), "ep: 4 is not supported"),
])
def test_bad_axes_are_named(changes, needle):
    c = Case(entry="x", tokens=8).with_(**changes)
    if needle is None:
        validate_case(c, DECODE)
        return
    with pytest.raises(CaseError) as err:
        validate_case(c, DECODE)
    assert needle in str(err.value)


def test_flash_and_tiny_accept_tp8():
    s = Support(tp_sizes=(1, 2, 4, 8))
    validate_case(Case(entry="x", tp=8, preset="flash"), s)
    validate_case(Case(entry="x", tp=8, preset="tiny"), s)


def test_cards_available():
    with pytest.raises(CaseError, match="cards: case needs 4"):
        validate_case(Case(entry="x", tp=4), DECODE, cards_available=2)


def test_inactive_rows_where_supported():
    validate_case(Case(entry="x", tokens=32, active_tokens=24, requests=6, tp=4),
                  Support(phase="decode", tp_sizes=(4,), inactive_rows=True))


def test_prefill_cap():
    s = Support(phase="prefill")
    validate_case(Case(entry="x", tokens=4096), s)
    with pytest.raises(CaseError, match="4096"):
        validate_case(Case(entry="x", tokens=4097), s)


def test_standard_matrix_roles():
    both = standard_matrix("e", DECODE, role="composing")
    assert [(c.tp, c.dp, c.wiring) for c in both] == [
        (1, 1, "replicated"), (1, 1, "sharded"), (4, 1, "replicated"), (4, 1, "sharded")]
    leaf = standard_matrix("e", DECODE, role="leaf")
    assert {(c.tp, c.dp) for c in leaf} == {(2, 2)}
    dp1 = Support(tp_sizes=(1, 2, 4), dp_sizes=(1,))
    assert {(c.tp, c.dp) for c in standard_matrix("e", dp1, role="leaf")} == {(1, 1)}
    assert {(c.tp, c.dp) for c in standard_matrix("e", DECODE)} == {(1, 1), (2, 2), (4, 1)}


def test_case_id_names_axes():
    c = Case(entry="decode_c2a_reuse", tp=4, tokens=33, active_tokens=31, requests=6, epochs=2,
             wiring="sharded")
    assert c.case_id == "decode_c2a_reuse-tp4-dp1-t33a31-r6-e2-sharded-mixed-s17-tiny"


# ---- per-DP-group valid counts (--dp-tokens) ------------------------------------------------

PREFILL = Support(phase="prefill", tp_sizes=(1, 2, 4), dp_sizes=(1, 2), wirings=("sharded",),
                  inactive_rows=True)


def test_dp_tokens_give_each_group_its_count():
    c = Case(entry="x", tp=4, dp=2, tokens=8, requests=3, wiring="sharded", dp_tokens=(8, 5))
    validate_case(c, PREFILL)
    assert [c.group_active(g) for g in range(2)] == [8, 5]
    assert c.active == 8  # the largest group's count, for code that is not per group
    assert c.case_id == "x-tp4-dp2-t8d8_5-r3-e1-sharded-mixed-s17-tiny"
    plain = Case(entry="x", dp=2, tokens=8, active_tokens=6)
    assert [plain.group_active(g) for g in range(2)] == [6, 6]


def test_dp_tokens_read_back_from_json_are_a_tuple():
    from dataclasses import asdict
    import json
    c = Case(entry="x", dp=2, tokens=8, dp_tokens=(8, 0))
    back = Case(**json.loads(json.dumps(asdict(c))))
    assert back == c and back.dp_tokens == (8, 0)


@pytest.mark.parametrize("changes,needle", [
    (dict(dp_tokens=(7,)), "dp_tokens: 1 counts (7,) for dp=2 DP groups"),
    (dict(dp_tokens=(7, 1, 1)), "dp_tokens: 3 counts"),
    (dict(dp_tokens=(9, 1)), "dp_tokens[0]: 9 outside [0, tokens=8]"),
    (dict(dp_tokens=(8, -1)), "dp_tokens[1]: -1 outside"),
    (dict(dp_tokens=(8, 5), active_tokens=5), "active_tokens: 5 given with dp_tokens"),
    (dict(dp_tokens=(8, "5")), "must be a list of ints"),
])
def test_dp_tokens_that_disagree_with_tokens_or_dp_are_refused(changes, needle):
    c = Case(entry="x", tp=4, dp=2, tokens=8, requests=3, wiring="sharded").with_(**changes)
    with pytest.raises(CaseError) as err:
        validate_case(c, PREFILL)
    assert needle in str(err.value)


def test_dp_tokens_below_tokens_need_inactive_row_support():
    c = Case(entry="x", tp=4, dp=2, tokens=8, requests=3, wiring="sharded", dp_tokens=(8, 5))
    with pytest.raises(CaseError, match="dp_tokens: \\(8, 5\\) below tokens 8"):
        validate_case(c, Support(phase="prefill", tp_sizes=(4,), dp_sizes=(2,), wirings=("sharded",)))


def test_an_ep_world_entry_needs_ep_equal_to_tp_times_dp():
    s = Support(phase="prefill", tp_sizes=(1, 2, 4), dp_sizes=(1, 2), ep_sizes=(2, 4, 8), ep_world=True)
    validate_case(Case(entry="moe", tp=2, dp=2, ep=4), s)
    with pytest.raises(CaseError, match=r"ep: 8 must equal tp \* dp = 2 \* 2 for moe"):
        validate_case(Case(entry="moe", tp=2, dp=2, ep=8), s)
