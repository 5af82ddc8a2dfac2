"""The test run's wall-time wiring: the kernel cases of a ``cases/`` module share one a5sim
platform (one launch worker) and never a golden-alt case; under xdist the controller hands
out one test at a time unless the run names its own distribution, and the workers list
kernel-launching tests first (the lowered-verification module before all), heaviest first."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness_fakes import FakePlatform, fakes

from harness import pytest_cases, registry
from harness.case import Case
from harness.pytest_plugin import RunOptions

ROOT = Path(__file__).resolve().parents[2]


def _options(platform: str = "a5sim") -> RunOptions:
    return RunOptions(platform=platform, devices=None, save_data=None, wiring="both", preset=None)


class _Closing(FakePlatform):
    def __init__(self):
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def spied(monkeypatch):
    """(platforms load_platform made, (entry, platform) of every run_case call)."""
    made, seen = [], []

    def load(name, devices=None, cost_model=None):
        made.append(_Closing())
        made[-1].cost_model = cost_model
        return made[-1]

    real = pytest_cases.run_case

    def spy(case, **kw):
        seen.append((case.entry, kw["platform"]))
        return real(case, **kw)
    monkeypatch.setattr(pytest_cases, "load_platform", load)
    monkeypatch.setattr(pytest_cases, "run_case", spy)
    with registry.registered(*fakes().values()):
        yield made, seen


def test_kernel_cases_share_one_platform_which_is_closed_after(spied):
    made, seen = spied
    with pytest_cases.shared_platform(_options()):
        for name in ("fake_kernel", "fake_kernel", "fake_alt"):
            pytest_cases.check_case(registry.get(name).matrix[0], _options())
        assert len(made) == 1 and not made[0].closed
    assert made[0].closed
    assert seen == [("fake_kernel", made[0]), ("fake_kernel", made[0]), ("fake_alt", None)]


def test_the_shared_platform_runs_the_cost_model_only_when_the_run_asks(spied):
    made, _ = spied
    with pytest_cases.shared_platform(_options()):
        pass
    with pytest_cases.shared_platform(RunOptions(platform="a5sim", devices=None, save_data=None,
                                                 wiring="both", preset=None, cost_model=True)):
        pass
    assert [p.cost_model for p in made] == [False, True]


@pytest.mark.parametrize("flag,env,expected", [(False, None, False), (True, None, True),
                                               (False, "1", True), (False, "0", False),
                                               (True, "0", True)])
def test_cost_model_option_then_environment_then_off(monkeypatch, flag, env, expected):
    from harness import pytest_plugin
    from harness.platforms.a5sim import ENV_COST_MODEL
    if env is None:
        monkeypatch.delenv(ENV_COST_MODEL, raising=False)
    else:
        monkeypatch.setenv(ENV_COST_MODEL, env)
    config = SimpleNamespace(getoption=lambda name: flag if name == "cost_model" else None)
    assert pytest_plugin._cost_model(config) is expected


def test_a_bad_cost_model_environment_value_is_refused_by_name(monkeypatch):
    from harness import pytest_plugin
    from harness.platforms.base import PlatformError
    monkeypatch.setenv("V41_A5SIM_COST_MODEL", "off")
    config = SimpleNamespace(getoption=lambda name: False)
    with pytest.raises(PlatformError, match="V41_A5SIM_COST_MODEL: 'off'"):
        pytest_plugin._cost_model(config)


def test_without_a_shared_platform_each_case_loads_its_own(spied):
    made, seen = spied
    pytest_cases.check_case(registry.get("fake_kernel").matrix[0], _options())
    assert seen == [("fake_kernel", None)]


def test_a_card_platform_is_never_shared(spied):
    made, _ = spied
    with pytest_cases.shared_platform(_options("a5")):
        assert pytest_cases._SHARED == {}
    assert made == []


def _root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _item(nodeid: str, case: Case | None = None, golden_alt: bool = False):
    marks = {"golden_alt": object()} if golden_alt else {}
    return SimpleNamespace(nodeid=nodeid, callspec=SimpleNamespace(params={"case": case} if case else {}),
                           get_closest_marker=marks.get)


def test_workers_list_kernel_tests_first_heaviest_first():
    conftest = _root_conftest()
    modes = "cases/test_attention_modes.py::test_attention_mode"
    items = [_item("tests/goldens/test_mhc.py::test_a"),
             _item("tests/platforms/test_a5sim_lowered.py::test_l[tp1]", Case(entry="decode_swa")),
             _item("cases/test_rmsnorm.py::test_rmsnorm[a]", Case(entry="rmsnorm")),
             _item(f"{modes}[tp1]", Case(entry="decode_swa")),
             _item(f"{modes}[alt]", Case(entry="golden_alt_decode_attn_swa", tp=4), golden_alt=True),
             _item(f"{modes}[tp4]", Case(entry="decode_swa", tp=4, epochs=2)),
             _item("tests/platforms/test_a5sim_decode_attn.py::test_b"),
             _item("tests/platforms/test_a5sim_gate.py::test_c")]
    config = SimpleNamespace(workerinput={})
    conftest.pytest_collection_modifyitems(config, items)
    assert [i.nodeid.rsplit("/", 1)[-1] for i in items] == [
        "test_a5sim_lowered.py::test_l[tp1]",
        "test_attention_modes.py::test_attention_mode[tp4]",
        "test_attention_modes.py::test_attention_mode[tp1]",
        "test_attention_modes.py::test_attention_mode[alt]",
        "test_a5sim_decode_attn.py::test_b",
        "test_rmsnorm.py::test_rmsnorm[a]", "test_a5sim_gate.py::test_c",  # pytest's order
        "test_mhc.py::test_a"]


def _config(*args: str, dist: str = "load", worker: bool = False):
    config = SimpleNamespace(option=SimpleNamespace(dist=dist, maxschedchunk=None),
                             invocation_params=SimpleNamespace(args=args), getini=lambda name: [])
    if worker:
        config.workerinput = {}
    return config


@pytest.mark.parametrize("args,dist,worker,chunk", [
    ((), "load", False, 1),  # `pytest -n 2`: one test at a time
    (("--maxschedchunk", "8"), "load", False, None),  # the run's own choice stands
    (("--dist=load",), "load", False, None),
    ((), "worksteal", False, None),
    ((), "no", False, None),  # no xdist
    ((), "load", True, None),  # an xdist worker: the controller schedules
])
def test_the_load_scheduler_hands_out_one_test_at_a_time_by_default(args, dist, worker, chunk):
    config = _config(*args, dist=dist, worker=worker)
    _root_conftest().pytest_configure(config)
    assert config.option.maxschedchunk == chunk
