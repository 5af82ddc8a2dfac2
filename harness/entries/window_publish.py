"""``window_publish``: v41.window_publish (MXFP8 quantization of each token's BF16 KV row and
its write at the token's window slot) against ``goldens.window_cache.publish_window_kv``.

Fixture (deterministic in the seed): ``case.requests`` requests share the ``case.active``
active tokens; each request's new tokens continue a prefix at a random offset inside a
page, and its pages come from a nonidentity permutation of the cache blocks, so slots are
``block * block_size + offset`` through a nonidentity block table.  Every seventh active
token has slot -1 (an inactive token inside the batch), padding tokens (``t >= active``)
carry -1 or -7 and junk KV.  The cache starts as published history (random rows quantized
with the golden's rule), so an unwritten row or a stray write shows.  KV rows are BF16
normals with per-row magnitudes 2^-8 .. 2^8; when the batch has room, the first active
rows hold the hard cases: a zero group with a -0.0, exact E4M3 ties (x.5 at scale 1,
subnormal midpoints), 448 and values that round up to it, tiny negatives that round to
-0, and rows scaled by 2^-125 (E8M0 clamp at 2^-127, BF16 subnormals) and 2^100.

Comparison: published rows (valid slots) dequantized against the golden's cache (MXFP8
relative L2 <= 1 %, ``check_dequantized_rows``), and both cache tensors byte-identical to
the input outside the published rows (``check_non_owned_bytes``).

Host validation (:func:`validate_launch`, before any launch): dtypes and shapes of the
four tensors named with what they must be, every valid slot inside the cache, no two
valid tokens on one slot.

Launches: the a5sim interpreter holds every loop iteration's data, ~1.1 GB per 512 FLASH
tokens (a 4096-token launch exhausted the 24 GiB machine), so on a5sim's interpreter the
SUT publishes in host chunks of :data:`A5SIM_CHUNK` tokens, each launch continuing from the
previous cache (slots are distinct, so chunk order does not matter); its cost record is the
sum of the chunks' estimates.  On cards, and on an estimate-only platform (which interprets
nothing: :func:`harness.entries._kernel.launch_step`), the batch is one launch.
"""

from __future__ import annotations

import dataclasses

import torch

from goldens.quant import dequantize_window_kv, quantize_window_kv
from goldens.window_cache import publish_window_kv
from harness.case import Case, Support
from harness.compare import MXFP8_CACHE_MAX_REL_L2, check_dequantized_rows, check_non_owned_bytes
from harness.fixtures import generator, nonidentity_permutation, randn, split_lengths
from harness.platforms.topology import VECTOR_FP32
from harness.entries._kernel import launch_step, sequential_cost
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes

MODULE = "v41.window_publish"
SUPPORT = Support(phase="prefill", inactive_rows=True)
CACHES = ("window_kv", "window_kv_scale")
A5SIM_CHUNK = 512  # tokens per a5sim launch
INACTIVE_EVERY = 7  # every 7th active token (t % 7 == 6) has slot -1
VECTOR_OPS_PER_ELEMENT = 8  # nominal: |x|, group max, x * 2^-e, E4M3 rounding and encoding


def _dims(config, case):
    from v41.window_publish import dims  # no pypto: safe in the calling process
    return dims(config, {"tokens": case.tokens, "requests": case.requests})


# ---- fixture ---------------------------------------------------------------------------------

