"""Fixtures, golden call and comparison shared by the compressor entries
(``compressor_ratio1``, ``compressor_ratio2``, ``compressor_state``).

Metadata (deterministic in the seed): ``case.requests`` requests share the
``case.active`` valid tokens; each request continues a prefix of random length, so its
positions are consecutive from there.  Every eleventh valid token (``t % 11 == 10``) is
inert: position -1 and a junk slot ``>= 0`` that must not be published.  A token that
completes a group (every token at ratio 1, odd positions at ratio 2) gets the paged row of
its compressed index ``(p + 1) / ratio - 1`` through a nonidentity block table, except
every seventh valid token (``t % 7 == 6``), whose slot is -1.  Padding rows (``t >=
num_tokens``) carry junk x (7.0), a position past the RoPE table and a slot ``>= 0``:
reading or publishing them shows.  The caches start as random bytes.

Ratio 2 adds the state ring: every third request (``r % 3 == 2``, when there are at least
three) is disabled (state block -1, slots -1; it alone holds inert rows, since the kernel
takes nonnegative positions in enabled chunks), the others own distinct blocks of a
``requests + 2``-block ring drawn from a nonidentity permutation, and the ring starts as
FP32 normals (the predecessors of chunks that start at an odd position).
"""

from __future__ import annotations

import torch

from goldens.compressor import CompressorWeights, SourceCaches, compress_and_publish
from goldens.quant import dequantize_compressed_kv, dequantize_index_key
from goldens.rope import precompute_rope_tables
from harness.compare import MXFP4_CACHE_MAX_REL_L2, check_dequantized_rows, check_non_owned_bytes
from harness.fixtures import generator, nonidentity_permutation, randn, split_lengths

CACHES = ("compressed_kv", "compressed_kv_scale", "index_key", "index_key_scale")
INERT_EVERY = 11
UNPUBLISHED_EVERY = 7


