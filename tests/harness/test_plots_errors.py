"""Error plots of failing cases: the rows marked are exactly the verdicts' failing rows, the
ratios are the per-row errors over their bounds, caches mark the non-owned slots that
changed, and a passing case gets no plot.  Through ``python -m harness.replay --plot`` and
``python -m harness run --save-data --plot`` too.

Launch-free: real rmsnorm and window_publish fixtures and goldens with a corrupted actual
output, and the synthetic entries of harness_fakes.
"""

import re

import torch
from harness_fakes import MATRIX_TOKENS, use_fakes
from PIL import Image

import harness.verdict
from harness import registry
from harness.case import Case, Support
from harness.cli import main as cli_main
from harness.compare import check_row_bound, check_zero_rows
from harness.compare import rows as rows_mod
from harness.data import save_case
from harness.entries import rmsnorm
from harness.plots import read_plot_data
from harness.plots.capture import capture
from harness.plots.errors import plot_failures
from harness.registry import Entry
from harness.replay import main as replay_main
from harness.runner import CaseResult
from harness.verdict import all_passed

RMS_CASE = Case(entry="rmsnorm", tokens=33, kind="zero")  # every third row all zero


def rmsnorm_tensors(corrupt: bool = True):
    e = registry.get("rmsnorm")
    inputs = e.build_inputs(RMS_CASE.config, RMS_CASE)
    gold = e.golden(RMS_CASE.config, RMS_CASE, {k: v.clone() for k, v in inputs.items()})
    y = gold["y"].clone()
    if corrupt:
        y[5] *= 1.1  # RMS error 10 % of RMS(r)
        y[7, 3] += 0.1 * y[7].float().square().mean().sqrt()  # a spike: only the peak fails
        y[9, 0] = float("nan")  # a non-finite value in a zero row
    return e, inputs, gold, {"y": y}


def failing_rows(verdicts, output):
    return sorted({str(r) for v in verdicts if v.output == output and not v.passed
                   for r in v.failing_rows})


def assert_picture(path):
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 400
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50


def test_row_plot_marks_exactly_the_failing_rows(tmp_path):
    e, inputs, gold, actual = rmsnorm_tensors()
    verdicts = e.compare(RMS_CASE.config, RMS_CASE, inputs, gold, actual)
    drawn = plot_failures(e, RMS_CASE, inputs, gold, actual, tmp_path, verdicts)
    assert drawn.paths == [tmp_path / "rows-y.png"] and drawn.notes == []
    assert_picture(drawn.paths[0])
    data = read_plot_data(drawn.paths[0])
    assert sorted(data["marked"], key=int) == failing_rows(verdicts, "y") == ["5", "7", "9"]
    assert data["rows"] == [str(i) for i in range(33)] and data["limit"] == 1.0
    assert data["worst_row"] == "9"  # the NaN row
    # the ratios are each row's error over its bound, computed here independently
    a, r = actual["y"].double(), gold["y"].double()
    rms_r = r.square().mean(-1).sqrt()
    d = a - r
    for i in (5, 7, 12):
        rms = float(d[i].square().mean().sqrt() / (1e-6 + 0.01 * rms_r[i]))
        peak = float(d[i].abs().max() / (1e-5 + 0.05 * rms_r[i]))
        assert abs(data["rms_ratio"][i] - rms) <= 1e-9 * max(rms, 1e-30)
        assert abs(data["peak_ratio"][i] - peak) <= 1e-9 * max(peak, 1e-30)
    assert data["rms_ratio"][5] > 1 and data["rms_ratio"][12] == 0
    assert data["rms_ratio"][7] < 1 < data["peak_ratio"][7]
    assert data["rms_ratio"][9] is None and data["peak_ratio"][9] is None  # non-finite


def test_a_passing_case_gets_no_plot(tmp_path):
    e, inputs, gold, actual = rmsnorm_tensors(corrupt=False)
    verdicts = e.compare(RMS_CASE.config, RMS_CASE, inputs, gold, actual)
    assert all_passed(verdicts)
    out = tmp_path / "plots"
    for given in (verdicts, None):
        drawn = plot_failures(e, RMS_CASE, inputs, gold, actual, out, given)
        assert drawn.paths == [] and drawn.notes == []
    assert not out.exists()


