"""Synthetic checkpoint writer: a seeded checkpoint of any preset in the released
layout, streamed tensor by tensor into pre-planned shards.  See :mod:`goldens.checkpoint`."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from typing import Callable, Iterator, NamedTuple

import torch

from goldens.checkpoint.schema import (_SHARD_RE, CONFIG_FILE, DTYPES, INDEX_FILE, Schema, _fail,
                                       checkpoint_schema, config_json)
from goldens.config import MX_GROUP, V41Config
from goldens.quant import quantize_fp4_expert_weight, quantize_fp8_weight

# ---- synthetic writer -------------------------------------------------------------------------

_CHUNK_ELEMS = 1 << 24  # generation chunk: at most ~16M elements (64 MiB FP32) at a time


def _tensor_seed(seed: int, key: str) -> int:
    h = hashlib.sha256(f"v41-synthetic-checkpoint:{seed}:{key}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _row_chunks(rows: int, cols: int) -> Iterator[tuple[int, int]]:
    """Row ranges, multiples of 32 rows (whole FP8 blocks), of at most ~_CHUNK_ELEMS elements;
    a fixed function of the shape so generation is reproducible."""
    step = max(MX_GROUP, (_CHUNK_ELEMS // max(cols, 1)) // MX_GROUP * MX_GROUP)
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


_TORCH_OF = {"F32": torch.float32, "BF16": torch.bfloat16}


class _Group(NamedTuple):
    keys: tuple[str, ...]  # ("X.weight",) or ("X.weight", "X.scale")
    nbytes: int


def _groups(schema: Schema) -> list[_Group]:
    out: list[_Group] = []
    keys = list(schema)
    i = 0
    while i < len(keys):
        k = keys[i]
        size = math.prod(schema[k][0]) * DTYPES[schema[k][1]][1]
        if k.endswith(".weight") and i + 1 < len(keys) and keys[i + 1] == k[:-7] + ".scale":
            k2 = keys[i + 1]
            size += math.prod(schema[k2][0]) * DTYPES[schema[k2][1]][1]
            out.append(_Group((k, k2), size))
            i += 2
        else:
            out.append(_Group((k,), size))
            i += 1
    return out


def _kind(key: str) -> str:
    """What a key's synthetic values look like."""
    if key.endswith("_norm.weight") or key.endswith(".norm.weight") or key == "norm.weight":
        return "norm"
    if re.search(r"\.hc_(attn|ffn)_fn$", key):
        return "hc_fn"
    if re.search(r"\.hc_(attn|ffn)_scale$", key):
        return "hc_scale"
    if re.search(r"\.hc_(attn|ffn)_base$", key):
        return "hc_base"
    if key.endswith(".attn_sink"):
        return "sink"
    if key.endswith(".ffn.gate.bias"):
        return "bias"
    if key == "embed.weight":
        return "embed"
    return "linear"  # N(0, 1/K): [N, K] with K the input width


def _emit(key_group: tuple[str, ...], schema: Schema, seed: int,
          write: Callable[[str, bytes], None]) -> None:
    """Generate one key group and stream ``write(key, bytes)`` (weight, then scale)."""
    key = key_group[0]
    shape, dt = schema[key]
    gen = torch.Generator().manual_seed(_tensor_seed(seed, key))
    kind = _kind(key)
    if dt in ("F8_E4M3", "I8"):
        n = shape[0]
        k = shape[1] * (2 if dt == "I8" else 1)
        scales = []
        for r0, r1 in _row_chunks(n, k):
            w = torch.randn(r1 - r0, k, generator=gen) * k ** -0.5
            if dt == "F8_E4M3":
                payload, sc = quantize_fp8_weight(w)
            else:
                payload, sc = quantize_fp4_expert_weight(w)
                payload = payload.view(torch.int8)
            write(key, _bytes(payload))
            scales.append(sc)
        write(key_group[1], _bytes(torch.cat(scales)))
        return
    if len(shape) == 1:
        n = shape[0]
        if kind == "norm":
            v = 1.0 + 0.1 * torch.randn(n, generator=gen)
        elif kind == "hc_scale":
            v = 0.5 + 0.5 * torch.rand(n, generator=gen)
        elif kind == "hc_base":
            v = 0.1 * torch.randn(n, generator=gen)
        elif kind == "sink":
            v = torch.randn(n, generator=gen)
        elif kind == "bias":
            v = 0.01 * torch.randn(n, generator=gen)
        else:
            v = torch.randn(n, generator=gen)
        write(key, _bytes(v.to(_TORCH_OF[dt])))
        return
    rows, cols = shape
    std = 1.0 if kind == "embed" else cols ** -0.5
    for r0, r1 in _row_chunks(rows, cols):
        write(key, _bytes((torch.randn(r1 - r0, cols, generator=gen) * std)
                          .to(_TORCH_OF[dt])))


