"""``gate``: v41.gate (MoE router) against goldens.router.route.

Indices are compared exactly (every byte); weights with the contract's per-row bound.
The x rows are BF16 RMSNorm-like activations, the gate FP32; the correction bias is large
enough to change the selection against the unbiased order.  Kind ``ties`` duplicates
expert rows (same gate row, same bias) so exactly equal biased scores occur among the
selected experts: the lower expert index must be selected and listed first.

``case.active`` is the runtime ``num_tokens`` (INT32 ``[1]``): rows at or past it are
padding and must hold exactly the contract's index 0 / weight 0 (checked on their own
with ``check_zero_rows``; the active rows alone carry the index and weight checks).  The
host validates ``num_tokens`` to ``[0, T]`` before launch.
"""

from __future__ import annotations

import torch

from goldens.router import route
from harness.case import Case, Support
from harness.compare import check_non_owned_bytes, check_row_bound, check_sentinel, check_zero_rows
from harness.entries._kernel import active_count, single_launch
from harness.fixtures import SENTINEL, randn, sentinel
from harness.platforms.topology import CUBE_FP32, VECTOR_FP32
from harness.registry import Entry, Work, register, tensor_bytes

MODULE = "v41.gate"
SUPPORT = Support(phase="prefill", kinds=("mixed", "ties"), inactive_rows=True)
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
            "num_tokens": torch.tensor([case.active], dtype=torch.int32),
            "indices": torch.full((t, k), INDEX_SENTINEL, dtype=torch.int32),
            "weights": sentinel((t, k), torch.float32)}


def validate_launch(inputs) -> int:
    """Host check before launch: ``num_tokens`` is INT32 ``[1]`` in ``[0, T]``.  Returns
    it; raises ValueError naming the field and the bound."""
    return active_count(inputs["num_tokens"], inputs["x_norm"].shape[0])


def kernel_sut(**options):
    """The a5sim/a5 system under test: validate on the host, then one launch."""
    return single_launch(MODULE, validate=validate_launch, **options)


def work(config, case, inputs):
    """Every tensor moved once; the FP32 x FP32 logits matmul on the cube; per (token,
    expert) about four vector operations (softplus, sqrt, bias add, selection)."""
    t, d, e = case.tokens, config.hidden_size, config.moe.n_routed_experts
    return Work(tensor_bytes(*inputs.values()), {CUBE_FP32: 2 * t * d * e, VECTOR_FP32: 4 * t * e})


def golden(config, case, inputs):
    idx, w = route(inputs["x_norm"], inputs["gate_weight"], inputs["correction_bias"], config,
                   num_active=int(inputs["num_tokens"][0]))
    return {"indices": idx, "weights": w}


def compare(config, case, inputs, gold, actual):
    n, t = int(inputs["num_tokens"][0]), inputs["x_norm"].shape[0]
    verdicts = []
    if n:  # active rows (a prefix: row numbers are kept)
        a_idx, a_w, g_w = actual["indices"][:n], actual["weights"][:n], gold["weights"][:n]
        verdicts += (check_non_owned_bytes("indices", a_idx, gold["indices"][:n])
                     + check_row_bound("weights", a_w, g_w)
                     + check_sentinel("weights", a_w, SENTINEL, ref=g_w))
    for name in ("indices", "weights"):  # padding rows: exactly index 0 / weight 0
        verdicts += check_zero_rows(name, actual[name], rows=slice(n, t))
    return verdicts


ENTRY = register(Entry(
    name="gate",
    description="MoE router: sqrt-softplus scores, biased top-k (lower index wins ties), "
                "normalized unbiased weights x routed_scaling_factor",
    support=SUPPORT,
    matrix=(Case(entry="gate", tokens=21), Case(entry="gate", tokens=6, kind="ties"),
            Case(entry="gate", tokens=7, preset="flash"),
            Case(entry="gate", tokens=50, active_tokens=21)),
    slow_cases=(Case(entry="gate", tokens=192, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut()},
    work=work,
))
