"""a5sim: the six ``decode_attn_<mode>`` kernel leaves.  Per mode, one real run of the v41
kernels (TP2, 8 rows with 7 active, replicated) is compared as produced (it passes) and
with one defect at a time, each caught by the verdict that names it: a corrupted output
row, a write outside the mode's cache ownership, a non-zero inactive row; a rank whose
partial never reaches the transport window fails the run naming the stale rank; bad
metadata is refused on the host before anything is compiled or launched.

Cost: a mode's kernels run once, in one test (under xdist's one-test-at-a-time scheduling two
tests sharing the module-scoped run would each build it on their own worker).  The
stale-window run is made by the same fixture right after the real run, so every launch in
it reuses one of that run's launches (``attention_kernels.launch_key``): host work only.
"""

from __future__ import annotations

import re

import pytest
import torch

from goldens.config import Mode
from harness import registry
from harness.case import Case
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.transport import TpGroup, TransportError
from harness.verdict import all_passed
from platform_stubs import assert_refused_unchanged

MODES = ("swa", "c2a_full", "c2a_reuse", "c1a_full", "c1a_reindex", "c1a_reuse")


def _case(mode: str) -> Case:
    return Case(entry=f"decode_attn_{mode}", tp=2, tokens=8, active_tokens=7, requests=3, seed=3)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


def _drop_rank1(publish):
    def drop(self, rank, epoch, partial):
        if rank != 1:
            publish(self, rank, epoch, partial)
    return drop


@pytest.fixture(scope="module", params=MODES)
def mode(request):
    """The mode, module-scoped so each mode's tests run one after another (pytest groups
    them) and share :func:`run`."""
    return request.param


@pytest.fixture(scope="module")
def run(numerics, mode):
    """(case, verdicts, kernel outputs, golden, stale) of ``mode``: one kernel run, then the
    same case again with rank 1's partial never published to the reduce window (``stale``:
    the exception that run raised, or None)."""
    case = _case(mode)
    sut = registry.get(case.entry).kernels["a5sim"]
    verdicts, out, gold = run_with(numerics, case, sut)
    stale = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TpGroup, "publish_reduce", _drop_rank1(TpGroup.publish_reduce))
        try:
            run_with(numerics, case, sut)
        except Exception as err:  # noqa: BLE001 - the test asserts its type and text
            stale = err
    return case, verdicts, out, gold, stale


def _compare(case, out, gold):
    entry = registry.get(case.entry)
    return entry.compare(case.config, case, entry.build_inputs(case.config, case), gold, out)


def test_kernel_leaf_passes_and_each_defect_and_a_stale_window_are_caught_by_name(run, mode):
    case, verdicts, out, gold, stale = run
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]

    bad = clone_tensors(out)
    bad["out"][0, 1] *= 1.5  # a corrupted kernel output row (SWA, C2A: the Attention budget)
    check = "row_rel_l2" if mode == "swa" or mode.startswith("c2a") else "row_rms"
    assert {("g0.out", check)} <= failing(_compare(case, bad, gold))

    bad = clone_tensors(out)
    layer = case.config.representative_layer(Mode(mode))
    near = layer + 1 if layer + 1 < case.config.num_layers else layer - 1
    key = f"g0.cache.window_kv.L{near}"  # the neighbour's window: never this mode's
    bad[key].view(torch.uint8).view(-1)[5] ^= 0x10
    assert failing(_compare(case, bad, gold)) == {(key, "exact_bytes")}

    bad = clone_tensors(out)
    bad["out"][0, 7, 3] = 1.0  # the inactive row must stay zero (on every rank's copy)
    bad["out_ranks"][0, :, 7, 3] = 1.0
    assert failing(_compare(case, bad, gold)) == {("g0.out", "zero_rows"), ("g0.out_ranks", "zero_rows")} \
        or failing(_compare(case, bad, gold)) == {("g0.out", "zero_rows")}

    # rank 1's partial never reached the reduce window (the run's launches reused: host work)
    assert isinstance(stale, TransportError), f"expected TransportError, got {stale!r}"
    assert re.search(r"ranks \[1\] have not published", str(stale)), str(stale)


@pytest.mark.parametrize("mode", ("swa", "c2a_full", "c1a_reindex"))
def test_bad_metadata_is_refused_before_any_launch(mode):
    case = _case(mode)
    entry = registry.get(case.entry)
    inputs = entry.build_inputs(case.config, case)
    table = inputs["g0.meta.window_block_table"]
    blocks = inputs[f"g0.cache.window_kv.L{case.config.representative_layer(Mode(mode))}"].shape[0]
    table[table >= 0] = table[table >= 0] + blocks  # every page past the window cache
    assert_refused_unchanged(entry, case, inputs, r"window_slots\[\d+\]: \d+ is past the cache")
