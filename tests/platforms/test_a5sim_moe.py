"""a5sim: the ``moe`` composition (mHC, router, shared expert, EP dispatch, routed experts
per rank, EP combine, moe_combine, mHC post) on v41 kernels passes at EP2 (TP1, DP2: one
group active, one idle, so every routed row of group 0 whose expert lives on rank 1
crosses the EP transport both ways), and a defect is caught by the verdict that names it:
a corrupted output row, a non-zero inactive MoE row, and a wrong kernel variant inside the
composition (routed experts, shared expert, combine)."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.entries import moe
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed

ENTRY = registry.get("moe")
CASE = next(c for c in ENTRY.slow_cases if c.ep == 2)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.fixture(scope="module")
def run(numerics):
    verdicts, out, gold = run_with(numerics, CASE, ENTRY.kernels["a5sim"])
    return verdicts, out, gold


DEFECTS = [
    (lambda a: a["moe_output"][0, 2, 7].mul_(1.5).add_(0.5), ("g0.r0.moe_output", "row_rms")),
    (lambda a: a["moe_output"][0, 7, 0].fill_(1.0), ("g0.r0.moe_output", "zero_rows")),
    (lambda a: a["x_hc_out"][1, 3, 1].mul_(1.5), ("g1.r0.x_hc_out", "row_rms")),
]
WRONG_KERNELS = [("v41.routed_experts", "swap_nibbles"), ("v41.shared_expert", "silu_on_u"),
                 ("v41.moe_combine", "drop_last_expert")]


def test_moe_composition_passes_crosses_ranks_and_each_defect_is_caught_by_name(numerics, run):
    """One test over the one kernel run (several would each build it on their own xdist
    worker); each wrong kernel variant reruns the composition, reusing the run's other
    launches."""
    verdicts, out, gold = run
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    n = CASE.group_active(0)
    assert bool((gold["moe_output"][0, :n] != 0).any()) and bool((out["moe_output"][1] == 0).all())

    inputs = ENTRY.build_inputs(CASE.config, CASE)
    for defect, expected in DEFECTS:
        actual = clone_tensors(out)
        defect(actual)
        assert expected in failing(ENTRY.compare(CASE.config, CASE, inputs, gold, actual)), expected

    for module, variant in WRONG_KERNELS:
        verdicts, _, _ = run_with(numerics, CASE, moe.make_sut({module: variant}))
        assert ("g0.r0.moe_output", "row_rms") in failing(verdicts), (module, variant)


def test_an_ep_world_that_is_not_dp_times_tp_is_refused_before_any_launch():
    case = CASE.with_(ep=4)
    inputs = ENTRY.build_inputs(case.config, case)
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=r"case.ep: 4 must equal dp \* tp = 2"):
        ENTRY.kernels["a5sim"](None, case.config, case, inputs)
    for k, v in before.items():
        assert torch.equal(v.view(torch.uint8) if v.element_size() == 1 else v,
                           inputs[k].view(torch.uint8) if v.element_size() == 1 else inputs[k]), k
