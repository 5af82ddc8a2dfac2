"""a5sim: v41.o_proj through its harness entry; deliberately wrong kernels fail the
comparison (per-rank partials and the reduced output by the per-row bound), and bad
inputs are rejected on the host, naming the field and bound, before anything is compiled
or launched."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import o_proj as entry_mod
from harness.entries._kernel import run_with
from harness.verdict import all_passed
from platform_stubs import NoLaunch

ENTRY = "o_proj"
CASE = Case(entry=ENTRY, tokens=9, tp=2, seed=5)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.mark.parametrize("variant", ["forward_rope", "wo_b_scale_up", "skip_act_quant"])
def test_wrong_kernel_fails_the_comparison(numerics, variant):
    verdicts, out, gold = run_with(numerics, CASE, entry_mod.kernel_sut(variant=variant))
    bad = failing(verdicts)
    assert {("partials[0]", "row_rms"), ("partials[1]", "row_rms"), ("out", "row_rms")} <= bad, \
        f"variant {variant} passed: {[v.line() for v in verdicts]}"


def test_reference_passes_and_the_output_is_the_rank_ordered_sum(numerics):
    verdicts, out, gold = run_with(numerics, CASE, entry_mod.kernel_sut(chunk=4))  # 3 chunks
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    p = out["partials"]
    assert torch.equal(out["out"], (p[0] + p[1]).to(torch.bfloat16))
    assert not torch.equal(p[0], p[1])  # two different ranks' partials


def _bad(name, fn):
    def apply(inputs):
        inputs[name] = fn(inputs[name])
    return apply


@pytest.mark.parametrize("mutate,match", [
    (_bad("wo_b", lambda t: t.view(torch.float8_e4m3fn)),
     r"wo_b: must be torch.uint8 \[256, 512\], got torch.float8_e4m3fn"),
    (_bad("wo_b_scale", lambda t: t[:, :-1]), r"wo_b_scale: must be torch.uint8 \[8, 16\]"),
    (_bad("wo_b_scale", lambda t: torch.full_like(t, 255)), r"wo_b_scale: contains E8M0 code 255"),
    (_bad("rope_cos", lambda t: t[:-1]), r"rope_cos: must be torch.float32 \[9, 16\]"),
    (_bad("wo_a", lambda t: t.float()), r"wo_a: must be torch.bfloat16 \[8, 64, 64\]"),
    (_bad("attn_out", lambda t: torch.full_like(t, float("nan"))),
     r"attn_out: contains NaN or Inf"),
])
def test_host_rejects_bad_input_before_launching(mutate, match):
    inputs = registry.get(ENTRY).build_inputs(CASE.config, CASE)
    mutate(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), CASE.config, CASE, inputs)
    assert (inputs["partials"] == 13.0).all() and (inputs["out"] == 13.0).all()  # untouched


def test_matrices_cover_tp_ranks_and_flash_slow_cases():
    entry = registry.get(ENTRY)
    assert {c.tp for c in entry.matrix} == {1, 2, 4}
    assert {(c.preset, c.tp, c.tokens) for c in entry.slow_cases} >= {("flash", 4, 192)}
    assert any(c.tokens > 192 for c in entry.slow_cases)  # a prefill-sized case
