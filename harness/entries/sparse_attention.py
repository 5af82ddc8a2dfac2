"""``sparse_attention``: v41.sparse_attention (decode sparse attention with the per-head sink
over the MXFP8 window cache, one TP rank's local heads) against
``goldens.window_cache.gather_window_kv`` + ``goldens.sparse_attention.sparse_attention``.

Fixture (deterministic in the seed): q BF16 ``[T, H_local, D]``; a window cache whose rows
are random BF16 latent rows (row magnitudes 2^-3 .. 2^2) published with the MXFP8 rule of
``goldens.quant.quantize_window_kv``: random E4M3 codes, never a NaN code, and ceil
power-of-two E8M0 scales.  (Uniformly random E4M3 codes are not used: their log-uniform
magnitudes give rows whose peak is ~16x their RMS, where one BF16 ulp of the output
exceeds the contract's 5 % peak bound; see the kernel docstring.)  Physical rows go
through a nonidentity block permutation.  Each
token's key list is its window (positions ``base + t - W + 1 .. base + t``, earlier ones
-1) followed by compressed-like random physical rows whose tail is -1 padding; one token
has no valid key at all (its output must be exactly 0).  Sinks are mixed in sign and size
with one large sink (kind ``sink``: every sink large, the sink dominates the denominator).

Comparison: the contract per-row bound on every (token, head) row of ``out`` and the
sentinel check (every row written).  The golden keeps probabilities FP32; the kernel
casts them to BF16 before P.V, a difference the bound absorbs.
"""

from __future__ import annotations

import torch

from goldens.quant import quantize_window_kv
from goldens.sparse_attention import sparse_attention
from goldens.window_cache import gather_window_kv
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel, check_zero_rows
from harness.entries._kernel import single_launch
from harness.fixtures import SENTINEL, generator, nonidentity_permutation, randn, sentinel, uniform
from harness.registry import Entry, register

MODULE = "v41.sparse_attention"
SUPPORT = Support(phase="decode", tp_sizes=(1, 2, 4), kinds=("mixed", "sink"))
LARGE_SINK = 12.0


def _dims(config, case):
    from v41.sparse_attention import dims  # no pypto: safe in the calling process
    return dims(config, {"tokens": case.tokens, "tp": case.tp})


def build_inputs(config, case):
    dm = _dims(config, case)
    t, h, d, g = dm["tokens"], dm["heads"], dm["head_dim"], dm["groups"]
    keys, blocks, bs = dm["keys"], dm["blocks"], dm["block_size"]
    w = config.sliding_window
    rows = blocks * bs
    seed = case.seed
    q = randn((t, h, d), seed, "q").to(torch.bfloat16)
    # cache rows: random BF16 latent rows published with the MXFP8 rule (E4M3 codes that
    # are never NaN, ceil power-of-two E8M0 scales), per-row magnitudes spread over 2^-3..2^2
    spread = torch.exp2(uniform((rows, 1), seed, "row_scale", -3.0, 2.0).round())
    kv = (randn((rows, d), seed, "kv") * spread).to(torch.bfloat16)
    codes, scales = quantize_window_kv(kv, config.cache.window_group)
    payload = codes.view(torch.uint8).reshape(blocks, bs, 1, d)
    scales = scales.reshape(blocks, bs, 1, g)
    # window: logical positions through a nonidentity block permutation
    perm = nonidentity_permutation(blocks, seed, "blocks")
    if int(perm[0]) == 0:  # the window's first logical block must move too
        perm = perm.roll(1)
    base = max(0, w // 2 - 1)  # the first tokens have fewer than W positions
    idx = torch.full((t, keys), -1, dtype=torch.int64)
    for i in range(t):
        pos = torch.arange(base + i - w + 1, base + i + 1)
        phys = perm[pos.clamp(min=0) // bs] * bs + pos.clamp(min=0) % bs
        idx[i, :w] = torch.where(pos >= 0, phys, torch.full_like(phys, -1))
    extra = keys - w
    if extra:
        rnd = torch.randint(0, rows, (t, extra), generator=generator(seed, "extra"))
        n_valid = torch.randint(extra // 2, extra + 1, (t,), generator=generator(seed, "valid"))
        cols = torch.arange(extra)[None, :]
        idx[:, w:] = torch.where(cols < n_valid[:, None], rnd, torch.full_like(rnd, -1))
    idx[min(2, t - 1)] = -1  # a token with no valid key
    sink = randn((h,), seed, "sink", scale=2.0)
    sink[0] = LARGE_SINK
    if case.kind == "sink":
        sink = sink.abs() + LARGE_SINK
    return {"q": q, "window_kv": payload, "window_kv_scale": scales,
            "indices": idx.to(torch.int32), "attn_sink": sink,
            "out": sentinel((t, h, d), torch.bfloat16)}


def validate_launch(inputs) -> None:
    """Host checks before launch: every row id is -1 or inside the cache, sinks finite."""
    rows = inputs["window_kv"].shape[0] * inputs["window_kv"].shape[1]
    idx = inputs["indices"]
    bad = ((idx < -1) | (idx >= rows)).nonzero()
    if bad.numel():
        t, k = (int(v) for v in bad[0])
        raise ValueError(f"indices[{t}, {k}]: {int(idx[t, k])} outside [-1, {rows}) cache rows")
    sink = inputs["attn_sink"]
    bad = (~torch.isfinite(sink)).nonzero()
    if bad.numel():
        h = int(bad[0, 0])
        raise ValueError(f"attn_sink[{h}]: {float(sink[h])} is not finite (the kernel needs a "
                         f"finite sink)")


def golden(config, case, inputs):
    kv, valid = gather_window_kv(inputs["window_kv"].view(torch.float8_e4m3fn),
                                 inputs["window_kv_scale"], inputs["indices"])
    return {"out": sparse_attention(inputs["q"], kv, valid, inputs["attn_sink"],
                                    softmax_scale=config.softmax_scale)}


def compare(config, case, inputs, gold, actual):
    heads = actual["out"].shape[1] if actual["out"].dim() == 3 else 1
    no_key = (inputs["indices"] < 0).all(dim=1).repeat_interleave(heads)  # exactly 0 rows
    return (check_row_bound("out", actual["out"], gold["out"])
            + check_sentinel("out", actual["out"], SENTINEL, ref=gold["out"])
            + check_zero_rows("out", actual["out"], rows=no_key))


ENTRY = register(Entry(
    name="sparse_attention",
    description="decode sparse attention leaf: per-head sink (denominator only), MXFP8 "
                "window cache gathered by physical row ids (-1 masked), local heads of one "
                "TP rank",
    support=SUPPORT,
    matrix=(Case(entry="sparse_attention", tokens=5),
            Case(entry="sparse_attention", tokens=8, tp=4),
            Case(entry="sparse_attention", tokens=6, tp=2, kind="sink", seed=5),
            Case(entry="sparse_attention", tokens=4, tp=4, preset="flash")),
    slow_cases=(Case(entry="sparse_attention", tokens=48, tp=4, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": single_launch(MODULE, validate=validate_launch),
             "a5": single_launch(MODULE, validate=validate_launch)},
    flops=lambda cfg, case: (4 * case.tokens * _dims(cfg, case)["heads"]
                             * _dims(cfg, case)["keys"] * cfg.head_dim),
))
