"""MoE router golden: sqrt-softplus gate, bias-only selection, normalized top-k weights.

``logits = x_norm @ gate_w^T / gate_temperature`` [FP64 accumulation, one rounding to FP32:
:func:`goldens.exact.matmul_fp32`, so a row's scores do not depend on its batch], ``s =
sqrt(softplus(logits))`` [FP32]; the top ``k = num_experts_per_tok`` experts of ``s +
correction_bias`` are selected, but the weights are taken from the UNBIASED ``s``:
``w = s_sel / (sum s_sel + 1e-20) * routed_scaling_factor`` [FP32] (the 1e-20 is the
training constant, not ``rms_norm_eps``).

Tie rule (stable, documented): experts are ordered by biased score descending and EQUAL
biased scores keep ascending expert index, so the lower expert index is selected (and listed)
first.  Output column ``j`` is the ``j``-th best expert in that order.

Rows at or past ``num_active`` (inactive padding) get index 0 and weight 0, as the device
router writes them.
"""

from __future__ import annotations

import torch

from goldens.config import V41Config
from goldens.exact import matmul_fp32

TOPK_NORM_EPS = 1e-20


def _require_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def softplus(x: torch.Tensor) -> torch.Tensor:
    """FP32 ``max(x, 0) + log1p(exp(-|x|))`` (overflow-free; no threshold switch)."""
    x = x.to(torch.float32)
    return torch.clamp_min(x, 0.0) + torch.log1p(torch.exp(-x.abs()))


def gate_scores(x_norm: torch.Tensor, gate_weight: torch.Tensor,
                cfg: V41Config) -> torch.Tensor:
    """Unbiased scores ``s = sqrt(softplus(x_norm @ gate_w^T / temperature))`` FP32 ``[T, E]``.

    ``x_norm`` ``[T, D]`` (the BF16 RMSNorm output) and the FP32 gate ``[E, D]`` are upcast
    to FP32; the product is [FP64 accumulation, one rounding to FP32]
    (:func:`goldens.exact.matmul_fp32`: batch-invariant), then the temperature division,
    softplus and sqrt in FP32.
    """
    _require_tensor(x_norm, "x_norm")
    _require_tensor(gate_weight, "gate_weight")
    m = cfg.moe
    if m.scoring_func != "sqrtsoftplus":
        raise ValueError(f"cfg.moe.scoring_func: {m.scoring_func!r} is not 'sqrtsoftplus'")
    d, e = cfg.hidden_size, m.n_routed_experts
    if x_norm.dim() != 2 or x_norm.shape[1] != d:
        raise ValueError(f"x_norm: shape {tuple(x_norm.shape)} must be [T, {d}]")
    if tuple(gate_weight.shape) != (e, d):
        raise ValueError(f"gate_weight: shape {tuple(gate_weight.shape)} must be [{e}, {d}]")
    logits = matmul_fp32(x_norm.to(torch.float32), gate_weight.to(torch.float32))
    if m.gate_temperature != 1.0:
        logits = logits / m.gate_temperature
    return torch.sqrt(softplus(logits))


def select_experts(biased: torch.Tensor, k: int) -> torch.Tensor:
    """int64 ``[T, k]`` indices of the ``k`` largest entries per row of ``biased``.

    Stable descending order: equal values keep ascending expert index, so ties select the
    LOWER expert index first.  NaN raises.
    """
    _require_tensor(biased, "biased")
    if bool(torch.isnan(biased).any()):
        raise ValueError("biased: contains NaN; scores must be comparable")
    if not 1 <= k <= biased.shape[-1]:
        raise ValueError(f"k: {k} outside [1, {biased.shape[-1]}]")
    order = torch.sort(biased, dim=-1, descending=True, stable=True).indices
    return order[..., :k]


def route(x_norm: torch.Tensor, gate_weight: torch.Tensor, correction_bias: torch.Tensor,
          cfg: V41Config, num_active: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Router: ``(indices INT32 [T, k], weights FP32 [T, k])``.

    Selection by ``s + correction_bias`` (FP32 add, :func:`select_experts` tie rule); weights
    gather the unbiased ``s``; when ``norm_topk_prob`` and ``k > 1`` they are divided by
    ``(sum of the k selected s) + 1e-20`` [FP32], then multiplied by
    ``routed_scaling_factor``.  Rows ``>= num_active`` get index 0 / weight 0.
    """
    s = gate_scores(x_norm, gate_weight, cfg)
    m = cfg.moe
    _require_tensor(correction_bias, "correction_bias")
    if tuple(correction_bias.shape) != (m.n_routed_experts,):
        raise ValueError(f"correction_bias: shape {tuple(correction_bias.shape)} must be "
                         f"[{m.n_routed_experts}]")
    t = s.shape[0]
    if num_active is None:
        num_active = t
    if isinstance(num_active, bool) or not isinstance(num_active, int) or not 0 <= num_active <= t:
        raise ValueError(f"num_active: {num_active!r} outside [0, {t}]")
    k = m.num_experts_per_tok
    idx = select_experts(s + correction_bias.to(torch.float32), k)
    w = s.gather(-1, idx)
    if m.norm_topk_prob and k > 1:
        w = w / (w.sum(dim=-1, keepdim=True) + TOPK_NORM_EPS)
    w = w * m.routed_scaling_factor
    idx[num_active:] = 0
    w[num_active:] = 0.0
    return idx.to(torch.int32), w
