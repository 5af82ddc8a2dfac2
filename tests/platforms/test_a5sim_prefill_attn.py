"""a5sim: the ``prefill_attn_<mode>`` kernel leaves on a prefill batch with reserved
capacity (12 rows, 10 active, two requests of several new tokens over a cached prefix).
Per mode, one real run of the v41 kernels passes as produced and each defect is caught by
the verdict that names it: a corrupted output row, a write into the neighbour layer's
window (outside the mode's ownership), a non-zero inactive row; bad window metadata is
refused on the host before anything is compiled or launched, nothing written.

SWA (window only) and C1A Reindex (index query, candidate mask, paged indexer over the
compressed cache) bound the building blocks a prefill leaf chains."""

from __future__ import annotations

import pytest
import torch

from goldens.config import Mode
from harness import registry
from harness.case import Case
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import assert_refused_unchanged

MODES = ("swa", "c1a_reindex")


def _case(mode: str) -> Case:
    return Case(entry=f"prefill_attn_{mode}", tokens=12, active_tokens=10, requests=2, seed=3)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.fixture(scope="module", params=MODES)
def run(numerics, request):
    case = _case(request.param)
    verdicts, out, gold = run_with(numerics, case, registry.get(case.entry).kernels["a5sim"])
    return request.param, case, verdicts, out, gold


def _compare(case, out, gold):
    entry = registry.get(case.entry)
    return entry.compare(case.config, case, entry.build_inputs(case.config, case), gold, out)


def test_prefill_leaf_passes_and_each_defect_is_caught_by_name(run):
    mode, case, verdicts, out, gold = run
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]

    bad = clone_tensors(out)
    bad["out"][0, 4] *= 1.5  # a corrupted kernel output row (SWA: the Attention budget)
    check = "row_rel_l2" if mode == "swa" else "row_rms"
    assert ("g0.out", check) in failing(_compare(case, bad, gold))

    bad = clone_tensors(out)
    layer = case.config.representative_layer(Mode(mode))
    near = layer + 1 if layer + 1 < case.config.num_layers else layer - 1
    key = f"g0.cache.window_kv.L{near}"
    bad[key].view(torch.uint8).view(-1)[7] ^= 0x10
    assert failing(_compare(case, bad, gold)) == {(key, "exact_bytes")}

    bad = clone_tensors(out)
    bad["out"][0, 11, 2] = 1.0  # inactive row 11 (10 active of 12)
    assert failing(_compare(case, bad, gold)) == {("g0.out", "zero_rows")}


@pytest.mark.parametrize("mode", MODES)
def test_bad_prefill_metadata_is_refused_before_any_launch(mode):
    case = _case(mode)
    entry = registry.get(case.entry)
    inputs = entry.build_inputs(case.config, case)
    table = inputs["g0.meta.window_block_table"]
    blocks = inputs[f"g0.cache.window_kv.L{case.config.representative_layer(Mode(mode))}"].shape[0]
    table[table >= 0] = table[table >= 0] + blocks  # every page past the window cache
    assert_refused_unchanged(entry, case, inputs, r"window_slots\[\d+\]: \d+ is past the cache")
