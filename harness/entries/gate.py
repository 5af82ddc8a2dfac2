"""``gate``: v41.gate (MoE router) against goldens.router.route.

Indices are compared exactly (every byte); weights with the contract's per-row bound.
The x rows are BF16 RMSNorm-like activations, the gate FP32; the correction bias is large
enough to change the selection against the unbiased order.  Kind ``ties`` duplicates
expert rows (same gate row, same bias) so exactly equal biased scores occur among the
selected experts: the lower expert index must be selected and listed first.
"""

from __future__ import annotations

import torch

from goldens.router import route
from harness.case import Case, Support
from harness.compare import check_non_owned_bytes, check_row_bound, check_sentinel
from harness.entries._kernel import single_launch
from harness.fixtures import SENTINEL, randn, sentinel
from harness.registry import Entry, register

SUPPORT = Support(phase="prefill", kinds=("mixed", "ties"))
INDEX_SENTINEL = -13  # unwritten index slots


def build_inputs(config, case):
    m, d, t = config.moe, config.hidden_size, case.tokens
    e, k = m.n_routed_experts, m.num_experts_per_tok
    x = randn((t, d), case.seed, "x_norm").to(torch.bfloat16)
    w = randn((e, d), case.seed, "gate_weight", scale=d ** -0.5)
    bias = randn((e,), case.seed, "bias", scale=0.5)
    if case.kind == "ties":
        # experts 1 and 2 copy expert e-1 (gate row and bias): their scores tie exactly
        w[1] = w[2] = w[e - 1]
        bias[:] = -4.0
        bias[1] = bias[2] = bias[e - 1] = 4.0
    return {"x_norm": x, "gate_weight": w, "correction_bias": bias,
            "indices": torch.full((t, k), INDEX_SENTINEL, dtype=torch.int32),
            "weights": sentinel((t, k), torch.float32)}


def golden(config, case, inputs):
    idx, w = route(inputs["x_norm"], inputs["gate_weight"], inputs["correction_bias"], config)
    return {"indices": idx, "weights": w}


def compare(config, case, inputs, gold, actual):
    return (check_non_owned_bytes("indices", actual["indices"], gold["indices"])
            + check_row_bound("weights", actual["weights"], gold["weights"])
            + check_sentinel("weights", actual["weights"], SENTINEL, ref=gold["weights"]))


ENTRY = register(Entry(
    name="gate",
    description="MoE router: sqrt-softplus scores, biased top-k (lower index wins ties), "
                "normalized unbiased weights x routed_scaling_factor",
    support=SUPPORT,
    matrix=(Case(entry="gate", tokens=21), Case(entry="gate", tokens=6, kind="ties"),
            Case(entry="gate", tokens=7, preset="flash")),
    slow_cases=(Case(entry="gate", tokens=192, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": single_launch("v41.gate"), "a5": single_launch("v41.gate")},
    flops=lambda cfg, case: 2 * case.tokens * cfg.hidden_size * cfg.moe.n_routed_experts,
))
