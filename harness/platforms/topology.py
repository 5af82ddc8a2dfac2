"""The A5 machine behind a5sim: the platform file's figures and the topology the cost model
actually simulates.

Two sources, kept apart on purpose:

* :func:`read_platform` reads the vendored compiler platform file
  (``data/Ascend950PR_9579.ini``): core counts, clocks, HBM bytes per cycle and the cube's
  fractal shape per dtype, from which :class:`PlatformFile` derives per-dtype peaks.
* :func:`simulated` reads the ``Model.<key>=<value>`` entries of the cost-model config json
  (``data/tile_fwk_config_a5_quiet.json``, ``global.simulation.args``) and applies pypto
  0.2.0's defaults for keys it does not set: cube cores = device x AICPU x cube per AICPU,
  vector cores = device x AICPU x vector per AICPU.  The clock is not a config key in
  pypto 0.2.0: the cost model counts cycles and its own time labels convert them at a
  fixed 1800 MHz (``--time_convert_denominator=1800`` built into
  ``libtile_fwk_simulation.so``), so that is the clock cycles are converted with.

:func:`describe` returns the effective simulated topology with the source of every value
and every disagreement with the platform file; ``python -m harness.platforms.a5sim
--describe`` prints it as JSON.  Nothing here imports pypto.
"""

from __future__ import annotations

import argparse
import configparser
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.platforms.pypto_env import A5_COSTMODEL_JSON, A5_PLATFORM_INI

# compute dtypes a kernel's work may declare (keys of Work.flops)
CUBE_BF16 = "bf16"
CUBE_FP8 = "fp8"
CUBE_FP32 = "fp32"
VECTOR_FP32 = "vector_fp32"
CUBE_DTYPES = (CUBE_BF16, CUBE_FP8, CUBE_FP32)
COMPUTE_DTYPES = (*CUBE_DTYPES, VECTOR_FP32)

# cube dtype -> ([DtypeMKN] key of the platform file, operand pair in Intrinsic_mmad's list)
_CUBE_FORMS = {CUBE_BF16: ("Default", "bf162f32"), CUBE_FP8: ("DT_FLOAT8_E4M3FN", "e4m3e4m3"),
               CUBE_FP32: ("DT_FLOAT", "f322f32")}
_FP32_BYTES = 4

# pypto 0.2.0 cost model (framework/src/cost_model/simulation/config/ModelConfig.h defaults)
MODEL_DEFAULTS = {"deviceMachineNumber": 1, "aicpuMachineNumber": 6,
                  "coreMachineNumberPerAICPU": 12, "cubeMachineNumberPerAICPU": 4,
                  "vecMachineNumberPerAICPU": 8}
SIM_CLOCK_MHZ = 1800
SIM_CLOCK_SOURCE = ("pypto 0.2.0 cost model: fixed --time_convert_denominator=1800 in "
                    "libtile_fwk_simulation.so (no config key)")


class TopologyError(ValueError):
    """The platform file or the cost-model config is missing a value or inconsistent."""