def _slots(config, case, blocks: int) -> torch.Tensor:
    """INT32 [T] slots: paged rows of each request's new tokens, -1 for inactive tokens and
    -1 / -7 for padding."""
    bs, n, seed = config.cache.block_size, case.active, case.seed
    lens = split_lengths(n, case.requests, seed, "qlens", allow_empty=n < case.requests)
    perm = nonidentity_permutation(blocks, seed, "blocks")
    offs = torch.randint(0, bs, (case.requests,), generator=generator(seed, "offsets"))
    slots = torch.full((case.tokens,), -1, dtype=torch.int64)
    page, t = 0, 0
    for r, length in enumerate(lens):
        pos = int(offs[r]) + torch.arange(length)
        slots[t:t + length] = perm[page + pos // bs] * bs + pos % bs
        page += -(-(int(offs[r]) + length) // bs)
        t += length
    slots[INACTIVE_EVERY - 1:n:INACTIVE_EVERY] = -1
    slots[n + 1::2] = -7
    return slots.to(torch.int32)


def _hard_rows(kv: torch.Tensor, active: int) -> None:
    """Overwrite the first active rows with exact-rounding edge cases (see module doc)."""
    d = kv.shape[1]
    cases = [
        [0.0] * 31 + [-0.0],  # zero group: scale code 0, payload 0x00 / 0x80
        [448.0, 8.5, 9.5, 10.5, 11.5, -12.5, 432.0, 424.0, 440.0, -436.0]
        + [2.0 ** -9 * m for m in (0.5, 1.5, 2.5, -0.5, -0.25, 3.5, 7.5)]
        + [2.0 ** -6, 15.5, 1.0, -1.0, 0.0, 240.0, 248.0, 256.0, 272.0, 288.0, 320.0, -352.0,
           416.0, 2.0 ** -10, -2.0 ** -11],
        [450.0] + [1.0] * 31,  # amax just above 448: scale 2, 450/2 = 225 -> 224
    ]
    row = 0
    for values in cases:
        if row >= active:
            return
        group = torch.tensor(values, dtype=torch.float32)
        for g0 in range(0, d, 32):
            kv[row, g0:g0 + 32] = group.to(torch.bfloat16)
        row += 1
    for scale in (2.0 ** -125, 2.0 ** 100):
        if row >= active:
            return
        kv[row] = (kv[row].float() * scale).to(torch.bfloat16)
        row += 1


def build_inputs(config, case):
    dm = _dims(config, case)
    t, d, g, blocks, bs = dm["tokens"], dm["head_dim"], dm["groups"], dm["blocks"], dm["block_size"]
    seed, rows = case.seed, blocks * bs
    spread = torch.exp2(torch.randint(-8, 9, (t, 1), generator=generator(seed, "spread")).float())
    kv = (randn((t, d), seed, "kv") * spread).to(torch.bfloat16)
    _hard_rows(kv, case.active)
    kv[case.active:] = 7.0  # padding junk: never published
    history = randn((rows, d), seed, "history", torch.bfloat16)
    codes, scales = quantize_window_kv(history, config.cache.window_group)
    return {"kv": kv, "window_slots": _slots(config, case, blocks),
            "window_kv": codes.view(torch.uint8).reshape(blocks, bs, 1, d),
            "window_kv_scale": scales.reshape(blocks, bs, 1, g)}


# ---- host validation -------------------------------------------------------------------------

def _require(name: str, t, dtype: torch.dtype, dims: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype or t.dim() != dims:
        raise ValueError(f"{name}: must be {dims}-D {dtype}, got {t.dim()}-D {t.dtype} "
                         f"{list(t.shape)}")


def validate_launch(inputs) -> int:
    """Host checks before launch; returns the number of published rows.  Raises ValueError
    naming the field and the bound: dtypes/shapes (``window_kv`` uint8 ``[blocks, block_size,
    1, D]`` with D a multiple of 32, ``window_kv_scale`` uint8 ``[blocks, block_size, 1,
    D/32]``, ``kv`` bfloat16 ``[T, D]``, ``window_slots`` int32 ``[T]``), every valid slot below
    ``blocks * block_size``, no two valid tokens on one slot."""
    payload, scales = inputs["window_kv"], inputs["window_kv_scale"]
    kv, slots = inputs["kv"], inputs["window_slots"]
    _require("window_kv", payload, torch.uint8, 4)
    if payload.shape[2] != 1 or payload.shape[3] % 32 or payload.shape[3] == 0:
        raise ValueError(f"window_kv: must be [blocks, block_size, 1, D] with D a positive "
                         f"multiple of 32, got {list(payload.shape)}")
    d = payload.shape[3]
    _require("window_kv_scale", scales, torch.uint8, 4)
    want = [*payload.shape[:3], d // 32]
    if list(scales.shape) != want:
        raise ValueError(f"window_kv_scale: shape must be {want} (one E8M0 per 32 of "
                         f"window_kv), got {list(scales.shape)}")
    _require("kv", kv, torch.bfloat16, 2)
    if kv.shape[1] != d:
        raise ValueError(f"kv: shape must be [T, {d}] (window_kv head_dim), got {list(kv.shape)}")
    _require("window_slots", slots, torch.int32, 1)
    if slots.shape[0] != kv.shape[0]:
        raise ValueError(f"window_slots: shape must be [{kv.shape[0]}] (one per kv row), got "
                         f"{list(slots.shape)}")
    rows = payload.shape[0] * payload.shape[1]
    live = (slots >= 0).nonzero().flatten()
    past = live[slots[live] >= rows]
    if past.numel():
        t = int(past[0])
        raise ValueError(f"window_slots[{t}]: {int(slots[t])} is past the cache "
                         f"({rows} rows = {payload.shape[0]} blocks x {payload.shape[1]})")
    target = slots[live]
    uniq, counts = torch.unique(target, return_counts=True)
    if (counts > 1).any():
        slot = int(uniq[(counts > 1).nonzero()[0, 0]])
        a, b = (live[target == slot][:2]).tolist()
        raise ValueError(f"window_slots[{a}] and window_slots[{b}]: both publish to slot "
                         f"{slot} (valid slots must be distinct)")
    return int(live.numel())


# ---- system under test -----------------------------------------------------------------------

def kernel_sut(chunk: int | None = None, **options):
    """Validate on the host, then publish ``chunk`` tokens per launch on a5sim's interpreter
    (all at once when None, and on any other or an estimate-only platform:
    :func:`launch_step`), each launch continuing from the previous launch's cache.  The cost
    record sums the launches (they run one after another)."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        validate_launch(inputs)
        spec = KernelSpec(MODULE, options)
        t = inputs["kv"].shape[0]
        step = launch_step(platform, t, chunk) if chunk else t
        caches = {k: inputs[k] for k in CACHES}
        blocks = caches["window_kv"].shape[0]
        records = []
        for c0 in range(0, t, step):
            c1 = min(t, c0 + step)
            axes = {**dataclasses.asdict(case), "tokens": c1 - c0, "blocks": blocks}
            program = platform.compile(spec, config, axes)
            rows = {k: inputs[k][c0:c1].contiguous() for k in ("kv", "window_slots")}
            result = platform.launch(program, 0, {**rows, **caches})
            result.raise_for_error()
            caches = {k: result.outputs[k] for k in CACHES}
            if record := result.cost_record():
                records.append(record)
        return SutOutput(caches, [sequential_cost(records)] if records else [])
    return run


# ---- golden and comparison -------------------------------------------------------------------

def golden(config, case, inputs):
    payload, scales = inputs["window_kv"].clone(), inputs["window_kv_scale"].clone()
    publish_window_kv(payload.view(torch.float8_e4m3fn), scales, inputs["kv"],
                      inputs["window_slots"])
    return {"window_kv": payload, "window_kv_scale": scales}


def _published(config, cache: dict, slots: torch.Tensor) -> torch.Tensor:
    """FP32 dequantized rows ``slots`` of a (payload, scales) cache dict."""
    d = cache["window_kv"].shape[-1]
    codes = cache["window_kv"].reshape(-1, d)[slots].view(torch.float8_e4m3fn)
    scales = cache["window_kv_scale"].reshape(-1, d // config.cache.window_group)[slots]
    return dequantize_window_kv(codes, scales, config.cache.window_group)


def compare(config, case, inputs, gold, actual):
    slots = inputs["window_slots"].long()
    slots = slots[slots >= 0]
    verdicts = []
    for name in CACHES:
        verdicts += check_non_owned_bytes(name, actual[name], inputs[name], owned=slots)
    if slots.numel():
        verdicts += check_dequantized_rows("window_kv.dequantized",
                                           _published(config, actual, slots),
                                           _published(config, gold, slots),
                                           max_rel_l2=MXFP8_CACHE_MAX_REL_L2)
    return verdicts


def work(config, case, inputs):
    """Every kv row and slot read once, the published rows' payload and scale bytes written;
    nominal FP32 vector work of :data:`VECTOR_OPS_PER_ELEMENT` per published element."""
    slots = inputs["window_slots"]
    n = int((slots >= 0).sum())
    row = tensor_bytes(inputs["window_kv"][0, 0], inputs["window_kv_scale"][0, 0])
    return Work(tensor_bytes(inputs["kv"], slots) + n * row,
                {VECTOR_FP32: VECTOR_OPS_PER_ELEMENT * n * inputs["kv"].shape[1]})


ENTRY = register(Entry(
    name="window_publish",
    description="MXFP8 publication of each token's BF16 KV row at its window slot (E8M0 "
                "group-32 ceil scale, E4M3 RNE); negative slots write nothing",
    support=SUPPORT,
    matrix=(Case(entry="window_publish", tokens=40, active_tokens=33, requests=3),
            Case(entry="window_publish", tokens=5, seed=4),
            Case(entry="window_publish", tokens=64, active_tokens=60, requests=5, seed=9)),
    slow_cases=(Case(entry="window_publish", tokens=192, active_tokens=180, requests=32,
                     preset="flash"),
                Case(entry="window_publish", tokens=4096, active_tokens=4000, requests=6,
                     preset="flash")),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(A5SIM_CHUNK), "a5": kernel_sut()},
    work=work,
))
