"""Estimate-only ``routed_experts`` on a rank too large for one cost-model launch: the rank
is estimated as one ``local = 1`` launch per expert with rows plus one padding launch, run
one after another and summed per rank; below the size limit (every TINY rank) and on the
interpreter a rank stays one launch."""

import pytest

from harness import registry
from harness.case import Case
from harness.entries import routed_experts as entry_mod
from harness.platforms import verify
from harness.platforms.a5sim import A5SimPlatform
from harness.runner import run_case

CASE = Case(entry="routed_experts", tokens=16, ep=4, tp=4, kind="holes")  # an empty rank


@pytest.fixture(scope="module")
def estimator():
    platform = A5SimPlatform(verify=verify.ESTIMATE_LEVEL)
    yield platform
    platform.close()


def _expected_launches(case) -> list[int]:
    """Per rank: its experts with rows, plus one launch for its padding rows."""
    entry = registry.get("routed_experts")
    inputs = entry.build_inputs(case.config, case)
    n_local = case.config.moe.n_routed_experts // case.ep
    cap = inputs["y"].shape[1]
    counts = []
    for r in range(case.ep):
        off = entry_mod.dispatch(inputs["indices"], r * n_local, n_local)[2]
        counts.append(int((off[1:] > off[:-1]).sum()) + int(cap > int(off[-1])))
    return counts


def test_tiny_ranks_are_one_launch_each(estimator):
    assert not entry_mod.split_per_expert(estimator, CASE.config, CASE)
    est = run_case(CASE, platform=estimator)
    assert est.status == "estimate", est.reason
    assert [c["rank"] for c in est.costs] == list(range(CASE.ep))
    assert all(c.get("launches", 1) == 1 for c in est.costs)


def test_a_large_rank_is_estimated_expert_by_expert(estimator, monkeypatch):
    monkeypatch.setattr(entry_mod, "ESTIMATE_RANK_BYTES", 0)
    assert entry_mod.split_per_expert(estimator, CASE.config, CASE)
    est = run_case(CASE, platform=estimator)
    assert est.status == "estimate", est.reason
    assert [c["rank"] for c in est.costs] == list(range(CASE.ep))
    expected = _expected_launches(CASE)
    assert [c["launches"] for c in est.costs] == expected
    assert min(expected) == 1  # the empty rank: its padding launch only
    for c in est.costs:
        assert c["aicore_e2e_us"] > 0
        assert sum(c["by_module"].values()) == pytest.approx(c["aicore_e2e_us"])
    assert est.estimated_a5_us() == max(c["aicore_e2e_us"] for c in est.costs)


def test_the_interpreter_never_splits(a5sim, monkeypatch):
    monkeypatch.setattr(entry_mod, "ESTIMATE_RANK_BYTES", 0)
    assert not entry_mod.split_per_expert(a5sim, CASE.config, CASE)
