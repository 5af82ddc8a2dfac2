"""Estimate-only ``routed_experts`` on a rank too large for one cost-model launch: the rank
is estimated as one launch per chunk of experts with rows (one expert per chunk when the
limit is below one expert) plus one padding launch, run one after another and summed per
rank; below the size limit (every TINY rank, a FLASH EP8 rank) and on the interpreter a
rank stays one launch."""

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


def _expected_launches(case, chunk: int = 1) -> list[int]:
    """Per rank: its chunks of ``chunk`` experts with rows, plus one launch for its padding
    rows."""
    entry = registry.get("routed_experts")
    inputs = entry.build_inputs(case.config, case)
    n_local = case.config.moe.n_routed_experts // case.ep
    cap = inputs["y"].shape[1]
    counts = []
    for r in range(case.ep):
        off = entry_mod.dispatch(inputs["indices"], r * n_local, n_local)[2]
        ends = off[chunk::chunk] if n_local % chunk == 0 else None
        assert ends is not None, "chunks of equal size in this test"
        counts.append(int((ends > off[:-1:chunk]).sum()) + int(cap > int(off[-1])))
    return counts


def test_tiny_ranks_are_one_launch_each(estimator):
    assert not entry_mod.split_rank(estimator, CASE.config, CASE)
    est = run_case(CASE, platform=estimator)
    assert est.status == "estimate", est.reason
    assert [c["rank"] for c in est.costs] == list(range(CASE.ep))
    assert all(c.get("launches", 1) == 1 for c in est.costs)


def test_a_large_rank_is_estimated_expert_by_expert(estimator, monkeypatch):
    monkeypatch.setattr(entry_mod, "ESTIMATE_RANK_BYTES", 0)
    assert entry_mod.split_rank(estimator, CASE.config, CASE)
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
    assert not entry_mod.split_rank(a5sim, CASE.config, CASE)


def test_a_large_rank_is_estimated_in_chunks_of_experts(estimator, monkeypatch):
    # the limit at two experts' packed bytes: each 4-expert TINY rank is two launches of two
    monkeypatch.setattr(entry_mod, "ESTIMATE_RANK_BYTES",
                        entry_mod.packed_bytes(CASE.config, 2))
    assert entry_mod.chunk_experts(CASE.config, 4) == 2
    est = run_case(CASE, platform=estimator)
    assert est.status == "estimate", est.reason
    expected = _expected_launches(CASE, chunk=2)
    assert [c["launches"] for c in est.costs] == expected
    assert max(expected) == 3  # two chunks with rows and the padding launch
    for c in est.costs:
        assert c["aicore_e2e_us"] > 0


def test_flash_ep8_rank_is_one_launch_and_ep4_rank_two_chunks():
    from goldens.config import FLASH
    assert entry_mod.packed_bytes(FLASH, 48) <= entry_mod.ESTIMATE_RANK_BYTES
    assert entry_mod.packed_bytes(FLASH, 96) > entry_mod.ESTIMATE_RANK_BYTES
    assert entry_mod.chunk_experts(FLASH, 96) == 48
    assert entry_mod.chunk_experts(FLASH, 48) == 48