def test_cache_plot_marks_the_changed_slots_the_mode_does_not_own(tmp_path):
    e = registry.get("window_publish")
    case = e.matrix[0]
    inputs = e.build_inputs(case.config, case)
    gold = e.golden(case.config, case, {k: v.clone() for k, v in inputs.items()})
    actual = {k: v.clone() for k, v in gold.items()}
    slots = inputs["window_slots"].long()
    owned = set(slots[slots >= 0].tolist())
    payload = actual["window_kv"].view(-1, actual["window_kv"].shape[-1])
    hit = [s for s in range(payload.shape[0]) if s not in owned][1::40]
    assert len(hit) >= 3
    payload[hit, :2] += 1
    verdicts = e.compare(case.config, case, inputs, gold, actual)
    [bad] = [v for v in verdicts if not v.passed]
    assert (bad.output, bad.check) == ("window_kv", "exact_bytes")
    drawn = plot_failures(e, case, inputs, gold, actual, tmp_path, verdicts)
    assert drawn.paths == [tmp_path / "cache-window_kv.png"] and drawn.notes == []
    assert_picture(drawn.paths[0])
    data = read_plot_data(drawn.paths[0])
    assert sorted(data["marked"]) == hit == sorted(bad.failing_rows)
    blocks, per_block = actual["window_kv"].shape[:2]
    assert data["grid"] == [blocks, per_block] and data["owned"] == len(owned)


def _odd_compare(cfg, case, inp, gold, act):
    every = torch.ones(2, 3, dtype=torch.bool)
    return (check_row_bound("att", act["att"], gold["att"], rows=every)
            + check_zero_rows("pad", act["pad"]))


ODD = Entry(name="zz_plot_odd", description="test", support=Support(phase="prefill"),
            matrix=(Case(entry="zz_plot_odd", tokens=1),), build_inputs=lambda c, k: {},
            golden=None, compare=_odd_compare)


def test_multi_dim_rows_keyword_selection_and_undrawn_checks(tmp_path):
    gold = {"att": torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(0)),
            "pad": torch.zeros(4, 8)}
    act = {k: v.clone() for k, v in gold.items()}
    act["att"][0, 1] *= 1.5
    act["att"][1, 2, 4] += 3.0
    act["pad"][2, 0] = 1.0
    case = ODD.matrix[0]
    verdicts = ODD.compare(None, case, {}, gold, act)
    drawn = plot_failures(ODD, case, {}, gold, act, tmp_path, verdicts)
    assert drawn.paths == [tmp_path / "rows-att.png"]
    assert drawn.notes == ["pad.zero_rows: failing, not plotted (plots cover row-bound and "
                           "cache-ownership checks)"]
    data = read_plot_data(drawn.paths[0])
    assert sorted(data["marked"]) == failing_rows(verdicts, "att") == ["(0, 1)", "(1, 2)"]
    assert data["rows"][0] == "(0, 0)" and len(data["rows"]) == 6


def test_capture_restores_the_comparators_and_sees_entry_imports():
    original = rows_mod.check_row_bound
    assert rmsnorm.check_row_bound is original
    e, inputs, gold, actual = rmsnorm_tensors()
    with capture() as cap:
        assert rmsnorm.check_row_bound is not original
        e.compare(RMS_CASE.config, RMS_CASE, inputs, gold, actual)
    assert rmsnorm.check_row_bound is original and rows_mod.check_row_bound is original
    assert rows_mod.summarize is harness.verdict.summarize
    [call] = cap.row_bound
    assert call.output == "y" and set(call.checks) == {"finite", "row_rms", "row_peak"}
    assert call.actual.shape == (33, actual["y"].shape[1])


