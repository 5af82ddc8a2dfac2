"""a5sim: v41.shared_expert through its harness entry.  The kernel passes the contract's
per-row bound at TINY (also with the intermediate width split into several column parts,
as FLASH's is), every deliberately wrong kernel fails the comparison (SwiGLU clamps, silu
placement, h re-quantization, padding rows), and bad input is refused on the host before
anything is compiled."""

from __future__ import annotations

import pytest
import torch

from goldens.quant import mxfp8_linear
from harness import registry
from harness.case import Case
from harness.entries import shared_expert as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch

ENTRY = "shared_expert"
# one launch with 29 active rows and 3 padding rows, one launch of padding rows only
PADDED = Case(entry=ENTRY, tokens=40, active_tokens=29)
SMALL = Case(entry=ENTRY, tokens=12, seed=3)


def run_variant(platform, case: Case, **options):
    """(verdicts, outputs, golden) of the entry's comparison for a kernel built with ``options``."""
    return run_with(platform, case, entry_mod.kernel_sut(**options))


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.mark.parametrize("case,i_tile", [(PADDED, None), (SMALL, 32),
                                         (Case(entry=ENTRY, tokens=8, active_tokens=0), None)])
def test_kernel_passes_the_row_bound(numerics, case, i_tile):
    verdicts, out, gold = run_variant(numerics, case, i_tile=i_tile)
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    checks = {(v.output, v.check) for v in verdicts}
    n = case.active
    if n:
        assert {("y", "row_rms"), ("y", "row_peak"), ("y", "sentinel")} <= checks
    if n < case.tokens:
        assert ("y", "zero_rows") in checks
    assert bool((out["y"][n:] == 0).all())
    assert bool((out["y"][:n] != 0).any(-1).all())  # active rows really computed


def test_several_column_parts_pass_at_lowered(lowered):
    """FLASH splits the intermediate width into 18 parts; TINY's default is one: the
    multi-part path also agrees with the tensor graph after every lowering pass."""
    verdicts, out, gold = run_variant(lowered, SMALL, i_tile=32)
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]


def test_fixture_drives_both_clamps():
    """Without clamped values in g and u, the no-clamp variant could not fail."""
    cfg, case = SMALL.config, SMALL
    inputs = registry.get(ENTRY).build_inputs(cfg, case)
    fp8 = torch.float8_e4m3fn
    g = mxfp8_linear(inputs["x"], inputs["w1"].view(fp8), inputs["w1_scale"]).float()
    u = mxfp8_linear(inputs["x"], inputs["w3"].view(fp8), inputs["w3_scale"]).float()
    limit = cfg.moe.swiglu_limit
    assert float((g > limit).float().mean()) > 0.05
    assert float((u > limit).float().mean()) > 0.05
    assert float((u < -limit).float().mean()) > 0.05


@pytest.mark.parametrize("variant", ["no_clamp", "silu_on_u", "skip_h_quant"])
def test_wrong_kernel_fails_the_row_bound(numerics, variant):
    verdicts, out, gold = run_variant(numerics, SMALL, variant=variant)
    bad = failing(verdicts)
    assert ("y", "row_rms") in bad, f"variant {variant} passed: {[v.line() for v in verdicts]}"
    rms = next(v for v in verdicts if (v.output, v.check) == ("y", "row_rms"))
    assert set(rms.failing_rows) == set(range(SMALL.tokens))  # every row, not one outlier


@pytest.mark.parametrize("variant", ["compute_padding", "skip_padding"])
def test_padding_rows_written_wrong_fail_the_padding_check(numerics, variant):
    verdicts, out, gold = run_variant(numerics, PADDED, variant=variant)
    assert failing(verdicts) == {("y", "zero_rows")}, [v.line() for v in verdicts
                                                       if not v.passed]
    zero = next(v for v in verdicts if (v.output, v.check) == ("y", "zero_rows"))
    assert set(zero.failing_rows) == set(range(PADDED.active, PADDED.tokens))
    assert torch.equal(out["y"][:PADDED.active], gold["y"][:PADDED.active])


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Byte view (NaN padding rows compare equal to themselves)."""
    return t.reshape(-1).view(torch.uint8)


def _nan_row(inputs):
    inputs["x"][2, 5] = float("nan")


def _bad_scale(inputs):
    inputs["w2_scale"][0, 0] = 255


def _bad_w1_dtype(inputs):
    inputs["w1"] = inputs["w1"].view(torch.int8)


@pytest.mark.parametrize("change,match", [
    (lambda i: i.__setitem__("num_tokens", torch.tensor([41], dtype=torch.int32)),
     r"num_tokens: 41 outside \[0, T=40\]"),
    (lambda i: i.__setitem__("num_tokens", torch.tensor([-1], dtype=torch.int32)),
     r"num_tokens: -1 outside \[0, T=40\]"),
    (lambda i: i.__setitem__("num_tokens", torch.tensor([29], dtype=torch.int64)),
     r"num_tokens: must be INT32 \[1\]"),
    (_nan_row, r"x: an active row \(< num_tokens=29\) contains NaN"),
    (_bad_scale, r"w2_scale: contains E8M0 code 255"),
    (_bad_w1_dtype, r"w1: must be torch.uint8 \[64, 256\]"),
])
def test_host_rejects_bad_input_before_compiling(change, match):
    inputs = registry.get(ENTRY).build_inputs(PADDED.config, PADDED)
    change(inputs)
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), PADDED.config, PADDED, inputs)
    assert all(torch.equal(_raw(inputs[k]), _raw(before[k])) for k in inputs)


def test_default_matrix_has_an_inactive_suffix_case():
    assert any(c.active < c.tokens for c in registry.get(ENTRY).matrix)
