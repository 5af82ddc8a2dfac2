"""a5sim: ``v41.moe_combine`` forms the MoE block output at the token owner byte-equal to
the golden (``goldens.moe.combine`` of the routed sum accumulated in ascending expert
order), writes padding rows zero, passes pass-level (``lowered``) verification, and each
deliberately wrong variant is caught."""

from __future__ import annotations

import pytest
import torch

from goldens.config import preset
from goldens.moe import combine
from harness.platforms import KernelSpec

TINY = preset("tiny")
T, N = 19, 17  # two row tiles, two padding rows


def _inputs(seed=3):
    g = torch.Generator().manual_seed(seed)
    k, d = TINY.moe.num_experts_per_tok, TINY.hidden_size
    routed = (torch.randn(T, k, d, generator=g) * torch.logspace(-3, 2, d)).to(torch.bfloat16)
    shared = torch.randn(T, d, generator=g).to(torch.bfloat16)
    return routed, shared


def _golden(routed, shared, n):
    acc = torch.zeros(n, routed.shape[2])
    for j in range(routed.shape[1]):  # ascending expert order, as goldens.moe.routed_partial
        acc = acc + routed[:n, j].float()
    out = torch.zeros(T, routed.shape[2], dtype=torch.bfloat16)
    out[:n] = combine(shared[:n], [acc])
    return out


def _launch(numerics, routed, shared, n, variant="reference"):
    spec = KernelSpec("v41.moe_combine", {} if variant == "reference" else {"variant": variant})
    program = numerics.compile(spec, TINY, {"tokens": T})
    y = torch.full((T, TINY.hidden_size), 7.0, dtype=torch.bfloat16)
    result = numerics.launch(program, 0, {"routed": routed.reshape(T, -1).contiguous(), "shared": shared,
                                       "num_tokens": torch.tensor([n], dtype=torch.int32), "y": y})
    result.raise_for_error()
    return result.outputs["y"]


@pytest.mark.parametrize("n", [N, 0])
def test_combine_is_byte_equal_to_the_golden_and_zeroes_padding(numerics, n):
    routed, shared = _inputs()
    y = _launch(numerics, routed, shared, n)
    assert torch.equal(y.view(torch.int16), _golden(routed, shared, n).view(torch.int16))


def test_combine_passes_pass_level_verification(lowered):
    """Every lowering pass agrees with the tensor graph on real inputs (the composition's
    other kernels are lowered through their own entries)."""
    routed, shared = _inputs()
    y = _launch(lowered, routed, shared, N)
    assert torch.equal(y.view(torch.int16), _golden(routed, shared, N).view(torch.int16))


@pytest.mark.parametrize("variant", ["bf16_partials", "drop_last_expert"])
def test_each_wrong_variant_differs_from_the_golden(numerics, variant):
    routed, shared = _inputs()
    y = _launch(numerics, routed, shared, N, variant)
    gold = _golden(routed, shared, N)
    assert not torch.equal(y[:N].view(torch.int16), gold[:N].view(torch.int16))
