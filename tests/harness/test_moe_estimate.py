"""``python -m harness.moe_estimate`` gives the estimate-only SUT's per-rank figures (same
routing, same launches: whole ranks or chunks of experts) without building the experts'
weights."""

import pytest

from harness.case import Case
from harness.entries import routed_experts as entry_mod
from harness.moe_estimate import main, rank_estimates
from harness.platforms import verify
from harness.platforms.a5sim import A5SimPlatform
from harness.runner import run_case

CASE = Case(entry="routed_experts", tokens=16, ep=4, tp=4, kind="holes")


@pytest.fixture(scope="module")
def estimator():
    platform = A5SimPlatform(verify=verify.ESTIMATE_LEVEL)
    yield platform
    platform.close()


def test_rank_estimates_equal_the_estimate_only_sut(estimator, monkeypatch):
    monkeypatch.setattr(entry_mod, "ESTIMATE_RANK_BYTES", 0)  # TINY ranks split as FLASH's do
    est = run_case(CASE, platform=estimator)
    assert est.status == "estimate", est.reason
    rows = rank_estimates(estimator, CASE.config, CASE)
    assert [r["rank"] for r in rows] == [c["rank"] for c in est.costs] == list(range(CASE.ep))
    assert [r["aicore_e2e_us"] for r in rows] == [c["aicore_e2e_us"] for c in est.costs]
    assert [r["launches"] for r in rows] == [c["launches"] for c in est.costs]
    assert min(r["experts_with_rows"] for r in rows) == 0  # the holes case's empty rank


def test_cli_prints_every_rank(capsys, monkeypatch):
    monkeypatch.setattr(entry_mod, "ESTIMATE_RANK_BYTES", 0)
    assert main(["--preset", "tiny", "--tokens", "8", "--ep", "2", "--tp", "1", "--dp", "2"]) == 0
    out = capsys.readouterr().out
    assert "rank 0:" in out and "rank 1:" in out and "slowest rank" in out
