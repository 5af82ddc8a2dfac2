"""a5sim: v41.index_query through its harness entry; deliberately wrong kernels fail the
comparison (per-row bound on q and weights, padding rows exactly zero), padding inputs are
never read, and bad inputs are rejected on the host, naming the field and bound, before
anything is compiled or launched (no output byte written)."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import index_query as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch

ENTRY = "index_query"
PADDED = Case(entry=ENTRY, tokens=50, active_tokens=37, seed=5)
SMALL = Case(entry=ENTRY, tokens=21, active_tokens=18)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.mark.parametrize("variant,expect", [
    ("inverse_rope", {("q", "row_rms"), ("q", "row_peak")}),
    ("no_weight_scale", {("weights", "row_rms"), ("weights", "row_peak")}),
    ("skip_padding", {("q", "zero_rows"), ("weights", "zero_rows")}),
    ("compute_padding", {("q", "zero_rows"), ("weights", "zero_rows")}),
])
def test_wrong_kernel_fails_the_comparison(numerics, variant, expect):
    verdicts, out, gold = run_with(numerics, SMALL, entry_mod.kernel_sut(variant=variant))
    bad = failing(verdicts)
    assert bad == expect, f"variant {variant}: {[v.line() for v in verdicts if not v.passed]}"
    if variant in ("skip_padding", "compute_padding"):  # the active rows are still right
        n = SMALL.active
        assert torch.equal(out["weights"][:n], gold["weights"][:n])


def test_reference_passes_in_host_chunks_with_an_all_padding_chunk(numerics):
    # chunks of 16: (0, 16, 16), (16, 16, 16), (32, 16, 5), (48, 2, 0)
    assert entry_mod.chunks(50, 37, 16)[-2:] == [(32, 16, 5), (48, 2, 0)]
    verdicts, out, gold = run_with(numerics, PADDED, entry_mod.kernel_sut(chunk=16))
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    checked = {(v.output, v.check) for v in verdicts if v.passed and v.applicable}
    assert {("q", "zero_rows"), ("weights", "zero_rows"), ("q", "row_rms")} <= checked
    n = PADDED.active
    assert (out["q"][n:] == 0).all() and (out["weights"][n:] == 0).all()
    assert out["q"][:n].abs().amax(-1).min() > 0  # every active row really projected


def test_padding_inputs_do_not_reach_the_outputs(numerics):
    """NaN in every padding row of qr, x and the rope rows leaves the outputs unchanged."""
    entry = registry.get(ENTRY)
    inputs = entry.build_inputs(SMALL.config, SMALL)
    n = SMALL.active
    for name in entry_mod.ROW_INPUTS:
        inputs[name][n:] = float("nan")
    out = entry_mod.kernel_sut()(numerics, SMALL.config, SMALL, clone_tensors(inputs)).outputs
    gold = entry.golden(SMALL.config, SMALL, clone_tensors(inputs))
    verdicts = entry.compare(SMALL.config, SMALL, inputs, gold, out)
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]


def _bad(name, fn):
    def apply(inputs):
        inputs[name] = fn(inputs[name])
    return apply


def _nan_row(name, row):
    def apply(inputs):
        inputs[name][row] = float("nan")
    return apply


@pytest.mark.parametrize("mutate,match", [
    (_bad("num_tokens", lambda t: torch.tensor([51], dtype=torch.int32)),
     r"num_tokens: 51 outside \[0, T=50\]"),
    (_bad("num_tokens", lambda t: torch.tensor([-1], dtype=torch.int32)),
     r"num_tokens: -1 outside \[0, T=50\]"),
    (_bad("num_tokens", lambda t: t.long()), r"num_tokens: must be INT32 \[1\]"),
    (_bad("wq_b", lambda t: t.view(torch.float8_e4m3fn)),
     r"wq_b: must be torch.uint8 \[128, 64\], got torch.float8_e4m3fn"),
    (_bad("wq_b_scale", lambda t: torch.full_like(t, 255)), r"wq_b_scale: contains E8M0 code 255"),
    (_bad("rope_cos", lambda t: t[:, :8]), r"rope_cos: must be torch.float32 \[50, 16\]"),
    (_bad("x", lambda t: t[:49]), r"x: must be torch.bfloat16 \[50, 256\]"),
    (_bad("weights_proj", lambda t: t.float()),
     r"weights_proj: must be torch.bfloat16 \[256, 4\], got torch.float32"),
    (_bad("qr", lambda t: t.float()), r"qr: must be torch.bfloat16 \[T >= 1, 64\]"),
    (_bad("weights", lambda t: t[:, :2]), r"weights: must be torch.bfloat16 \[50, 4\]"),
    (_nan_row("qr", 36), r"qr: an active row \(< num_tokens=37\) contains NaN"),
    (_nan_row("rope_sin", 0), r"rope_sin: an active row \(< num_tokens=37\) contains NaN"),
])
def test_host_rejects_bad_input_before_launching(mutate, match):
    inputs = registry.get(ENTRY).build_inputs(PADDED.config, PADDED)
    mutate(inputs)
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), PADDED.config, PADDED, inputs)
    for name in entry_mod.OUTPUTS:  # no output byte written
        assert torch.equal(inputs[name].view(torch.uint8), before[name].view(torch.uint8))


def test_matrices_cover_padding_and_flash_slow_cases():
    """(Several row tiles in one launch: ``test_a5sim_row_tiles.py``.)"""
    entry = registry.get(ENTRY)
    tiny = [c for c in entry.matrix if c.preset == "tiny"]
    assert any(c.active < c.tokens for c in tiny)
    assert {(c.preset, c.tokens) for c in entry.slow_cases} >= {("flash", 192)}
    assert any(c.tokens > entry_mod.A5SIM_CHUNK for c in entry.slow_cases)  # host-chunked