def test_replay_plot_writes_next_to_failing_cases_only(tmp_path, capsys):
    root = tmp_path / "data"
    e, inputs, gold, actual = rmsnorm_tensors()
    verdicts = e.compare(RMS_CASE.config, RMS_CASE, inputs, gold, actual)
    bad = save_case(root, CaseResult(RMS_CASE, "kernel:wrong-variant", "fail", verdicts),
                    inputs, gold, actual)
    ok_case = Case(entry="rmsnorm", tokens=4)
    ok_in = e.build_inputs(ok_case.config, ok_case)
    ok_gold = e.golden(ok_case.config, ok_case, {k: v.clone() for k, v in ok_in.items()})
    ok_v = e.compare(ok_case.config, ok_case, ok_in, ok_gold, ok_gold)
    good = save_case(root, CaseResult(ok_case, "kernel:rmsnorm", "pass", ok_v), ok_in,
                     ok_gold, ok_gold)
    assert replay_main([str(root), "--plot"]) == 1
    out = capsys.readouterr().out
    png = bad / "plots" / "rows-y.png"
    assert f"plot: {png}" in out.replace("\n", "")
    assert sorted(read_plot_data(png)["marked"], key=int) == failing_rows(verdicts, "y")
    assert not (good / "plots").exists()
    # with OUTDIR: <OUTDIR>/<wiring>/<case>/, and the tree replays unchanged afterwards
    assert replay_main([str(root), "--plot", str(tmp_path / "pics")]) == 1
    assert (tmp_path / "pics" / "replicated" / bad.name / "rows-y.png").is_file()
    assert not (tmp_path / "pics" / "replicated" / good.name).exists()
    capsys.readouterr()
    assert replay_main([str(root)]) == 1
    assert "1 passed, 1 failed" in capsys.readouterr().out


def test_run_save_data_plot_draws_each_failing_case(monkeypatch, capsys, tmp_path):
    use_fakes(monkeypatch)
    argv = ["run", "fake_scaled", "--summary", str(tmp_path / "s.json")]
    assert cli_main([*argv, "--plot"]) == 2
    assert "--plot" in capsys.readouterr().err
    data = tmp_path / "data"
    assert cli_main([*argv, "--save-data", str(data), "--plot"]) == 1
    out = capsys.readouterr().out
    folders = sorted((data / "replicated").iterdir())
    assert len(folders) == len(MATRIX_TOKENS)
    for folder in folders:
        png = folder / "plots" / "rows-out.png"
        if f"-t{MATRIX_TOKENS[0]}-" in folder.name:  # the one case the fake gets right
            assert not (folder / "plots").exists()
            continue
        assert f"plot: {png}" in out
        tokens = int(re.search(r"-t(\d+)-", folder.name).group(1))
        assert sorted(read_plot_data(png)["marked"], key=int) == [str(i) for i in range(tokens)]


BROKEN_ROW = {"row": 2}  # the row the drifting SUT breaks on its next call


def _drift_inputs(cfg, case):
    return {"x": torch.randn(8, 16, generator=torch.Generator().manual_seed(1))}


def _drifting_sut(platform, cfg, case, inp):
    from harness.registry import SutOutput
    out = inp["x"] * 2
    out[BROKEN_ROW["row"]] *= 1.5
    return SutOutput({"y": out}, [])


DRIFT = Entry(name="zz_plot_drift", description="test", support=Support(phase="prefill"),
              matrix=(Case(entry="zz_plot_drift", tokens=8),), build_inputs=_drift_inputs,
              golden=lambda cfg, case, inp: {"y": inp["x"] * 2},
              compare=lambda cfg, case, inp, gold, act: check_row_bound("y", act["y"], gold["y"]),
              alternate=_drifting_sut, alternate_label="drift")


def test_replay_rerun_plot_draws_the_fresh_output(tmp_path, capsys):
    from harness.runner import run_case
    with registry.registered(DRIFT):
        BROKEN_ROW["row"] = 2
        saved = run_case(DRIFT.matrix[0], save_root=tmp_path)
        assert saved.status == "fail"
        BROKEN_ROW["row"] = 5
        assert replay_main([saved.data_dir, "--rerun", "--plot"]) == 1
    data = read_plot_data(f"{saved.data_dir}/plots/rows-y.png")
    assert data["marked"] == ["5"]  # the rerun's output was judged and drawn, not the saved one
    assert "mode: rerun" in capsys.readouterr().out
