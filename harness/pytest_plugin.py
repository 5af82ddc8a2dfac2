"""pytest options of the harness and axis-based selection.

``--tp/--dp/--ep/--wiring/--preset`` select: an item whose parameters carry that axis
with another value is deselected, so ``pytest cases/ -k c1a_reindex --tp 4`` runs exactly
the tp-4 C1A Reindex cases in one process (shapes are never fixed at import).
A run that selects nothing itself (no ``-k``, no ``-m`` of its own, no axis option, no
node id, no ``--full-matrix``, not the queue runner's ``--collect-nodes``) takes only the
representative cases of the composed entries: items marked ``matrix`` (the rest of their
TINY matrix, :attr:`harness.registry.Entry.representative`) are deselected and the header
says how many, so the default run stays within the CI budget; ``python -m harness run
--all`` and any selecting run take every case.
``--platform``, ``--device``, ``--save-data`` and ``--cost-model`` configure the run and
reach tests through the ``run_options`` fixture.  The a5sim case launches check numerics
only unless ``--cost-model`` is given (or ``V41_A5SIM_COST_MODEL`` is set): a case asserts
its outputs and cache bytes, never its estimate, and the cost model doubles a launch's
time; the estimates are ``python -m harness.bench``'s (CI's ``--gate --check``) and the
main job's.  A ``--tp/--dp/--ep`` value the harness refuses is a
usage error (exit 4) with the harness's message.
"""

from __future__ import annotations

import os
import shlex
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
    cost_model: bool = False  # a5sim case launches also run pypto's A5 cost model


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
    g.addoption("--cost-model", action="store_true",
                help="also run pypto's A5 cost model on every a5sim case launch (default: "
                     "numerics only, unless V41_A5SIM_COST_MODEL is set; the estimates are "
                     "python -m harness.bench's)")
    g.addoption("--full-matrix", action="store_true",
                help="also run the matrix-marked cases in a run that selects nothing itself")


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


def _user_args(config: pytest.Config) -> list[str]:
    """The run's own arguments (command line and PYTEST_ADDOPTS; not the ini's addopts)."""
    return [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]


def representative_only(config: pytest.Config) -> bool:
    """Whether ``matrix``-marked items are left out: the run selects nothing itself."""
    args = _user_args(config)
    return not (config.getoption("full_matrix") or config.option.keyword
                or any(a == "-m" or a.startswith("-m") for a in args)
                or any("::" in a for a in args)
                or any(_wanted(config, axis) is not None for axis in SELECTING_AXES)
                or config.getoption("collect_nodes", None))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    tier = representative_only(config)
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        mismatch = any(
            (want := _wanted(config, axis)) is not None and axis in params and params[axis] != want
            for axis in SELECTING_AXES)
        (drop if mismatch or (tier and item.get_closest_marker("matrix")) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str | None:
    if representative_only(config):
        return ("v41: representative cases only (matrix-marked cases deselected; -k, -m, an axis "
                "option, a node id or --full-matrix runs them)")
    return None


@pytest.fixture(scope="session")
def run_options(pytestconfig: pytest.Config) -> RunOptions:
    """The run's platform, allocated devices, save folder, wiring, preset filter and whether
    a5sim case launches run the cost model."""
    return RunOptions(
        platform=pytestconfig.getoption("platform"),
        devices=_parse_devices(pytestconfig.getoption("device")),
        save_data=pytestconfig.getoption("save_data"),
        wiring=pytestconfig.getoption("wiring"),
        preset=pytestconfig.getoption("preset"),
        cost_model=_cost_model(pytestconfig),
    )


def _cost_model(config: pytest.Config) -> bool:
    """``--cost-model``, else ``V41_A5SIM_COST_MODEL`` when set (its values checked by the
    platform), else False."""
    if config.getoption("cost_model"):
        return True
    from harness.platforms.a5sim import ENV_COST_MODEL, cost_model_from_env
    return cost_model_from_env() if ENV_COST_MODEL in os.environ else False
