"""a5sim: v41.hierarchical_indexer through its harness entry.  The reference kernel keeps
exactly the golden's candidate blocks (newest partial block pinned, lower block wins ties,
-inf blocks dropped); wrong kernels fail the exact mask comparison; bad input is rejected
on the host before anything is compiled, launched or written."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import hierarchical_sparse_indexer as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch

ENTRY = "hierarchical_sparse_indexer"
MIXED = Case(entry=ENTRY, tokens=9)
TIES = Case(entry=ENTRY, tokens=6, kind="ties", seed=5)


@pytest.mark.parametrize("case", [MIXED, TIES], ids=["mixed", "ties"])
def test_reference_keeps_the_golden_blocks(numerics, case):
    verdicts, out, gold = run_with(numerics, case, entry_mod.kernel_sut())
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    mask = out["candidate_mask"]
    assert torch.equal(mask, gold["candidate_mask"])
    ix = case.config.index
    cbs, lens = ix.candidate_block_size, registry.get(ENTRY).build_inputs(
        case.config, case)["compressed_lens"]
    assert (mask[0] == 0).all()  # sees nothing: no block kept, nothing pinned
    n = int(lens[1])  # ends inside a block: that newest block is kept
    assert n % cbs and (mask[1, (n - 1) // cbs * cbs:(n - 1) // cbs * cbs + cbs] == 1).all()
    kept = mask.view(mask.shape[0], -1, cbs)[:, :, 0].sum(1)
    assert int(kept.max()) == ix.candidate_topk_blocks  # the block limit binds


@pytest.mark.parametrize("variant,case", [("no_pin", MIXED), ("higher_ties", TIES),
                                          ("skip_first", MIXED)])
def test_wrong_kernel_fails_the_comparison(numerics, variant, case):
    verdicts, _, _ = run_with(numerics, case, entry_mod.kernel_sut(variant))
    bad = {(v.output, v.check) for v in verdicts if not v.passed}
    assert ("candidate_mask", "exact_bytes") in bad, [v.line() for v in verdicts]


def _nan(i):
    i["scores"][2, 3] = float("nan")


def _long(i):
    i["compressed_lens"][4] = 33


def _width(i):
    i["scores"] = i["scores"][:, :30].contiguous()


@pytest.mark.parametrize("mutate,match", [
    (_nan, r"scores\[2, 3\]: nan \(NaN and \+inf are not scores\)"),
    (_long, r"compressed_lens\[4\]: 33 outside \[0, width=32\]"),
    (_width, r"scores: width 30 must be a multiple of candidate_block_size 4 and of 8"),
])
def test_host_rejects_bad_input_before_launching(mutate, match):
    inputs = registry.get(ENTRY).build_inputs(MIXED.config, MIXED)
    mutate(inputs)
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), MIXED.config, MIXED, inputs)
    assert all(torch.equal(inputs[k].view(torch.uint8), before[k].view(torch.uint8))
               for k in inputs)  # nothing written (bytewise: NaN included)
