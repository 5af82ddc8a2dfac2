"""a5sim: v41.qkv_proj_rope through its harness entry; deliberately wrong kernels fail the
comparison (per-row bound on every rank's q, kv and qr), and bad inputs are rejected on the
host, naming the field and bound, before anything is compiled or launched."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import qkv_proj_rope as entry_mod
from harness.entries._kernel import run_with
from harness.verdict import all_passed
from platform_stubs import NoLaunch

ENTRY = "qkv_proj_rope"
CASE = Case(entry=ENTRY, tokens=9, tp=2, seed=5)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.mark.parametrize("variant,expect", [
    ("inverse_rope", {("q[0]", "row_rms"), ("q[1]", "row_rms"), ("kv[0]", "row_rms")}),
    ("no_q_norm", {("qr[0]", "row_rms"), ("q[1]", "row_rms")}),
    ("wq_b_scale_up", {("q[0]", "row_rms"), ("q[1]", "row_rms")}),
])
def test_wrong_kernel_fails_the_comparison(numerics, variant, expect):
    verdicts, out, gold = run_with(numerics, CASE, entry_mod.kernel_sut(variant=variant))
    assert expect <= failing(verdicts), f"variant {variant}: {[v.line() for v in verdicts]}"


def test_reference_passes_in_host_chunks(numerics):
    verdicts, out, gold = run_with(numerics, CASE, entry_mod.kernel_sut(chunk=4))  # 3 chunks
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    assert not torch.equal(out["q"][0], out["q"][1])  # each rank computed its own heads
    assert ("kv[1] vs rank 0", "exact_bytes") in {(v.output, v.check) for v in verdicts}


def _bad(name, fn):
    def apply(inputs):
        inputs[name] = fn(inputs[name])
    return apply


@pytest.mark.parametrize("mutate,match", [
    (_bad("wq_a", lambda t: t.view(torch.float8_e4m3fn)),
     r"wq_a: must be torch.uint8 \[64, 256\], got torch.float8_e4m3fn"),
    (_bad("wq_b", lambda t: t[:256]), r"wq_b: must be torch.uint8 \[512, 64\]"),
    (_bad("wkv_scale", lambda t: torch.full_like(t, 255)), r"wkv_scale: contains E8M0 code 255"),
    (_bad("rope_sin", lambda t: t[:, :8]), r"rope_sin: must be torch.float32 \[9, 16\]"),
    (_bad("q_norm", lambda t: t.to(torch.bfloat16)), r"q_norm: must be torch.float32 \[64\]"),
    (_bad("x", lambda t: torch.full_like(t, float("inf"))), r"x: contains NaN or Inf"),
])
def test_host_rejects_bad_input_before_launching(mutate, match):
    inputs = registry.get(ENTRY).build_inputs(CASE.config, CASE)
    mutate(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), CASE.config, CASE, inputs)
    assert all((inputs[n] == 13.0).all() for n in ("q", "kv", "qr"))  # untouched


def test_matrices_cover_tp_ranks_and_flash_slow_cases():
    entry = registry.get(ENTRY)
    assert {c.tp for c in entry.matrix} == {1, 2, 4}
    assert {(c.preset, c.tp, c.tokens) for c in entry.slow_cases} >= {("flash", 4, 192)}
    assert any(c.tokens > 192 for c in entry.slow_cases)  # a prefill-sized case
