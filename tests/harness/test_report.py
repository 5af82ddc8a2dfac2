"""harness.report: one short line per case, details for failures, per-entry summary, and
checks that measured nothing never shown as a (worst) pass."""

import io
import json
import math

import pytest
from rich.console import Console

from harness import registry
from harness.case import Case
from harness.report import print_run, summary_json, worst_check
from harness.runner import CaseResult, load_platform, run_case
from harness.verdict import single, summarize, worst

WIDTH = 120


def _render(results, **kw) -> list[str]:
    buf = io.StringIO()
    print_run(results, Console(file=buf, width=WIDTH, color_system=None), **kw)
    return buf.getvalue().splitlines()


def _empty(check="zero_rows"):
    return summarize("out", check, [], 0.0, [])


def _result(entry="rmsnorm", tokens=8, status="pass", sut="kernel:rmsnorm", verdicts=None, **kw):
    case = Case(entry=entry, tokens=tokens)
    if verdicts is None:
        verdicts = [single("out", "row_rms", 0.2, 1.0), _empty()]
    return CaseResult(case, sut, status, verdicts,
                      [{"rank": 0, "aicore_e2e_us": 12.5}] if sut.startswith("kernel") else [], **kw)


def test_sut_kind_separates_kernels_from_golden_alt():
    assert _result().sut_kind == "kernel"
    assert _result(sut="golden-alt:decode_swa: sharded").sut_kind == "golden-alt"
    assert _result(sut="none", status="skip", verdicts=[]).sut_kind == "none"


def test_a_check_over_no_rows_is_not_applicable_never_a_pass_with_inf_margin():
    v = _empty()
    assert not v.applicable and v.passed  # nothing to hold against its bound
    assert math.isnan(v.measured) and math.isnan(v.margin)
    assert v.line().startswith("N/A out zero_rows")
    real = single("out", "row_rms", 0.9, 1.0)
    assert worst([v, real]) is real and worst([v]) is None
    assert worst_check([v, real]) is real and worst_check([v]) is None


def test_one_line_per_case_within_120_columns():
    results = [_result(tokens=t) for t in (1, 8, 33)] + [
        _result(entry="decode_c1a_reindex", sut="golden-alt:decode_c1a_reindex: per-rank golden "
                "pieces via host transports (all-reduce / all-gather+reduce-scatter)")]
    lines = _render(results)
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    for r in results:
        assert sum(r.case.entry in line and f"t{r.case.tokens}" in line
                   for line in lines if "golden-alt" in line or "kernel" in line) >= 1
    case_lines = [line for line in lines if " pass " in f" {line} " and "row_rms" in line]
    assert len(case_lines) == len(results)
    assert not any("zero_rows" in line or "inf" in line or "nan" in line for line in lines)


def test_worst_column_ignores_checks_that_measured_nothing():
    only_empty = _result(verdicts=[_empty(), _empty("topk_cutoff")])
    lines = _render([only_empty])
    [line] = [x for x in lines if "rmsnorm" in x and "t8" in x and "pass" in x]
    assert "n/a" in line and "topk_cutoff" not in line and "zero_rows" not in line


def test_failure_details_only_for_failures_unless_verbose():
    bad = _result(tokens=9, status="fail", verdicts=[
        summarize("out", "row_rms", [0.1, 3.0], 1.0, [0, 1]), _empty()])
    good = _result(tokens=8)
    lines = _render([good, bad])
    details = [x for x in lines if x.startswith(("FAIL", "PASS", "N/A"))]
    assert details == ["FAIL out row_rms row=1 measured=3 bound=<=1 failing_rows=1/2 []"]
    verbose = [x for x in _render([good, bad], verbose=True) if x.startswith(("PASS", "N/A"))]
    assert len(verbose) == 3  # PASS row_rms, N/A zero_rows (good); N/A zero_rows (bad)


def test_summary_counts_kernel_and_golden_alt_apart_per_entry_and_overall():
    results = [_result(tokens=1), _result(tokens=2, status="skip", verdicts=[], reason="no card"),
               _result(entry="decode_swa", sut="golden-alt:decode_swa")]
    text = "\n".join(_render(results))
    assert "kernel: 1 passed, 0 failed, 1 skipped" in text
    assert "golden-alt: 1 passed, 0 failed, 0 skipped" in text
    assert "rmsnorm-tp1-dp1-t2-r1-e1-replicated-mixed-s17-tiny: skip: no card" in text
    lines = text.splitlines()
    after = lines[next(i for i, x in enumerate(lines) if x.strip() == "per entry"):]
    rows = [x.split() for x in after if x.startswith(("rmsnorm ", "decode_swa "))]
    # entry, sut, cases, pass, fail, skip, error, max A5 us
    assert rows == [["decode_swa", "golden-alt", "1", "1", "0", "0", "0", "-"],
                    ["rmsnorm", "kernel", "2", "1", "0", "1", "0", "12.5"]]


def test_summary_json_records_sut_kind_verify_level_and_applicability(tmp_path):
    r = _result()
    r.verify_level = "pass"  # engineer A's field; read with getattr
    data = json.loads(json.dumps(summary_json([r, _result(entry="decode_swa",
                                                           sut="golden-alt:decode_swa")])))
    assert data["counts_by_sut"] == {
        "kernel": {"pass": 1, "fail": 0, "skip": 0, "error": 0},
        "golden-alt": {"pass": 1, "fail": 0, "skip": 0, "error": 0}}
    first = data["cases"][0]
    assert first["sut_kind"] == "kernel" and first["verify_level"] == "pass"
    assert data["cases"][1]["verify_level"] is None
    applicable = {v["check"]: v["applicable"] for v in first["verdicts"]}
    assert applicable == {"row_rms": True, "zero_rows": False}
    assert [v["margin"] for v in first["verdicts"]][1] is None


@pytest.fixture(scope="module")
def c1a_full_results():
    """Two decode_c1a_full cases on one numerics-only a5sim platform (verdicts, no estimate)."""
    entry = registry.get("decode_c1a_full")
    platform = load_platform("a5sim", cost_model=False)
    try:
        return [run_case(c, platform=platform) for c in entry.matrix[:2]]
    finally:
        platform.close()


def test_decode_c1a_full_shows_no_check_that_measured_nothing(c1a_full_results):
    """The reported defect: topk_cutoff (nan, margin inf) and zero_rows (nan) shown as passes."""
    verdicts = [v for r in c1a_full_results for v in r.verdicts]
    empty = [v for v in verdicts if math.isnan(v.measured)]
    assert {v.check for v in empty} == {"topk_cutoff", "zero_rows"}  # the defect's inputs
    assert all(not v.applicable or not v.passed for v in empty)
    assert all(v.applicable for v in verdicts if not math.isnan(v.measured))
    for r in c1a_full_results:
        assert r.status == "pass" and worst_check(r.verdicts).applicable
    lines = _render(c1a_full_results)
    assert len(lines) < 20
    assert not any("inf" in x or "nan" in x for x in lines)
