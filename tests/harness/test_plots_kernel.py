"""The issue's check with a real kernel: a deliberately wrong rmsnorm variant run on a5sim,
saved, replayed with ``--plot``: the error plot marks exactly the rows its verdicts fail.

One small TINY launch (the ``no_eps`` variant divides by zero on the all-zero rows of the
``zero`` case kind, so only those rows fail).
"""

import pytest

from harness import registry
from harness.case import Case
from harness.data import save_case
from harness.entries._kernel import run_with, single_launch
from harness.plots import read_plot_data
from harness.replay import main as replay_main
from harness.runner import CaseResult

CASE = Case(entry="rmsnorm", tokens=33, kind="zero")  # rows 0, 3, ..., 30 are all zero


@pytest.fixture(scope="module")
def saved_wrong_variant(tmp_path_factory):
    from harness.platforms import get_platform
    platform = get_platform("a5sim")
    ok, why = platform.available()
    if not ok:
        pytest.skip(why)
    try:
        verdicts, outputs, gold = run_with(platform, CASE,
                                           single_launch("v41.rmsnorm", variant="no_eps"))
    finally:
        platform.close()
    entry = registry.get("rmsnorm")
    inputs = entry.build_inputs(CASE.config, CASE)
    root = tmp_path_factory.mktemp("data")
    folder = save_case(root, CaseResult(CASE, "kernel:rmsnorm[no_eps]", "fail", verdicts),
                       inputs, gold, outputs)
    return root, folder, verdicts


def test_replay_plot_marks_the_rows_the_wrong_kernel_breaks(saved_wrong_variant, capsys):
    root, folder, verdicts = saved_wrong_variant
    failing = sorted({r for v in verdicts if not v.passed for r in v.failing_rows})
    assert failing == list(range(0, 33, 3))  # the variant breaks exactly the zero rows
    assert replay_main([str(root), "--plot"]) == 1
    png = folder / "plots" / "rows-y.png"
    assert f"plot: {png}" in capsys.readouterr().out.replace("\n", "")
    data = read_plot_data(png)
    assert sorted(int(r) for r in data["marked"]) == failing
    assert data["worst_row"] in {str(r) for r in failing}
    assert all(data["rms_ratio"][r] is None for r in failing)  # NaN rows: non-finite
