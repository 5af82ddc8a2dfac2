"""The prefill SP composition refuses what its TP ranks are handed when it breaks the
contract, before anything is compiled or launched and with every byte unchanged: unequal
shard capacity inside a TP group, TP peers disagreeing on the group-global count or on
whether their group is idle, positions that are not consecutive inside a request chunk.
(``--dp-tokens`` lists that disagree with the tokens or DP size are refused with the case:
``tests/harness/test_case_model.py``, ``tests/harness/test_cli.py``.)"""

from __future__ import annotations

import pytest

from harness import registry
from harness.case import Case, validate_case
from platform_stubs import assert_refused_unchanged

CASE = Case(entry="prefill_c2a_full", tp=4, dp=2, tokens=7, requests=3, epochs=3,
            wiring="sharded", dp_tokens=(7, 1))


@pytest.fixture(scope="module")
def built():
    entry = registry.get(CASE.entry)
    validate_case(CASE, entry.support)
    return entry, entry.build_inputs(CASE.config, CASE)


def test_the_fixture_hands_every_rank_the_contract_values(built):
    _, inputs = built
    for g, n in enumerate(CASE.dp_tokens):
        assert inputs[f"g{g}.meta.sp_tokens"].tolist() == [n] * 4
        assert inputs[f"g{g}.meta.sp_capacity"].tolist() == [2] * 4  # ceil(7 / 4)
        assert int(inputs[f"g{g}.meta.query_start_loc"][-1]) == n
        assert inputs[f"g{g}.meta.position_ids"][n:].tolist() == [-1] * (7 - n)


def _tampered(inputs, key, index, value):
    bad = dict(inputs)
    bad[key] = inputs[key].clone()
    bad[key][index] = value
    return bad


@pytest.mark.parametrize("key,index,value,match", [
    ("g1.meta.sp_capacity", 2, 3, r"g1\.meta\.sp_capacity\[2\]: 3 rows; .* ceil\(7/4\) = 2 rows"),
    ("g0.meta.sp_tokens", 3, 6, r"g0\.meta\.sp_tokens\[3\]: 6 != g0\.meta\.sp_tokens\[0\] = 7"),
    ("g1.meta.sp_tokens", 1, 0, r"g1\.meta\.sp_tokens\[1\]: 0 .*disagree on whether the group is idle"),
])
def test_rank_metadata_that_breaks_the_group_is_refused(built, key, index, value, match):
    entry, inputs = built
    assert_refused_unchanged(entry, CASE, _tampered(inputs, key, index, value), match)


def test_positions_not_consecutive_inside_a_request_chunk_are_refused(built):
    entry, inputs = built
    qsl, pos = inputs["g0.meta.query_start_loc"].tolist(), inputs["g0.meta.position_ids"]
    r = next(i for i in range(len(qsl) - 1) if qsl[i + 1] - qsl[i] >= 2)  # a chunk of 2+ rows
    t = qsl[r] + 1
    bad = _tampered(inputs, "g0.meta.position_ids", t, int(pos[t]) + 1)
    assert_refused_unchanged(entry, CASE, bad, rf"g0\.meta\.position_ids\[{t}\]: .*request {r}'s chunk")


def test_a_group_count_that_is_not_the_batch_rows_is_refused(built):
    entry, inputs = built
    bad = _tampered(inputs, "g1.meta.sp_tokens", slice(None), 2)
    assert_refused_unchanged(entry, CASE, bad, r"g1\.meta\.sp_tokens: 2 must equal .* = 1")
