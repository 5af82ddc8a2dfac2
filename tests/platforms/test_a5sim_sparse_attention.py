"""a5sim: v41.sparse_attention through its harness entry; wrong kernels (sink ignored, sink
in the numerator, -1 keys unmasked, wrong softmax scale) fail the per-row bound."""

from __future__ import annotations

import re

import pytest
import torch

from harness.case import Case
from harness.entries._kernel import run_with, single_launch

ENTRY, MODULE = "sparse_attention", "v41.sparse_attention"
CASE = Case(entry=ENTRY, tokens=5)


def run_variant(platform, case: Case, **options):
    """(verdicts, outputs, golden) of the entry's comparison for a kernel built with ``options``."""
    return run_with(platform, case, single_launch(MODULE, **options))


@pytest.mark.parametrize("variant,expect", [
    ("no_sink", {"finite", "row_rms"}),  # finite: the fully masked token divides 0 by 0
    ("sink_numerator", {"row_rms", "row_peak"}),
    ("unmasked", {"row_rms", "row_peak"}),
    ("wrong_scale", {"row_rms", "row_peak"}),
])
def test_wrong_kernel_fails_the_comparison(a5sim, variant, expect):
    verdicts, out, gold = run_variant(a5sim, CASE, variant=variant)
    bad = {v.check for v in verdicts if not v.passed and v.output == "out"}
    assert expect <= bad, f"variant {variant}: {[v.line() for v in verdicts]}"


def test_reference_passes_and_masked_token_is_zero(a5sim):
    verdicts, out, gold = run_variant(a5sim, CASE)
    assert all(v.passed for v in verdicts), [v.line() for v in verdicts if not v.passed]
    assert torch.equal(out["out"][2], torch.zeros_like(out["out"][2]))  # no valid key


class _NoLaunch:
    """A platform that must never be reached: host validation comes first."""

    def compile(self, *a, **k):
        raise AssertionError("compiled despite bad input")

    launch = compile


@pytest.mark.parametrize("field,mutate", [
    ("indices[1, 0]", lambda inp: inp["indices"].__setitem__((1, 0), 10 ** 6)),
    ("indices[0, 3]", lambda inp: inp["indices"].__setitem__((0, 3), -2)),
    ("attn_sink[1]", lambda inp: inp["attn_sink"].__setitem__(1, float("inf"))),
])
def test_bad_input_is_refused_on_the_host_before_launch(field, mutate):
    from harness import registry
    case = Case(entry="sparse_attention", tokens=5)
    entry = registry.get("sparse_attention")
    inputs = entry.build_inputs(case.config, case)
    mutate(inputs)
    with pytest.raises(ValueError, match=re.escape(field)):
        entry.kernels["a5sim"](_NoLaunch(), case.config, case, inputs)


def test_a_token_without_keys_must_be_exactly_zero():
    from harness import registry
    case = Case(entry="sparse_attention", tokens=5)
    entry = registry.get("sparse_attention")
    inputs = entry.build_inputs(case.config, case)
    gold = entry.golden(case.config, case, inputs)
    actual = {"out": gold["out"].clone()}
    masked = int((inputs["indices"] < 0).all(dim=1).nonzero()[0, 0])
    actual["out"][masked] = 5e-7
    bad = {(v.output, v.check) for v in entry.compare(case.config, case, inputs, gold, actual)
           if not v.passed}
    assert ("out", "zero_rows") in bad
