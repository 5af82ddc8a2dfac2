"""a5sim without the cost model (``cost_model=False`` / ``V41_A5SIM_COST_MODEL=0``): the
interpreter's outputs reach the kernel's tensors bit for bit as on the full path, the
case is checked as usual, and no launch carries an estimate."""

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.platforms import a5sim as a5sim_mod
from harness.platforms import verify
from harness.platforms.a5sim import A5SimPlatform
from harness.platforms.base import PlatformError
from harness.runner import run_case

# an elementwise kernel with InOut caches and a gather-heavy one on two ranks
CASES = (Case(entry="window_publish", tokens=40, active_tokens=33, requests=3),
         Case(entry="sparse_attention", tokens=6, tp=2, kind="sink", seed=5))


@pytest.fixture(scope="module")
def numerics_only():
    platform = A5SimPlatform(cost_model=False)
    yield platform
    platform.close()


def _outputs(platform, case):
    entry = registry.get(case.entry)
    inputs = entry.build_inputs(case.config, case)
    return entry.sut_for("a5sim")[1](platform, case.config, case, inputs).outputs


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.entry)
def test_numerics_only_gives_the_same_bits_and_no_estimate(a5sim, numerics_only, case):
    full, fast = _outputs(a5sim, case), _outputs(numerics_only, case)
    assert sorted(full) == sorted(fast)
    for name in full:
        assert torch.equal(full[name].view(torch.uint8), fast[name].view(torch.uint8)), name
    checked = run_case(case, platform=numerics_only)
    assert checked.status == "pass", checked.failure_text()
    assert checked.verify_level == "tensor"
    assert checked.estimated_a5_us() is None and checked.costs == []


def test_numerics_only_outputs_are_computed(numerics_only):
    """The copy-back really happens: the output is the golden's, not what it was given
    (the estimate-only level's counterpart keeps the given value)."""
    case = Case(entry="rmsnorm", tokens=3)
    entry = registry.get("rmsnorm")
    out = _outputs(numerics_only, case)
    golden = entry.golden(case.config, case, entry.build_inputs(case.config, case))
    for name in golden:
        assert torch.allclose(out[name].float(), golden[name].float(), atol=1e-2), name


def test_the_switch_is_checked(monkeypatch):
    monkeypatch.setenv(a5sim_mod.ENV_COST_MODEL, "off")
    with pytest.raises(PlatformError, match=r"V41_A5SIM_COST_MODEL: 'off' is not one of"):
        A5SimPlatform()
    monkeypatch.setenv(a5sim_mod.ENV_COST_MODEL, "0")
    assert A5SimPlatform().cost_model is False
    with pytest.raises(PlatformError, match="cost_model: False leaves nothing to run"):
        A5SimPlatform(verify=verify.ESTIMATE_LEVEL)
