"""a5sim: v41.input_pack through its harness entry equals goldens.boundary.embed byte for
byte (active rows, -1 ids as zero rows, a signed zero kept), padding rows are exact zeros,
deliberately wrong kernels fail the comparison, and bad ids or counts are refused on the
host before anything is compiled or launched."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import input_pack as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch

ENTRY = "input_pack"
MIXED = Case(entry=ENTRY, tokens=21)  # three row tiles, -1 ids among them
PADDED = Case(entry=ENTRY, tokens=50, active_tokens=21)  # three embedded tiles, four zero


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.mark.parametrize("case", [MIXED, PADDED, Case(entry=ENTRY, tokens=8, active_tokens=0)])
def test_equals_the_golden_byte_for_byte(numerics, case):
    verdicts, out, gold = run_with(numerics, case, entry_mod.kernel_sut())
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    x, n = out["x_hc"], case.active
    assert torch.equal(x.view(torch.int32), gold["x_hc"].view(torch.int32))  # every byte
    inputs = registry.get(ENTRY).build_inputs(case.config, case)
    ids, table = inputs["token_ids"], inputs["embed"]
    for t in range(n):  # each active row: its table row (or zeros for -1) on every lane
        want = table[ids[t]].float() if ids[t] >= 0 else torch.zeros(case.config.hidden_size)
        assert all(torch.equal(x[t, h], want) for h in range(case.config.hc.hc_mult)), t
    assert bool((x[n:] == 0).all())
    if n:
        assert (ids[:n] == -1).any() and (ids[:n] >= 0).any()
        first = int(ids[0])  # the table's -0.0 reached the output with its sign
        assert first >= 0 and torch.signbit(x[0, :, 0]).all() and (x[0, :, 0] == 0).all()


@pytest.mark.parametrize("variant,case,expect", [
    ("lane0_only", MIXED, {("x_hc", "exact_bytes")}),
    ("index_off_by_one", MIXED, {("x_hc", "exact_bytes")}),
    ("no_pad_mask", MIXED, {("x_hc", "exact_bytes")}),
    ("skip_padding", PADDED, {("x_hc", "zero_rows")}),
    ("embed_padding", PADDED, {("x_hc", "zero_rows")}),
])
def test_wrong_kernel_fails_the_comparison(numerics, variant, case, expect):
    verdicts, _, _ = run_with(numerics, case, entry_mod.kernel_sut(variant=variant))
    assert failing(verdicts) == expect, [v.line() for v in verdicts]
    if variant == "no_pad_mask":  # exactly the -1 rows (x every lane) are wrong
        v = next(v for v in verdicts if v.check == "exact_bytes")
        ids = registry.get(ENTRY).build_inputs(case.config, case)["token_ids"]
        hc = case.config.hc.hc_mult
        assert v.n_failing == hc * int((ids[:case.active] == -1).sum())


def _inputs(case=PADDED):
    return registry.get(ENTRY).build_inputs(case.config, case)


@pytest.mark.parametrize("field,value,match", [
    ("num_tokens", torch.tensor([51], dtype=torch.int32), r"num_tokens: 51 outside \[0, T=50\]"),
    ("num_tokens", torch.tensor([-1], dtype=torch.int32), r"num_tokens: -1 outside \[0, T=50\]"),
    ("num_tokens", torch.tensor([21], dtype=torch.int64), r"num_tokens: must be INT32 \[1\]"),
    ("token_ids", "vocab_at_active", r"token_ids: active id 512 outside \[-1, vocab=512\)"),
    ("token_ids", "minus_two_at_active", r"token_ids: active id -2 outside \[-1, vocab=512\)"),
    ("token_ids", "int64", r"token_ids: must be INT32 \[T >= 1\]"),
    ("embed", "fp32", r"embed: must be bfloat16 \[512, 256\]"),
    ("embed", "short", r"embed: must be bfloat16 \[512, 256\]"),
])
def test_host_refuses_bad_input_before_launching(field, value, match):
    inputs = _inputs()
    if value == "vocab_at_active":
        inputs["token_ids"][20] = 512
    elif value == "minus_two_at_active":
        inputs["token_ids"][3] = -2
    elif value == "int64":
        inputs["token_ids"] = inputs["token_ids"].long()
    elif value == "fp32":
        inputs["embed"] = inputs["embed"].float()
    elif value == "short":
        inputs["embed"] = inputs["embed"][:-1].clone()
    else:
        inputs[field] = value
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), PADDED.config, PADDED, inputs)
    assert all(torch.equal(inputs[k], before[k]) for k in inputs)


def test_host_check_ignores_inactive_ids():
    """Rows at or past num_tokens are never read: their ids are not range-checked."""
    inputs = _inputs()
    inputs["token_ids"][21:] = 10_000
    assert entry_mod.validate_launch(PADDED.config, inputs) == 21
    inputs["token_ids"][20] = 10_000
    with pytest.raises(ValueError, match="token_ids: active id 10000"):
        entry_mod.validate_launch(PADDED.config, inputs)


def test_default_matrix_has_inactive_rows_and_minus_one_ids():
    matrix = registry.get(ENTRY).matrix
    assert any(0 < c.active < c.tokens for c in matrix)
    assert any(c.active == 0 for c in matrix)
    ids = _inputs(MIXED)["token_ids"]
    assert (ids == -1).any()
