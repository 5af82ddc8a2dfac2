"""a5sim: a decode Block (SWA attention composition, then the moe composition at EP2) on
v41 kernels passes, the FFN half is compared against its golden replayed on the SUT's own
attention-site streams, and a defect in either half is caught by the verdict naming it;
an EP world other than dp * tp is refused before any launch."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed

ENTRY = registry.get("decode_layer_swa")
CASE = ENTRY.slow_cases[0]


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.fixture(scope="module")
def run(numerics):
    return run_with(numerics, CASE, ENTRY.kernels["a5sim"])


DEFECTS = [
    (lambda a: a["ffn.moe_output"][0, 1, 3].mul_(1.5).add_(0.5), ("ffn.g0.r0.moe_output", "row_rms")),
    (lambda a: a["ffn.x_hc_out"][0, 5, 2].mul_(1.5), ("ffn.g0.r1.x_hc_out", "row_rms")),
    (lambda a: a["out"][0, 2].mul_(1.5), ("g0.out", "row_rel_l2")),  # SWA: the Attention budget
]


def test_the_block_passes_hands_the_pre_mix_over_and_a_defect_in_either_half_is_caught(run):
    """One test over the one kernel run (two tests would each build it on their own xdist
    worker)."""
    verdicts, out, gold = run
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    names = {v.output for v in verdicts}
    assert {"g0.out", "g0.x_hc_out", "ffn.g0.r0.moe_output", "ffn.g0.r1.x_hc_out"} <= names
    # the FFN site consumed the attention site's streams: its output differs from them
    assert not torch.equal(out["ffn.x_hc_out"], out["x_hc_out"])

    inputs = ENTRY.build_inputs(CASE.config, CASE)
    for defect, expected in DEFECTS:
        actual = clone_tensors(out)
        defect(actual)
        assert expected in failing(ENTRY.compare(CASE.config, CASE, inputs, gold, actual)), expected


def test_an_ep_world_other_than_dp_times_tp_is_refused_before_any_launch():
    case = CASE.with_(ep=4)
    inputs = ENTRY.build_inputs(case.config, case)
    with pytest.raises(ValueError, match=r"case.ep: 4 must equal dp \* tp = 2"):
        ENTRY.kernels["a5sim"](None, case.config, case, inputs)
