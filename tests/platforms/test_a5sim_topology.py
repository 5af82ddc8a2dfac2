"""The simulated A5 topology: read from the platform file and the cost-model config, and
checked against what the cost model actually built for one small kernel."""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from harness.platforms import KernelSpec, topology
from harness.platforms.a5sim import CYCLES_PER_US, A5SimPlatform
from harness.platforms.pypto_env import A5_COSTMODEL_JSON, A5_PLATFORM_INI

REPO = Path(__file__).resolve().parents[2]


def platform_ini() -> configparser.ConfigParser:
    """The vendored platform file, parsed here independently of topology.py."""
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str
    assert cp.read(A5_PLATFORM_INI)
    return cp


def test_describe_is_the_platform_files_topology():
    ini = platform_ini()
    d = topology.describe()
    assert d["cube_cores"] == int(ini["SoCInfo"]["cube_core_cnt"])
    assert d["vector_cores"] == int(ini["SoCInfo"]["vector_core_cnt"])
    assert d["platform"]["clock_mhz"] == int(ini["AICoreSpec"]["cube_freq"])
    for key in ("cube_cores", "vector_cores", "clock_mhz"):
        assert d["sources"][key]
    assert "Model.aicpuMachineNumber=" in d["sources"]["cube_cores"]
    # the clock is the one thing the cost model cannot be told: it is reported, not hidden
    clock_lines = [m for m in d["mismatches"] if m.startswith("clock_mhz")]
    assert bool(clock_lines) == (d["clock_mhz"] != int(ini["AICoreSpec"]["cube_freq"]))
    assert d["clock_mhz"] == CYCLES_PER_US and not d["clock_configurable"]
    assert [m for m in d["mismatches"] if not m.startswith("clock_mhz")] == []


def test_peaks_come_from_the_platform_file():
    ini = platform_ini()
    plat = topology.read_platform()
    cores, hz = int(ini["SoCInfo"]["cube_core_cnt"]), int(ini["AICoreSpec"]["cube_freq"]) * 1e6

    def macs(key):
        m, k, n = (int(v) for v in ini["DtypeMKN"][key].split(","))
        return m * k * n

    assert plat.peaks["bf16"] == pytest.approx(cores * macs("Default") * 2 * hz)
    assert plat.peaks["fp8"] == pytest.approx(cores * macs("DT_FLOAT8_E4M3FN") * 2 * hz)
    assert plat.peaks["fp32"] == pytest.approx(cores * macs("DT_FLOAT") * 2 * hz)
    vec = (int(ini["SoCInfo"]["vector_core_cnt"]) * int(ini["VectorCoreSpec"]["vector_reg_width"])
           // 4 * int(ini["VectorCoreSpec"]["vec_freq"]) * 1e6)
    assert plat.peaks["vector_fp32"] == pytest.approx(vec)
    assert plat.hbm_bytes_per_s == pytest.approx(
        cores * int(ini["AICoreMemoryRates"]["ddr_rate"]) * hz)


def test_a_cube_dtype_the_file_does_not_support_has_no_peak(tmp_path):
    text = A5_PLATFORM_INI.read_text().replace(",f322f32,", ",")
    ini = tmp_path / "no_fp32_cube.ini"
    ini.write_text(text)
    assert "fp32" not in topology.read_platform(ini).peaks
    assert "bf16" in topology.read_platform(ini).peaks


def _config_with(tmp_path, args):
    cfg = json.loads(A5_COSTMODEL_JSON.read_text())
    cfg["global"]["simulation"]["args"] = args
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return path


def test_config_keys_left_out_take_pypto_defaults(tmp_path):
    sim = topology.simulated(_config_with(tmp_path, ["Model.deviceArch=A5"]))
    assert (sim.cube_cores, sim.vector_cores) == (24, 48)  # the A2/A3 shape
    assert "default" in sim.sources["cube_cores"]
    d = topology.describe(config_json=_config_with(tmp_path, ["Model.deviceArch=A5"]))
    assert any(m.startswith("cube_cores: simulated 24") for m in d["mismatches"])


def test_inconsistent_core_split_is_refused(tmp_path):
    path = _config_with(tmp_path, ["Model.coreMachineNumberPerAICPU=10"])
    with pytest.raises(topology.TopologyError, match="coreMachineNumberPerAICPU 10"):
        topology.simulated(path)


def test_describe_cli_prints_json():
    out = subprocess.run([sys.executable, "-m", "harness.platforms.a5sim", "--describe"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert {"cube_cores", "vector_cores", "clock_mhz", "sources"} <= set(d)


def test_cost_model_builds_the_described_topology(a5sim, tmp_path, monkeypatch):
    """One small kernel: the stat report's core counts and the swim lanes equal describe()."""
    from goldens.config import TINY
    monkeypatch.setenv("V41_KEEP_RUN_DIR", "1")  # keep CostModelSimulationOutput to read it
    platform = A5SimPlatform(run_root=tmp_path)
    program = platform.compile(KernelSpec("v41.rmsnorm"), TINY, {"tokens": 2})
    h = TINY.hidden_size
    tensors = {"x": torch.ones(2, h, dtype=torch.bfloat16),
               "weight": torch.ones(h, dtype=torch.bfloat16),
               "y": torch.zeros(2, h, dtype=torch.bfloat16)}
    try:
        result = platform.launch(program, 0, tensors)
    finally:
        platform.close()
    result.raise_for_error()
    d = topology.describe()
    assert result.cost.cores == d["cube_cores"] + d["vector_cores"]
    (cm,) = list(tmp_path.glob("**/CostModelSimulationOutput"))
    stat = (cm / "_simulate.stat.report.txt").read_text()
    assert int(re.search(r"Cube Count\.+:\s+(\d+)", stat).group(1)) == d["cube_cores"]
    assert int(re.search(r"Vector Count\.+:\s+(\d+)", stat).group(1)) == d["vector_cores"]
    lanes = Counter(lane.get("coreType") for lane in
                    json.loads((cm / "_simulate.swim.json").read_text()))
    assert (lanes["AIC"], lanes["AIV"]) == (d["cube_cores"], d["vector_cores"])