def metadata(config, case, ratio: int) -> dict:
    """Packed metadata of one call (see the module docstring); INT32 tensors, plus the
    ``blocks`` and ``capacity`` the caches and RoPE tables need."""
    bs, n, T, B, seed = config.cache.block_size, case.active, case.tokens, case.requests, case.seed
    lens = split_lengths(n, B, seed, "qlens", allow_empty=n < B)
    prefix = torch.randint(0, 3 * bs, (B,), generator=generator(seed, "prefix")).tolist()
    disabled = {r for r in range(B) if ratio == 2 and B >= 3 and r % 3 == 2}
    pos = torch.full((T,), -1, dtype=torch.int64)
    req = torch.zeros(T, dtype=torch.int64)
    qsl = [0]
    for r, length in enumerate(lens):
        p = prefix[r]
        for t in range(qsl[-1], qsl[-1] + length):
            req[t] = r
            if t % INERT_EVERY != INERT_EVERY - 1 or (ratio == 2 and r not in disabled):
                pos[t] = p
                p += 1
        qsl.append(qsl[-1] + length)
    pages = [-(-((prefix[r] + lens[r]) // ratio) // bs) + 1 for r in range(B)]
    blocks = sum(pages) + 2
    perm = nonidentity_permutation(blocks, seed, "blocks").tolist()
    table, at = [], 0
    for r in range(B):
        table.append(perm[at:at + pages[r]])
        at += pages[r]
    rows_total = blocks * bs
    slots = torch.full((T,), -1, dtype=torch.int64)
    for t in range(n):
        p = int(pos[t])
        if p < 0:
            slots[t] = (5 * t) % rows_total  # inert: never read
        elif int(req[t]) in disabled:
            continue
        elif (p + 1) % ratio == 0 and t % UNPUBLISHED_EVERY != UNPUBLISHED_EVERY - 1:
            ci = (p + 1) // ratio - 1
            slots[t] = table[int(req[t])][ci // bs] * bs + ci % bs
    capacity = -(-(int(pos.max()) + 2) // 64) * 64
    pos[n:] = capacity + 3  # padding: past the table, never read
    slots[n:] = torch.arange(T - n) % rows_total
    req[n:] = B + 5
    out = {"query_start_loc": torch.tensor(qsl, dtype=torch.int32),
           "position_ids": pos.to(torch.int32), "token_to_req_indices": req.to(torch.int32),
           "compressed_slots": slots.to(torch.int32),
           "num_tokens": torch.tensor([n], dtype=torch.int32),
           "blocks": blocks, "capacity": capacity}
    if ratio == 2:
        owners = nonidentity_permutation(B + 2, seed, "state_blocks")[:B]
        table = torch.tensor([-1 if r in disabled else int(owners[r]) for r in range(B)],
                             dtype=torch.int32).reshape(B, 1)
        out["state_block_table"] = table
        out["state_blocks"] = B + 2
    return out


def weights(config, case, ratio: int) -> dict:
    """Compressor weights: wkv (BF16 at ratio 1, FP32 at ratio 2), wgate (ratio 2), FP32
    norms near 1, BF16 index_wk."""
    h, d, di, s = config.hidden_size, config.head_dim, config.index.head_dim, case.seed
    dt = torch.bfloat16 if ratio == 1 else torch.float32
    out = {"wkv": randn((h, d), s, "wkv", dt, h ** -0.5),
           "norm": 1.0 + randn((d,), s, "norm", scale=0.1),
           "index_wk": randn((d, di), s, "index_wk", torch.bfloat16, d ** -0.5),
           "index_norm": 1.0 + randn((di,), s, "index_norm", scale=0.1)}
    if ratio == 2:
        out["wgate"] = randn((h, d), s, "wgate", torch.float32, h ** -0.5)
    return out


def caches(config, blocks: int, seed: int, tag: str = "hist") -> dict:
    """The four caches as uint8 ``[blocks, block_size, 1, .]`` of random bytes."""
    c, bs = config.cache, config.cache.block_size
    d, di = config.head_dim, config.index.head_dim
    widths = {"compressed_kv": d // 2, "compressed_kv_scale": d // c.compressed_group,
              "index_key": di // 2, "index_key_scale": di // c.index_group}
    return {k: torch.randint(0, 256, (blocks, bs, 1, w), generator=generator(seed, tag, k),
                             dtype=torch.uint8) for k, w in widths.items()}


def build_inputs(config, case, ratio: int) -> dict:
    meta = metadata(config, case, ratio)
    blocks, capacity = meta.pop("blocks"), meta.pop("capacity")
    n = case.active
    x = randn((case.tokens, config.hidden_size), case.seed, "x", torch.bfloat16)
    x[n:] = 7.0
    cos, sin = precompute_rope_tables(config, compressed=True, capacity=capacity)
    out = {"x": x, **weights(config, case, ratio), "freqs_cos": cos, "freqs_sin": sin,
           **meta, **caches(config, blocks, case.seed)}
    if ratio == 2:
        nsb = out.pop("state_blocks")
        out["state_cache"] = randn((nsb, config.cache.state_capacity, config.state_width),
                                   case.seed, "state")
    return out


def source_caches(tensors: dict) -> SourceCaches:
    """The golden's view of uint8 caches (E4M3 scale bytes viewed as float8, shared storage)."""
    return SourceCaches(tensors["compressed_kv"],
                        tensors["compressed_kv_scale"].view(torch.float8_e4m3fn),
                        tensors["index_key"], tensors["index_key_scale"])


def golden_weights(inputs: dict) -> CompressorWeights:
    return CompressorWeights(inputs["wkv"], inputs["norm"], inputs["index_wk"],
                             inputs["index_norm"], inputs.get("wgate"))


def run_golden(config, ratio: int, inputs: dict, caches_out: dict, state_cache=None):
    """``compress_and_publish`` over ``inputs`` into ``caches_out`` (uint8, in place)."""
    return compress_and_publish(
        config, ratio, inputs["x"], golden_weights(inputs),
        query_start_loc=inputs["query_start_loc"], position_ids=inputs["position_ids"],
        token_to_req_indices=inputs["token_to_req_indices"],
        num_tokens=int(inputs["num_tokens"][0]), compressed_slots=inputs["compressed_slots"],
        freqs_cos=inputs["freqs_cos"], freqs_sin=inputs["freqs_sin"],
        caches=source_caches(caches_out),
        state_block_table=inputs.get("state_block_table"), state_cache=state_cache)


def published_slots(inputs: dict) -> torch.Tensor:
    """Physical rows the call publishes: valid, nonnegative position and slot, and (ratio
    2) enabled request closing a group -- the rows the golden marks ``published``."""
    n = int(inputs["num_tokens"][0])
    pos, slots = inputs["position_ids"][:n].long(), inputs["compressed_slots"][:n].long()
    live = (pos >= 0) & (slots >= 0)
    if "state_block_table" in inputs:
        req = inputs["token_to_req_indices"][:n].long()
        live &= inputs["state_block_table"][:, 0].long()[req.clamp(0, None)] >= 0
        live &= (pos % 2) == 1
    return slots[live]


def _dequantized(config, tensors: dict, slots: torch.Tensor):
    c = config.cache
    d, di = config.head_dim, config.index.head_dim
    kv = dequantize_compressed_kv(tensors["compressed_kv"].reshape(-1, d // 2)[slots],
                                  tensors["compressed_kv_scale"].reshape(-1, d // c.compressed_group)
                                  [slots].view(torch.float8_e4m3fn), c.compressed_group)
    ik = dequantize_index_key(tensors["index_key"].reshape(-1, di // 2)[slots],
                              tensors["index_key_scale"].reshape(-1, di // c.index_group)[slots],
                              c.index_group)
    return kv, ik


def compare_caches(config, inputs: dict, gold: dict, actual: dict, slots=None) -> list:
    """Published rows dequantized (MXFP4 relative L2 <= 4 %), every other byte of the four
    caches identical to the input.  ``slots``: the published rows (default: those of the
    one call ``inputs`` describes)."""
    slots = published_slots(inputs) if slots is None else slots
    verdicts = []
    for name in CACHES:
        verdicts += check_non_owned_bytes(name, actual[name], inputs[name], owned=slots)
    if slots.numel():
        a_kv, a_ik = _dequantized(config, actual, slots)
        g_kv, g_ik = _dequantized(config, gold, slots)
        verdicts += check_dequantized_rows("compressed_kv.dequantized", a_kv, g_kv,
                                           max_rel_l2=MXFP4_CACHE_MAX_REL_L2)
        verdicts += check_dequantized_rows("index_key.dequantized", a_ik, g_ik,
                                           max_rel_l2=MXFP4_CACHE_MAX_REL_L2)
    return verdicts
