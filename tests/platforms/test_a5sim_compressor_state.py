"""a5sim: the compressor-state regression (two consecutive v41.compressor_ratio2 launches).
The fixture holds every situation the contract names; wrong ring handling fails through
the two-call harness; an idle second call (``num_tokens = 0``) leaves the caches and the
ring exactly as the first call left them."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import compressor_ratio2 as ratio2
from harness.entries import compressor_state as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed

CASE = Case(entry="compressor_state", tokens=20, requests=4)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


def test_fixture_holds_the_contract_situations():
    config = CASE.config
    inputs = entry_mod.build_inputs(config, CASE)
    c1, c2 = (entry_mod.call_inputs(inputs, tag, {}) for tag in entry_mod.CALLS)
    t1, t2 = c1["state_block_table"][:, 0].tolist(), c2["state_block_table"][:, 0].tolist()
    q2 = c2["query_start_loc"].tolist()
    lens2 = [q2[r + 1] - q2[r] for r in range(len(t2))]
    assert t2[0] == t1[0] and c2["position_ids"][0] == 0  # block reuse by a new request
    assert t2[1:] == [b if i < len(t2) - 2 else -1 for i, b in enumerate(t1[:0:-1])]
    assert max(lens2) > config.cache.state_capacity  # a chunk longer than the ring
    assert 0 in lens2 and -1 in t2  # an empty and an inactive request
    for c in (c1, c2):  # trailing padding with live-looking slots
        n = int(c["num_tokens"][0])
        assert c["x"].shape[0] > n and (c["compressed_slots"][n:] >= 0).all()
        assert ratio2.validate_launch(config, c) >= 1


@pytest.mark.parametrize("variant,expect", [
    ("first_rows_to_ring", {("state_cache", "state_rows")}),
    ("read_after_write", {("compressed_kv.dequantized", "cache_rel_l2")}),
])
def test_wrong_ring_handling_fails(a5sim, variant, expect):
    verdicts, _, _ = run_with(a5sim, CASE, entry_mod.kernel_sut(variant=variant))
    assert not all_passed(verdicts), f"variant {variant} passed the comparison"
    assert expect <= failing(verdicts), [v.line() for v in verdicts if not v.passed]


def test_idle_second_call_touches_nothing(a5sim):
    """Call 2 with num_tokens = 0: the final caches and ring are byte-identical to the
    state after call 1 alone."""
    case = Case(entry="compressor_state", tokens=12, active_tokens=0, requests=3, seed=2)
    inputs = entry_mod.build_inputs(case.config, case)
    assert int(inputs["c2.num_tokens"][0]) == 0
    both = entry_mod.kernel_sut()(a5sim, case.config, case, clone_tensors(inputs))
    state = {k: inputs[k] for k in ratio2.OUTPUTS}
    first = ratio2.kernel_sut()(a5sim, case.config, case,
                                entry_mod.call_inputs(clone_tensors(inputs), "c1", state))
    assert both.costs[0]["launches"] == 2
    for name in ratio2.OUTPUTS:
        assert torch.equal(both.outputs[name], first.outputs[name]), name
    gold = registry.get("compressor_state").golden(case.config, case, clone_tensors(inputs))
    assert all_passed(entry_mod.compare(case.config, case, inputs, gold, both.outputs))
