"""Shared fixtures of the harness tests."""

import pytest

from harness.runner import CaseResult


@pytest.fixture
def est(monkeypatch):
    """A fake runner for bench tests: the estimate per entry is ``est[entry]`` (1.0 when unset,
    None: the case errors); ``est["calls"]`` lists the case ids run, in order."""
    table = {"rmsnorm": 10.0, "gate": 20.0, "calls": []}

    def fake_run(case, *a, **k):
        table["calls"].append(case.case_id)
        us = table.get(case.entry, 1.0)
        if us is None:
            return CaseResult(case=case, sut="kernel:x", status="error", reason="boom")
        return CaseResult(case=case, sut="kernel:x", status="estimate",
                          costs=[{"rank": 0, "aicore_e2e_us": us, "total_cycles": int(us * 1800)}])

    import harness.runner
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    return table
