"""pytest options of the harness and axis-based selection.

``--tp/--dp/--ep/--wiring/--preset`` select: an item whose parameters carry that axis
with another value is deselected, so ``pytest cases/ -k c1a_reindex --tp 4`` runs exactly
the tp-4 C1A Reindex cases in one process (shapes are never fixed at import).
``--platform``, ``--device`` and ``--save-data`` configure the run and reach tests
through the ``run_options`` fixture.  A ``--tp/--dp/--ep`` value the harness refuses is a
usage error (exit 4) with the harness's message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

SELECTING_AXES = ("tp", "dp", "ep", "wiring", "preset")


@dataclass(frozen=True)
class RunOptions:
    platform: str
    devices: tuple[int, ...] | None
    save_data: str | None
    wiring: str
    preset: str | None


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("v41", "V4.1 harness")
    g.addoption("--tp", type=int, default=None, help="run only cases with this TP size")
    g.addoption("--dp", type=int, default=None, help="run only cases with this DP size")
    g.addoption("--ep", type=int, default=None, help="run only cases with this EP size")
    g.addoption("--platform", default="a5sim", choices=("a5sim", "a5"),
                help="platform under test (default a5sim)")
    g.addoption("--device", default=None,
                help="comma-separated card ids allocated to this process (a5)")
    g.addoption("--preset", default=None, choices=("tiny", "flash"),
                help="run only cases of this model preset")
    g.addoption("--wiring", default="both", choices=("both", "replicated", "sharded"),
                help="decode attention wiring(s) to validate (default both)")
    g.addoption("--save-data", nargs="?", const="out/data", default=None,
                help="save inputs, goldens and outputs under this folder (default out/data)")
    g.addoption("--verify", default=None, choices=("tensor", "lowered"),
                help="a5sim pass verification: tensor graph only (default) or also every "
                     "lowering pass (sets V41_VERIFY for this run and its workers)")


def pytest_configure(config: pytest.Config) -> None:
    _refuse_bad_axis_values(config)
    level = config.getoption("verify", None)
    if level is not None:  # env, so xdist workers and launch workers inherit it
        os.environ["V41_VERIFY"] = level


def _refuse_bad_axis_values(config: pytest.Config) -> None:
    """A selecting value the harness refuses is a usage error with the harness's message
    (exit 4), not a run in which every case is deselected."""
    from harness.case import CaseError, validate_axis_values
    try:
        validate_axis_values(**{a: config.getoption(a, None) for a in ("tp", "dp", "ep")})
    except CaseError as err:
        raise pytest.UsageError(str(err)) from None


def _parse_devices(text: str | None) -> tuple[int, ...] | None:
    if text is None or text == "":
        return None
    try:
        ids = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise pytest.UsageError(f"--device: {text!r} is not a comma-separated list of card ids")
    if len(set(ids)) != len(ids) or min(ids) < 0:
        raise pytest.UsageError(f"--device: {text!r} must list distinct non-negative ids")
    return ids


def _wanted(config: pytest.Config, axis: str):
    value = config.getoption(axis)
    if axis == "wiring" and value == "both":
        return None
    return value


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        mismatch = any(
            (want := _wanted(config, axis)) is not None and axis in params and params[axis] != want
            for axis in SELECTING_AXES)
        (drop if mismatch else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def run_options(pytestconfig: pytest.Config) -> RunOptions:
    """The run's platform, allocated devices, save folder, wiring and preset filter."""
    return RunOptions(
        platform=pytestconfig.getoption("platform"),
        devices=_parse_devices(pytestconfig.getoption("device")),
        save_data=pytestconfig.getoption("save_data"),
        wiring=pytestconfig.getoption("wiring"),
        preset=pytestconfig.getoption("preset"),
    )
