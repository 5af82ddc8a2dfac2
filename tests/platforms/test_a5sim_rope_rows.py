"""a5sim: v41.rope_rows through its harness entry; wrong kernels fail the comparison and a
position past the table is rejected on the host before any launch."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import rope_rows as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch


def run_variant(platform, case: Case, **options):
    """(verdicts, outputs) of the entry's comparison for a kernel built with ``options``."""
    verdicts, out, _ = run_with(platform, case, entry_mod.kernel_sut(**options))
    return verdicts, out


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


CASE = Case(entry="rope_rows", tokens=40, active_tokens=37)


@pytest.mark.parametrize("variant,expect", [
    ("wrap_negative", {("rope_cos", "row_rms"), ("rope_sin", "row_rms")}),
    ("off_by_one", {("rope_cos", "row_rms"), ("rope_sin", "row_rms")}),
    ("all_rows", {("rope_cos", "exact_bytes"), ("rope_sin", "exact_bytes")}),
])
def test_wrong_kernel_fails_the_comparison(numerics, variant, expect):
    verdicts, _ = run_variant(numerics, CASE, variant=variant)
    assert not all_passed(verdicts), f"variant {variant} passed the comparison"
    assert expect <= failing(verdicts), [v.line() for v in verdicts if not v.passed]


def test_zero_tokens_touches_nothing(numerics):
    case = Case(entry="rope_rows", tokens=8, active_tokens=0)
    verdicts, out = run_variant(numerics, case)
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    assert (out["rope_cos"] == 13.0).all() and (out["rope_sin"] == 13.0).all()


@pytest.mark.parametrize("field,bad,match", [
    ("position_ids", "past", r"position_ids\[6\]: 8192 is at or past table capacity 8192"),
    ("num_tokens", 41, r"num_tokens: 41 outside \[0, T=40\]"),
    ("num_tokens", -1, r"num_tokens: -1 outside"),
])
def test_host_rejects_bad_launch_before_launching(field, bad, match):
    entry = registry.get("rope_rows")
    cfg = CASE.config
    inputs = entry.build_inputs(cfg, CASE)
    if field == "position_ids":
        inputs["position_ids"][6] = inputs["freqs_cos"].shape[0]
    else:
        inputs["num_tokens"] = torch.tensor([bad], dtype=torch.int32)
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), cfg, CASE, inputs)
    assert all(torch.equal(inputs[k], before[k]) for k in inputs)


def test_padding_positions_past_the_table_are_not_validated():
    inputs = registry.get("rope_rows").build_inputs(CASE.config, CASE)
    assert int(inputs["position_ids"][CASE.active:].min()) >= inputs["freqs_cos"].shape[0]
    assert entry_mod.validate_launch(inputs) == CASE.active