def _header_bytes(entries: dict) -> bytes:
    raw = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def default_shard_bytes(total: int) -> int:
    """At most 2 GiB per shard and at least four shards when the tensors allow."""
    return max(1, min(2 << 30, -(-total // 4)))


def write_synthetic_checkpoint(root: str | os.PathLike, config: V41Config, seed: int,
                               shard_bytes: int | None = None, fp32_storage: str = "BF16",
                               overwrite: bool = False,
                               on_bytes: Callable[[str, bytes], None] | None = None) -> dict:
    """Write a complete checkpoint of ``config`` in the released layout from ``seed``.

    Values: norms ``1 + 0.1 N(0,1)``; linears ``N(0, 1/K)`` quantized with
    :func:`~goldens.quant.quantize_fp8_weight` (FP8 keys) or
    :func:`~goldens.quant.quantize_fp4_expert_weight` (routed experts, stored I8); BF16/FP32
    dense matrices ``N(0, 1/K)``; embedding ``N(0, 1)``; mHC ``fn`` ``N(0, 1/hc_dim)``, scale
    ``U(0.5, 1)``, base ``0.1 N(0,1)``; attention sinks ``N(0, 1)``; gate bias
    ``0.01 N(0,1)``.  Each tensor has its own generator seeded from ``(seed, key)``, so a
    tensor's bytes do not depend on sharding.  Shards hold at most ``shard_bytes`` of tensor
    data (a larger weight+scale pair gets its own shard); default
    :func:`default_shard_bytes`.  ``on_bytes(key, chunk)``, if given, sees every data chunk
    as it is written (in file order).  Returns the index dict.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        _fail(f"seed: {seed!r} must be an int")
    root = os.fspath(root)
    schema = checkpoint_schema(config, fp32_storage)
    groups = _groups(schema)
    total = sum(g.nbytes for g in groups)
    if shard_bytes is None:
        shard_bytes = default_shard_bytes(total)
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes < 1:
        _fail(f"shard_bytes: {shard_bytes!r} must be a positive int")
    os.makedirs(root, exist_ok=True)
    old = [f for f in os.listdir(root) if _SHARD_RE.match(f) or f in (INDEX_FILE, CONFIG_FILE)]
    if old and not overwrite:
        _fail(f"root: {root} already holds a checkpoint ({sorted(old)[0]}); pass overwrite=True")
    for f in old:
        os.remove(os.path.join(root, f))

    plan: list[list[_Group]] = [[]]
    used = 0
    for g in groups:
        if plan[-1] and used + g.nbytes > shard_bytes:
            plan.append([])
            used = 0
        plan[-1].append(g)
        used += g.nbytes
    n = len(plan)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(plan):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        entries: dict = {"__metadata__": {"format": "pt"}}
        off = 0
        for g in shard:
            for k in g.keys:
                shape, dt = schema[k]
                nb = math.prod(shape) * DTYPES[dt][1]
                entries[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]}
                off += nb
                weight_map[k] = name
        path = os.path.join(root, name)
        with open(path, "wb") as f:
            f.write(_header_bytes(entries))
            written = 0

            def write(key: str, b: bytes) -> None:
                nonlocal written
                f.write(b)
                written += len(b)
                if on_bytes is not None:
                    on_bytes(key, b)

            for g in shard:
                _emit(g.keys, schema, seed, write)
        if written != off:  # pragma: no cover - generator/schema disagreement is a bug
            raise AssertionError(f"{name}: wrote {written} data bytes, planned {off}")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(root, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    cfg = config_json(config)
    cfg["synthetic"] = {"seed": seed, "fp32_storage": fp32_storage}
    with open(os.path.join(root, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return index

