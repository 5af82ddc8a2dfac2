"""RMSNorm golden (reference-facts 4.1).

``y = x * rsqrt(mean(x^2) + eps) * w`` computed in FP32 and cast once to ``x.dtype``.

Rounding boundary: the single cast of the FP32 product to the input dtype (BF16 for the
model's activations).  Inside, the row statistic ``mean(x^2)`` is accumulated in FP64
and rounded once to FP32 (so it does not depend on a summation order), and the scaling
``x * rsqrt(ms + eps) * w`` is FP32.  ``eps`` is ``config.rms_norm_eps`` (1e-20): an
all-zero row gives exactly 0, never NaN.
"""

from __future__ import annotations

import torch

__all__ = ["rms_norm", "rms_norm_fp32"]


def rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The FP32 value before the output cast, over the last dimension of ``x``."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight: shape {tuple(weight.shape)} must be ({x.shape[-1]},)")
    if not eps >= 0.0:
        raise ValueError(f"eps: {eps!r} must be >= 0")
    xf = x.to(torch.float32)
    ms = xf.to(torch.float64).square().mean(dim=-1, keepdim=True).to(torch.float32)
    return xf * torch.rsqrt(ms + eps) * weight.to(torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` with ``weight``; FP32 math, one cast to ``x.dtype`` [BF16]."""
    return rms_norm_fp32(x, weight, eps).to(x.dtype)
