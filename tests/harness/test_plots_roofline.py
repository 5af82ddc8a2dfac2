"""``python -m harness.bench --plot``: the roofline chart holds exactly the ``--json`` numbers.

Launch-free: the runner is replaced by fixed results, as in test_bench.py.  The chart's
data is read back from the written file (embedded from the figure's artists).
"""

import json
import subprocess
import sys

import pytest
from PIL import Image

import harness.plots
import harness.runner
from harness import bench
from harness.platforms import topology
from harness.plots import read_plot_data
from harness.plots.roofline import roofline_figure
from harness.runner import CaseResult

PLAT = topology.read_platform()
EST = {"rmsnorm": 7.5, "gate": 3.0}


def fake_run(case, *a, **k):
    r = CaseResult(case=case, sut="kernel:x", status="pass",
                   costs=[{"rank": 0, "aicore_e2e_us": EST[case.entry], "total_cycles": 1}])
    r.verify_level = "tensor"
    return r


def assert_real_picture(path, min_size=(600, 400)):
    with Image.open(path) as im:
        assert im.size[0] >= min_size[0] and im.size[1] >= min_size[1]
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # not blank: lines, points, text


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_chart_points_are_the_json_numbers(monkeypatch, capsys, tmp_path, suffix):
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    out = tmp_path / f"roof{suffix}"
    argv = ["--json", "--plot", str(out), "rmsnorm", "gate", "--preset", "flash",
            "--tokens", "7", "--tokens", "192"]
    assert bench.main(argv) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert len(rows) == 4 and f"roofline chart: {out} (4 cases)" in captured.err
    data = read_plot_data(out)
    assert (data["x_scale"], data["y_scale"]) == ("log", "log")
    points = {p["case"]: p for p in data["points"]}
    assert sorted(points) == sorted(r["case"] for r in rows) and data["left_off"] == []
    for r in rows:
        p = points[r["case"]]
        flops = sum(r["flops"].values())
        assert p["intensity"] == pytest.approx(flops / r["bytes"], rel=1e-12)
        assert p["tflops"] == pytest.approx(flops / r["estimated_us"] / 1e6, rel=1e-12)
        assert p["label"] == f"{r['entry']} T={r['tokens']}"
    # the roofs are the platform file's: HBM slope and one flat roof per compute dtype
    bw = PLAT.hbm_bytes_per_s / 1e12
    mem = data["roofs"].pop("memory")
    assert [y / x for x, y in zip(mem["x"], mem["y"])] == pytest.approx([bw, bw])
    assert set(data["roofs"]) == set(PLAT.peaks)
    for dtype, roof in data["roofs"].items():
        assert roof["y"] == pytest.approx([PLAT.peaks[dtype] / 1e12] * 2)
        assert roof["x"][0] == pytest.approx(PLAT.peaks[dtype] / 1e12 / bw)  # ridge point
    desc = topology.describe()
    assert "preset flash, tokens 7,192" in data["title"]
    assert (f"{desc['cube_cores']} cube + {desc['vector_cores']} vector cores, cycles at "
            f"{desc['clock_mhz']} MHz") in data["title"]
    if suffix == ".png":
        assert_real_picture(out)


def test_a_row_without_estimate_is_left_off_and_named():
    base = {"entry": "rmsnorm", "tokens": 7, "tp": 1, "preset": "flash", "bound": "memory",
            "flops": {"vector_fp32": 4000}, "bytes": 1000, "topology": {}}
    rows = [dict(base, case="ok", estimated_us=2.0, status="pass"),
            dict(base, case="failed", estimated_us=None, status="error", tokens=9)]
    fig, data = roofline_figure(rows, PLAT.hbm_bytes_per_s, PLAT.peaks)
    assert [p["case"] for p in data["points"]] == ["ok"] and data["left_off"] == ["failed"]
    assert any("rmsnorm T=9 (no estimate (status error))" in t.get_text() for t in fig.texts)


def test_bad_plot_path_is_refused_before_any_run(monkeypatch, capsys, tmp_path):
    def no_run(*a, **k):
        raise AssertionError("a case ran")
    monkeypatch.setattr(harness.runner, "run_case", no_run)
    assert bench.main(["rmsnorm", "--plot", str(tmp_path / "roof.jpg")]) == 2
    err = capsys.readouterr().err
    assert "--plot" in err and "roof.jpg" in err and ".png or .svg" in err
    (tmp_path / "dir.png").mkdir()
    assert bench.main(["rmsnorm", "--plot", str(tmp_path / "dir.png")]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_missing_matplotlib_is_refused_naming_the_extra(monkeypatch, capsys, tmp_path):
    real = harness.plots.importlib.util.find_spec
    monkeypatch.setattr(harness.plots.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert bench.main(["rmsnorm", "--plot", str(tmp_path / "r.png")]) == 2
    assert "needs matplotlib" in capsys.readouterr().err and not (tmp_path / "r.png").exists()


def test_no_matplotlib_import_unless_a_plot_is_drawn():
    code = ("import sys, harness.bench, harness.replay, harness.cli, harness.plots, "
            "harness.plots.roofline, harness.plots.errors; print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_a_kernel_without_arithmetic_goes_on_the_bandwidth_panel():
    base = {"entry": "rmsnorm", "tokens": 7, "tp": 1, "preset": "flash", "bound": "memory",
            "flops": {"vector_fp32": 4000}, "bytes": 1000, "topology": {}, "status": "pass"}
    gather = dict(base, entry="rope_rows", case="gather", flops={}, bytes=3_000_000, estimated_us=2.0)
    rows = [dict(base, case="ok", estimated_us=2.0), gather,
            dict(gather, case="nobytes", bytes=0, tokens=9)]
    fig, data = roofline_figure(rows, PLAT.hbm_bytes_per_s, PLAT.peaks)
    assert [p["case"] for p in data["points"]] == ["ok"] and data["left_off"] == ["nobytes"]
    (moved,) = data["bandwidth_points"]
    assert moved["case"] == "gather" and moved["label"] == "rope_rows T=7"
    assert moved["tbps"] == pytest.approx(3_000_000 / 2e-6 / 1e12, rel=1e-12)
    assert data["roofs"]["bandwidth"]["y"][0] == pytest.approx(PLAT.hbm_bytes_per_s / 1e12)
    assert any("rope_rows T=9 (no bytes declared)" in t.get_text() for t in fig.texts)


def test_many_points_are_numbered_with_a_key_of_names_estimates_and_ratios():
    base = {"entry": "rmsnorm", "tp": 1, "preset": "flash", "bound": "memory", "status": "pass",
            "flops": {"vector_fp32": 4000}, "bytes": 1000, "topology": {}, "ratio": 2.5}
    rows = [dict(base, case=f"c{t}", tokens=t, estimated_us=1.0 + t) for t in range(1, 21)]
    fig, data = roofline_figure(rows, PLAT.hbm_bytes_per_s, PLAT.peaks)
    assert [p["label"] for p in data["points"]] == [f"rmsnorm T={t}" for t in range(1, 21)]
    key = "\n".join(t.get_text() for a in fig.axes for t in a.texts if "\n" in t.get_text())
    assert " 20  rmsnorm T=20  21.0 us  2.5x" in key