@dataclass(frozen=True)
class PlatformFile:
    """Figures of the compiler platform file; peaks are per second over the whole chip."""

    path: str
    soc: str
    cube_cores: int
    vector_cores: int
    cube_freq_mhz: int
    vector_freq_mhz: int
    ddr_bytes_per_cycle: int  # per cube core ([AICoreMemoryRates] ddr_rate)
    cube_mkn: dict[str, tuple[int, int, int]]  # cube dtype -> fractal (m, k, n) per cycle
    vector_reg_bytes: int  # bytes one vector core processes per cycle

    @property
    def hbm_bytes_per_s(self) -> float:
        """cube cores x ddr_rate x cube_freq (the platform file's HBM figure)."""
        return self.cube_cores * self.ddr_bytes_per_cycle * self.cube_freq_mhz * 1e6

    @property
    def peaks(self) -> dict[str, float]:
        """FLOP/s per compute dtype: cube = cores x m*k*n MAC/cycle x 2 x clock (only the
        dtypes the file's cube supports); vector FP32 = cores x reg bytes / 4 lanes x 1
        operation per lane per cycle x clock."""
        hz = self.cube_freq_mhz * 1e6
        out = {d: self.cube_cores * m * k * n * 2 * hz for d, (m, k, n) in self.cube_mkn.items()}
        out[VECTOR_FP32] = (self.vector_cores * (self.vector_reg_bytes // _FP32_BYTES)
                            * self.vector_freq_mhz * 1e6)
        return out


@dataclass(frozen=True)
class SimTopology:
    """What the cost model simulates; ``sources`` says where each value came from."""

    cube_cores: int
    vector_cores: int
    clock_mhz: int
    clock_configurable: bool
    sources: dict[str, str] = field(default_factory=dict)


def _ini(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str  # keep DT_FLOAT8_E4M3FN etc. as written
    if not cp.read(path):
        raise TopologyError(f"platform file: {path} cannot be read")
    return cp


def _int(cp: configparser.ConfigParser, section: str, key: str) -> int:
    try:
        return int(cp[section][key])
    except KeyError:
        raise TopologyError(f"platform file: [{section}] {key} is missing") from None
    except ValueError:
        raise TopologyError(f"platform file: [{section}] {key}={cp[section][key]!r} is not "
                            f"an integer") from None


def read_platform(path: Path = A5_PLATFORM_INI) -> PlatformFile:
    """The figures of the platform ini at ``path``; raises TopologyError naming a missing
    or malformed key."""
    cp = _ini(Path(path))
    mmad = next((v for k, v in cp["AICoreintrinsicDtypeMap"].items()
                 if v.startswith("Intrinsic_mmad|")), "") if "AICoreintrinsicDtypeMap" in cp else ""
    pairs = set(mmad.partition("|")[2].split(","))
    mkn = {}
    for dtype, (key, pair) in _CUBE_FORMS.items():
        if pair in pairs and "DtypeMKN" in cp and key in cp["DtypeMKN"]:
            m, k, n = (int(v) for v in cp["DtypeMKN"][key].split(","))
            mkn[dtype] = (m, k, n)
    if CUBE_BF16 not in mkn:
        raise TopologyError("platform file: no BF16 cube form ([DtypeMKN] Default with "
                            "bf162f32 in Intrinsic_mmad)")
    return PlatformFile(
        path=str(path), soc=cp["version"].get("SoC_version", "?"),
        cube_cores=_int(cp, "SoCInfo", "cube_core_cnt"),
        vector_cores=_int(cp, "SoCInfo", "vector_core_cnt"),
        cube_freq_mhz=_int(cp, "AICoreSpec", "cube_freq"),
        vector_freq_mhz=_int(cp, "VectorCoreSpec", "vec_freq"),
        ddr_bytes_per_cycle=_int(cp, "AICoreMemoryRates", "ddr_rate"),
        cube_mkn=mkn, vector_reg_bytes=_int(cp, "VectorCoreSpec", "vector_reg_width"))


def model_args(config_json: Path = A5_COSTMODEL_JSON) -> dict[str, str]:
    """``Model.<key>=<value>`` entries of the config's ``global.simulation.args``."""
    try:
        args = json.loads(Path(config_json).read_text())["global"]["simulation"]["args"]
    except (OSError, KeyError, json.JSONDecodeError) as err:
        raise TopologyError(f"cost-model config: {config_json}: no global.simulation.args "
                            f"({err})") from None
    out = {}
    for a in args:
        key, eq, value = a.partition("=")
        if eq and key.startswith("Model."):
            out[key[len("Model."):]] = value
    return out


def simulated(config_json: Path = A5_COSTMODEL_JSON) -> SimTopology:
    """The topology pypto's cost model builds from ``config_json`` (defaults for keys the
    config leaves out); raises TopologyError where pypto would refuse the config."""
    args = model_args(config_json)
    val, src = {}, {}
    name = Path(config_json).name
    for key, default in MODEL_DEFAULTS.items():
        if key in args:
            val[key], src[key] = int(args[key]), f"{name}: Model.{key}={args[key]}"
        else:
            val[key], src[key] = default, f"pypto 0.2.0 default {key}={default}"
    per = val["cubeMachineNumberPerAICPU"] + val["vecMachineNumberPerAICPU"]
    if val["coreMachineNumberPerAICPU"] != per:
        raise TopologyError(f"cost-model config: Model.coreMachineNumberPerAICPU "
                            f"{val['coreMachineNumberPerAICPU']} must equal cube + vector per "
                            f"AICPU ({per})")
    groups = val["deviceMachineNumber"] * val["aicpuMachineNumber"]
    how = "; ".join(src[k] for k in ("deviceMachineNumber", "aicpuMachineNumber"))
    return SimTopology(
        cube_cores=groups * val["cubeMachineNumberPerAICPU"],
        vector_cores=groups * val["vecMachineNumberPerAICPU"],
        clock_mhz=SIM_CLOCK_MHZ, clock_configurable=False,
        sources={"cube_cores": f"{how}; {src['cubeMachineNumberPerAICPU']}",
                 "vector_cores": f"{how}; {src['vecMachineNumberPerAICPU']}",
                 "clock_mhz": SIM_CLOCK_SOURCE})


def mismatches(sim: SimTopology, plat: PlatformFile) -> list[str]:
    """One line per simulated value that differs from the platform file."""
    out = []
    for name, s, p in (("cube_cores", sim.cube_cores, plat.cube_cores),
                       ("vector_cores", sim.vector_cores, plat.vector_cores),
                       ("clock_mhz", sim.clock_mhz, plat.cube_freq_mhz)):
        if s != p:
            why = "" if name != "clock_mhz" or sim.clock_configurable else \
                " (not configurable in pypto 0.2.0's cost model)"
            out.append(f"{name}: simulated {s}, platform file {p}{why}")
    return out


def describe(platform_ini: Path = A5_PLATFORM_INI,
             config_json: Path = A5_COSTMODEL_JSON) -> dict:
    """JSON-ready effective simulated topology: ``cube_cores``, ``vector_cores``,
    ``clock_mhz``, ``sources`` (where each came from), ``platform`` (the file's figures and
    peaks) and ``mismatches`` (simulated values that differ from the platform file)."""
    sim, plat = simulated(config_json), read_platform(platform_ini)
    return {"cube_cores": sim.cube_cores, "vector_cores": sim.vector_cores,
            "clock_mhz": sim.clock_mhz, "clock_configurable": sim.clock_configurable,
            "sources": dict(sim.sources), "config": str(config_json),
            "platform": {"file": plat.path, "soc": plat.soc, "cube_cores": plat.cube_cores,
                         "vector_cores": plat.vector_cores, "clock_mhz": plat.cube_freq_mhz,
                         "hbm_bytes_per_s": plat.hbm_bytes_per_s, "peak_flops": plat.peaks},
            "mismatches": mismatches(sim, plat)}


def summary(desc: dict | None = None) -> str:
    """One line for bench tables: the simulated topology and every mismatch."""
    d = desc or describe()
    line = (f"simulated A5: {d['cube_cores']} cube + {d['vector_cores']} vector cores, cycles "
            f"converted at {d['clock_mhz']} MHz")
    return line + (f"; differs from {Path(d['platform']['file']).name}: "
                   + "; ".join(d["mismatches"]) if d["mismatches"] else "; matches the "
                   "platform file")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.platforms.a5sim",
                                 description="The A5 topology the a5sim cost model simulates.")
    ap.add_argument("--describe", action="store_true",
                    help="print the effective simulated topology as JSON")
    args = ap.parse_args(argv)
    if not args.describe:
        ap.print_help()
        return 2
    json.dump(describe(), sys.stdout, indent=2)
    print()
    return 0
