"""Model-boundary golden: embedding into the hc lanes, final norm, LM head, greedy sampling.

Forward at the boundary (the backbone runs between :func:`embed` and :func:`hc_head`)::

    x_hc   = embed(token_ids)                 FP32 [T, hc, D], the row replicated on every lane
    pre    = initial_pre_mix(T)               one-hot lane 0 (the first site's incoming mix)
    ... 40 layers of staggered mHC sites ...
    h      = hc_head(x_hc, last_pre)          [BF16] collapse with the last delayed pre-mix
    h      = final_norm(h)                    [BF16] RMSNorm (goldens.norm.rms_norm)
    rows   = gather_logit_rows(h, idx)        -1 rows give zero hidden
    logits = lm_head(rows)                    FP32 (FP64 accumulation, one rounding to FP32),
                                              vocab sharded by TP, rank-order reassembly
    ids    = greedy_sample(logits)            INT32, lowest index among equal maxima

Tie rule of :func:`greedy_sample`: the FIRST (lowest vocab index) maximum, the same rule as
``torch.argmax`` and the device's chunked reverse scan.
"""

from __future__ import annotations

import torch

from goldens.config import V41Config, local_vocab
from goldens.exact import matmul_fp32
from goldens.mhc import hc_head, initial_pre_mix
from goldens.norm import rms_norm


def _require_ids(ids, name: str, upper: int) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: must be an INT32/INT64 torch.Tensor")
    if ids.dim() != 1:
        raise ValueError(f"{name}: must be 1-D, got shape {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= upper):
        raise ValueError(f"{name}: values must lie in [-1, {upper}) (-1 = padding)")


def embed(token_ids: torch.Tensor, embed_weight: torch.Tensor, cfg: V41Config) -> torch.Tensor:
    """Residual lanes at the model input: FP32 ``[T, hc, D]``, each token's embedding row
    (exact upcast of the BF16 table) replicated over all ``hc_mult`` lanes.  Padding ids
    ``-1`` give zero rows."""
    v, d = cfg.vocab_size, cfg.hidden_size
    _require_ids(token_ids, "token_ids", v)
    if not isinstance(embed_weight, torch.Tensor) or tuple(embed_weight.shape) != (v, d):
        raise ValueError(f"embed_weight: must be a tensor of shape [{v}, {d}]")
    valid = token_ids >= 0
    rows = embed_weight[token_ids.clamp_min(0).long()].to(torch.float32)
    rows = torch.where(valid[:, None], rows, torch.zeros_like(rows))
    return rows[:, None, :].expand(-1, cfg.hc.hc_mult, -1).contiguous()


def final_norm(x: torch.Tensor, weight: torch.Tensor, cfg: V41Config) -> torch.Tensor:
    """Final RMSNorm (``norm.weight``): FP32 math, eps ``cfg.rms_norm_eps``, one [BF16] cast
    (:func:`goldens.norm.rms_norm`)."""
    return rms_norm(x.to(torch.bfloat16), weight, cfg.rms_norm_eps)


def gather_logit_rows(hidden: torch.Tensor, row_indices: torch.Tensor) -> torch.Tensor:
    """Rows of ``hidden [T, D]`` selected for logits, ``[R, D]`` same dtype; an index of -1
    produces a zero row (its logits are then exactly 0)."""
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise ValueError("hidden: must be a 2-D torch.Tensor [T, D]")
    _require_ids(row_indices, "row_indices", hidden.shape[0])
    if hidden.shape[0] == 0:
        return torch.zeros(row_indices.shape[0], hidden.shape[1], dtype=hidden.dtype)
    rows = hidden[row_indices.clamp_min(0).long()]
    return torch.where((row_indices >= 0)[:, None], rows, torch.zeros_like(rows))


def vocab_shard(head_weight: torch.Tensor, cfg: V41Config, tp: int, rank: int) -> torch.Tensor:
    """TP rank ``rank``'s head rows ``[rank*V/tp, (rank+1)*V/tp)`` of ``head_weight [V, D]``."""
    n = local_vocab(cfg, tp)
    if not 0 <= rank < tp:
        raise ValueError(f"rank: {rank} outside [0, {tp})")
    if tuple(head_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"head_weight: shape {tuple(head_weight.shape)} must be "
                         f"[{cfg.vocab_size}, {cfg.hidden_size}]")
    return head_weight[rank * n:(rank + 1) * n]


def lm_head_shard(hidden: torch.Tensor, head_shard: torch.Tensor) -> torch.Tensor:
    """One rank's FP32 logits ``[R, V/tp]``: [BF16] hidden, FP32 head, [FP64 accumulation,
    one rounding to FP32] (:func:`goldens.exact.matmul_fp32`: a row's logits do not depend
    on the other rows; streamed over vocab chunks), no narrowing."""
    if hidden.dim() != 2 or head_shard.dim() != 2 or hidden.shape[1] != head_shard.shape[1]:
        raise ValueError(f"hidden/head_shard: shapes {tuple(hidden.shape)} and "
                         f"{tuple(head_shard.shape)} do not contract")
    return matmul_fp32(hidden.to(torch.bfloat16), head_shard.to(torch.float32))


def lm_head(hidden: torch.Tensor, head_weight: torch.Tensor, cfg: V41Config,
            tp: int = 1) -> torch.Tensor:
    """FP32 logits ``[R, V]``: each TP rank's :func:`lm_head_shard` of its
    :func:`vocab_shard`, concatenated in rank order."""
    return torch.cat([lm_head_shard(hidden, vocab_shard(head_weight, cfg, tp, r))
                      for r in range(tp)], dim=-1)


def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    """INT32 ``[R]`` argmax per row; among equal maxima the LOWEST vocab index wins.  NaN
    logits raise."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError("logits: must be a 2-D torch.Tensor [R, V] with V >= 1")
    if bool(torch.isnan(logits).any()):
        raise ValueError("logits: contains NaN")
    v = logits.shape[1]
    top = logits.amax(dim=-1, keepdim=True)
    pos = torch.arange(v, dtype=torch.int64).expand_as(logits)
    first = torch.where(logits == top, pos, torch.full_like(pos, v)).amin(dim=-1)
    return first.to(torch.int32)


def boundary_forward(token_ids: torch.Tensor, embed_weight: torch.Tensor,
                     norm_weight: torch.Tensor, head_weight: torch.Tensor, cfg: V41Config,
                     tp: int = 1, logit_rows: torch.Tensor | None = None):
    """Boundary self-test without the backbone: embed -> hc_head with the initial one-hot
    pre-mix -> final_norm -> logit rows -> lm_head (TP) -> greedy.  Returns ``(logits FP32
    [R, V], ids INT32 [R])``; ``logit_rows`` defaults to every token."""
    x_hc = embed(token_ids, embed_weight, cfg)
    t = x_hc.shape[0]
    hidden = final_norm(hc_head(x_hc, initial_pre_mix(t, cfg), cfg), norm_weight, cfg)
    if logit_rows is None:
        logit_rows = torch.arange(t, dtype=torch.int32)
    logits = lm_head(gather_logit_rows(hidden, logit_rows), head_weight, cfg, tp)
    return logits, greedy_sample(logits)
