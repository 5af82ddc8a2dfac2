"""Checkpoints in the released V4.1-Flash safetensors layout: schema, loader, synthetic writer.

Layout (reference-facts section 8, v41-math-and-peers 1.1):

* ``config.json``: ``text_config`` (model fields) and ``quantization_config``
  (``quant_method "fp8"``, ``weight_block_size [32, 32]``, ``scale_fmt "ue8m0"``,
  ``expert_dtype "fp4"``).
* ``model.safetensors.index.json``: ``{"metadata": {"total_size": n}, "weight_map": {key:
  shard file}}``.
* Shards ``model-0000i-of-0000n.safetensors``: an 8-byte little-endian header length ``N``,
  ``N`` bytes of JSON (``{key: {"dtype", "shape", "data_offsets": [begin, end]}}`` plus an
  optional ``__metadata__``), then the data; offsets are relative to the data start.

:func:`checkpoint_schema` derives every key's ``(shape, safetensors dtype)`` from a
:class:`~goldens.config.V41Config` and its layer schedule:

* every layer: ``hc_attn_*``/``hc_ffn_*`` FP32 (``fn [mix_hc, hc_dim]``, ``scale [3]``,
  ``base [mix_hc]``), ``attn_norm``/``ffn_norm``, ``attn.wq_a``/``wq_b``/``wkv``/``wo_a``/
  ``wo_b`` as FP8 ``.weight`` ``[N, K]`` + E8M0 ``.scale`` ``[N/32, K/32]``, ``attn.q_norm``,
  ``attn.kv_norm``, ``attn.attn_sink [heads]`` FP32, ``ffn.gate.weight [experts, hidden]``,
  ``ffn.gate.bias [experts]`` FP32, routed experts ``ffn.experts.{e}.{w1,w3,w2}`` as I8
  packed FP4 ``[N, K/2]`` + E8M0 ``[N, K/32]``, shared experts FP8 + 32x32 E8M0.
* KV-source layers only (``layer_config(l).is_kv_source``): ``attn.compressor.wkv``
  ``[head_dim, hidden]`` and ``attn.compressor.norm``; ``attn.compressor.wgate`` only at
  ratio 2 (the ratio-1 source has no gate); ``attn.indexer.wk [index_head_dim, head_dim]``
  and ``attn.indexer.k_norm``.
* Index-source layers only: ``attn.indexer.wq_b`` (FP8 + scale) and
  ``attn.indexer.weights_proj [index_heads, hidden]``.  Reuse layers carry no indexer.
* ``embed.weight [vocab, hidden]``, ``norm.weight``, ``head.weight [vocab, hidden]``.

Storage decisions (documented; the loader's helpers hide them):

* Norm weights, the embedding, the indexer's ``wk``/``weights_proj`` and the ratio-1
  compressor ``wkv`` are stored BF16 (the released storage; the golden upcasts norms).
* ``linear_format`` (reference-facts section 8) makes ``head``, ``*.ffn.gate`` and the ratio-2
  ``compressor.*`` FP32-format: they are computed in FP32 whatever their storage.  The released
  checkpoint stores them BF16 (that is why the rule exists); ``fp32_storage="BF16"`` (default)
  writes that, ``fp32_storage="F32"`` writes FP32.  The loader accepts either storage for these
  keys and always returns FP32 (an exact upcast).
* ``attn.wo_a`` is FP8 ``[o_groups * o_lora_rank, o_group_in]`` + 32x32 E8M0 in the checkpoint,
  as released; ``linear_format`` makes it BF16, so :meth:`Checkpoint.wo_a` dequantizes it
  (exactly: E4M3 times a power of two fits BF16) to ``[o_groups, o_lora_rank, o_group_in]``.
* E8M0 scales (``F8_E8M0``) are returned as uint8 codes, I8 expert payloads as int8 by
  :meth:`Checkpoint.tensor` and as packed uint8 by :meth:`Checkpoint.linear` (the
  :mod:`goldens.quant` checkpoint layout).
* Out of scope and not in the schema (tolerated if present, readable raw with
  :meth:`Checkpoint.tensor`): Engram (``layers.{1,14}.engram.*``), DSpark (``mtp.*``), the
  vision tower, ``ffn.gate.bias_vl``.

Reading never loads a whole shard: a shard's header is read once (8 bytes + ``N``), and
:meth:`Checkpoint.tensor` seeks to the tensor's data range and reads exactly its bytes.  The
writer plans shards from the schema (sizes are known up front), writes each header first and
then streams tensor by tensor, generating large tensors in row chunks, so even FLASH never holds
more than one chunk of weights in memory.

Errors are :class:`CheckpointError` (a ``ValueError``) naming the key, file or field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import sys
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import torch

from goldens.compressor import CompressorWeights
from goldens.config import MX_GROUP, V41Config
from goldens.mhc import HcSiteWeights
from goldens.moe import ExpertWeights
from goldens.o_proj import OWeights
from goldens.qkv import QKVWeights
from goldens.quant import (dequantize_fp4_expert_weight, dequantize_fp8_weight,
                           from_checkpoint_int8, quantize_fp4_expert_weight, quantize_fp8_weight)

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 64 * 1024 * 1024
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")

# safetensors dtype string -> (torch dtype returned by Checkpoint.tensor, item size)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "F8_E4M3": (torch.float8_e4m3fn, 1),
    "F8_E8M0": (torch.uint8, 1),  # E8M0 codes, as goldens.quant carries them
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}

# text_config fields the loader checks against the preset
CHECKED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                  "sliding_window", "kv_source_layer_ids", "index_source_layer_ids")

Schema = dict[str, tuple[tuple[int, ...], str]]


class CheckpointError(ValueError):
    """A checkpoint that is missing, malformed or disagrees with the schema/preset."""


def _fail(msg: str):
    raise CheckpointError(msg)


# ---- schema -----------------------------------------------------------------------------------

def _fp8(schema: Schema, stem: str, n: int, k: int) -> None:
    g = MX_GROUP
    schema[f"{stem}.weight"] = ((n, k), "F8_E4M3")
    schema[f"{stem}.scale"] = ((n // g, k // g), "F8_E8M0")


def _fp4(schema: Schema, stem: str, n: int, k: int) -> None:
    schema[f"{stem}.weight"] = ((n, k // 2), "I8")
    schema[f"{stem}.scale"] = ((n, k // MX_GROUP), "F8_E8M0")


def _check_storage(fp32_storage: str) -> None:
    if fp32_storage not in ("BF16", "F32"):
        _fail(f"fp32_storage: {fp32_storage!r} must be 'BF16' or 'F32'")


def checkpoint_schema(config: V41Config, fp32_storage: str = "BF16") -> Schema:
    """Every key of the released layout for ``config``: ``key -> (shape, safetensors dtype)``,
    in file order (see the module docstring for which layers carry which weights).
    ``fp32_storage`` is the storage of the FP32-format keys (``head``, ``ffn.gate.weight``,
    ratio-2 ``compressor.wkv``/``wgate``)."""
    _check_storage(fp32_storage)
    c = config
    d, hd, ql = c.hidden_size, c.head_dim, c.q_lora_rank
    heads, g, ol, gi = c.num_heads, c.o_groups, c.o_lora_rank, c.o_group_in
    ih, idim = c.index.n_heads, c.index.head_dim
    m = c.moe
    inter, ne = m.intermediate_size, m.n_routed_experts
    s: Schema = {"embed.weight": ((c.vocab_size, d), "BF16")}
    for lc in c.layers():
        p = f"layers.{lc.layer}"
        s[f"{p}.hc_attn_fn"] = ((c.mix_hc, c.hc_dim), "F32")
        s[f"{p}.hc_attn_scale"] = ((3,), "F32")
        s[f"{p}.hc_attn_base"] = ((c.mix_hc,), "F32")
        s[f"{p}.attn_norm.weight"] = ((d,), "BF16")
        _fp8(s, f"{p}.attn.wq_a", ql, d)
        s[f"{p}.attn.q_norm.weight"] = ((ql,), "BF16")
        _fp8(s, f"{p}.attn.wq_b", heads * hd, ql)
        _fp8(s, f"{p}.attn.wkv", hd, d)
        s[f"{p}.attn.kv_norm.weight"] = ((hd,), "BF16")
        _fp8(s, f"{p}.attn.wo_a", g * ol, gi)
        _fp8(s, f"{p}.attn.wo_b", d, g * ol)
        s[f"{p}.attn.attn_sink"] = ((heads,), "F32")
        if lc.is_kv_source:
            cdt = fp32_storage if lc.ratio == 2 else "BF16"
            s[f"{p}.attn.compressor.wkv.weight"] = ((hd, d), cdt)
            if lc.ratio == 2:
                s[f"{p}.attn.compressor.wgate.weight"] = ((hd, d), cdt)
            s[f"{p}.attn.compressor.norm.weight"] = ((hd,), "BF16")
        if lc.is_index_source:
            _fp8(s, f"{p}.attn.indexer.wq_b", ih * idim, ql)
            s[f"{p}.attn.indexer.weights_proj.weight"] = ((ih, d), "BF16")
        if lc.is_kv_source:
            s[f"{p}.attn.indexer.wk.weight"] = ((idim, hd), "BF16")
            s[f"{p}.attn.indexer.k_norm.weight"] = ((idim,), "BF16")
        s[f"{p}.hc_ffn_fn"] = ((c.mix_hc, c.hc_dim), "F32")
        s[f"{p}.hc_ffn_scale"] = ((3,), "F32")
        s[f"{p}.hc_ffn_base"] = ((c.mix_hc,), "F32")
        s[f"{p}.ffn_norm.weight"] = ((d,), "BF16")
        s[f"{p}.ffn.gate.weight"] = ((ne, d), fp32_storage)
        s[f"{p}.ffn.gate.bias"] = ((ne,), "F32")
        for e in range(ne):
            q = f"{p}.ffn.experts.{e}"
            _fp4(s, f"{q}.w1", inter, d)
            _fp4(s, f"{q}.w3", inter, d)
            _fp4(s, f"{q}.w2", d, inter)
        si = inter * m.n_shared_experts
        _fp8(s, f"{p}.ffn.shared_experts.w1", si, d)
        _fp8(s, f"{p}.ffn.shared_experts.w3", si, d)
        _fp8(s, f"{p}.ffn.shared_experts.w2", d, si)
    s["norm.weight"] = ((d,), "BF16")
    s["head.weight"] = ((c.vocab_size, d), fp32_storage)
    return s


def _fp32_format_key(key: str) -> bool:
    """Keys whose ``linear_format`` is fp32 regardless of storage (ratio-2 compressors are
    decided by the caller, who knows the ratio)."""
    return key == "head.weight" or key.endswith(".ffn.gate.weight")


def linear_format(key: str, config: V41Config, storage: str) -> str:
    """``linear_format`` of a weight key (``stem`` or ``stem.weight``): ``head`` and
    ``*.ffn.gate`` -> ``fp32``, ``*.attn.wo_a`` -> ``bf16``, ratio-2 ``compressor.*`` ->
    ``fp32``, else by ``storage`` (F32 -> fp32, BF16 -> bf16, F8_E4M3 -> mxfp8, I8 -> mxfp4)."""
    stem = key[:-len(".weight")] if key.endswith(".weight") else key
    if stem == "head" or stem.endswith(".ffn.gate"):
        return "fp32"
    if stem.endswith(".attn.wo_a"):
        return "bf16"
    mo = re.match(r"^layers\.(\d+)\.attn\.compressor\.", stem)
    if mo and int(mo.group(1)) < config.num_layers \
            and config.compress_ratios[int(mo.group(1))] > 1:
        return "fp32"
    by_storage = {"F32": "fp32", "BF16": "bf16", "F8_E4M3": "mxfp8", "I8": "mxfp4"}
    if storage not in by_storage:
        _fail(f"{key}: storage dtype {storage} has no linear format")
    return by_storage[storage]


def _accepted_dtypes(key: str, want: str, config: V41Config) -> tuple[str, ...]:
    if _fp32_format_key(key) or (want in ("BF16", "F32") and ".attn.compressor.w" in key
                                 and linear_format(key, config, want) == "fp32"):
        return ("BF16", "F32")
    return (want,)


# ---- safetensors header -----------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """One header entry: dtype string, shape, absolute file byte range ``[begin, end)``."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class _Shard:
    """A shard's parsed header.  Entries are validated when first used (a corrupt entry only
    fails the keys that need it, but the framing is checked up front)."""

    def __init__(self, path: str, opener: Callable) -> None:
        self.path = path
        name = os.path.basename(path)
        try:
            size = os.path.getsize(path)
        except OSError as e:
            _fail(f"{name}: cannot stat shard ({e})")
        with opener(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                _fail(f"{name}: corrupt header: file is {size} bytes, shorter than the 8-byte "
                      f"header length")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                _fail(f"{name}: corrupt header: header length {n} exceeds the "
                      f"{MAX_HEADER_BYTES}-byte limit")
            if 8 + n > size:
                _fail(f"{name}: corrupt header: header length {n} runs past the end of the "
                      f"{size}-byte file")
            raw = f.read(n)
        if len(raw) != n:
            _fail(f"{name}: corrupt header: read {len(raw)} of {n} header bytes")
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            _fail(f"{name}: corrupt header: not UTF-8 JSON ({e})")
        if not isinstance(header, dict):
            _fail(f"{name}: corrupt header: JSON is a {type(header).__name__}, not an object")
        self.header = header
        self.data_start = 8 + n
        self.data_size = size - self.data_start
        self.header_bytes = 8 + n

    def keys(self) -> list[str]:
        return [k for k in self.header if k != "__metadata__"]

    def info(self, key: str) -> TensorInfo:
        name = os.path.basename(self.path)
        if key == "__metadata__" or key not in self.header:
            _fail(f"{key}: missing from shard {name} although the index maps it there")
        e = self.header[key]
        where = f"{key}: corrupt header entry in {name}"
        if not isinstance(e, dict):
            _fail(f"{where}: not an object")
        dt, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if dt not in DTYPES:
            _fail(f"{where}: dtype {dt!r} is not one of {sorted(DTYPES)}")
        if not isinstance(shape, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
            _fail(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in offs)):
            _fail(f"{where}: data_offsets {offs!r} is not [begin, end]")
        b, en = offs
        if not 0 <= b <= en <= self.data_size:
            _fail(f"{where}: data_offsets [{b}, {en}] outside the {self.data_size}-byte data")
        nbytes = math.prod(shape) * DTYPES[dt][1]
        if en - b != nbytes:
            _fail(f"{where}: data_offsets span {en - b} bytes but {dt} {shape} needs {nbytes}")
        return TensorInfo(dt, tuple(shape), self.data_start + b, self.data_start + en)


# ---- loader -----------------------------------------------------------------------------------

class IndexerWeights(NamedTuple):
    """An index source's query weights: checkpoint FP8 ``wq_b [H*Dh, q_lora]`` + uint8 E8M0
    scales, and ``weights_proj`` BF16 input-major ``[hidden, H]`` (as goldens.indexer wants)."""

    wq_b: torch.Tensor
    wq_b_scale: torch.Tensor
    weights_proj: torch.Tensor


class RouterWeights(NamedTuple):
    """FP32 gate ``[experts, hidden]`` and FP32 selection bias ``[experts]``."""

    weight: torch.Tensor
    bias: torch.Tensor


class ExpertLoader:
    """Lazy :class:`goldens.moe.ExpertLookup`: ``loader[e]`` reads ONE expert's tensors."""

    def __init__(self, ckpt: "Checkpoint", layer: int) -> None:
        self._ckpt, self._layer = ckpt, layer

    def __getitem__(self, expert: int) -> ExpertWeights:
        return self._ckpt.expert(self._layer, expert)

    def __len__(self) -> int:
        return self._ckpt.config.moe.n_routed_experts


def _as_int_list(v):
    return list(v) if isinstance(v, (list, tuple)) else v


class Checkpoint:
    """A released-layout checkpoint directory checked against ``config``.

    Construction reads ``config.json`` (quantization and model fields vs the preset) and the
    index; shard headers are read lazily, once each; :meth:`tensor` reads one byte range.
    ``bytes_read`` counts every byte this object has read from shard files.
    """

    def __init__(self, root: str | os.PathLike, config: V41Config) -> None:
        self.root = os.fspath(root)
        self.config = config
        self.bytes_read = 0
        self.text_config = self._read_config()
        self.weight_map = self._read_index()
        self._schema_bf16 = checkpoint_schema(config, "BF16")
        self._shards: dict[str, _Shard] = {}

    # -- files --
    def _read_json(self, name: str) -> dict:
        path = os.path.join(self.root, name)
        if not os.path.isfile(path):
            _fail(f"{name}: not found in checkpoint directory {self.root}")
        try:
            with open(path, "r", encoding="utf-8") as f:
                data = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            _fail(f"{name}: not valid JSON ({e})")
        if not isinstance(data, dict):
            _fail(f"{name}: top level must be a JSON object")
        return data

    def _read_config(self) -> dict:
        raw = self._read_json(CONFIG_FILE)
        text = raw.get("text_config", raw)
        if not isinstance(text, dict):
            _fail(f"{CONFIG_FILE} text_config: must be an object")
        qc = raw.get("quantization_config", text.get("quantization_config"))
        if not isinstance(qc, dict):
            _fail(f"{CONFIG_FILE} quantization_config: missing (need quant_method 'fp8', "
                  f"weight_block_size [32, 32])")
        cq = self.config.quant
        if qc.get("quant_method") != cq.quant_method:
            _fail(f"{CONFIG_FILE} quantization_config.quant_method: file has "
                  f"{qc.get('quant_method')!r}, preset {self.config.name} needs "
                  f"{cq.quant_method!r}")
        want_block = list(cq.weight_block_size)
        if _as_int_list(qc.get("weight_block_size")) != want_block:
            _fail(f"{CONFIG_FILE} quantization_config.weight_block_size: file has "
                  f"{qc.get('weight_block_size')!r}, preset {self.config.name} needs "
                  f"{want_block}")
        for field, want in _expected_text_fields(self.config).items():
            if field not in text:
                _fail(f"{CONFIG_FILE} text_config.{field}: missing, preset {self.config.name} "
                      f"has {want!r}")
            got = _as_int_list(text[field])
            if got != want:
                _fail(f"{CONFIG_FILE} text_config.{field}: file has {text[field]!r}, preset "
                      f"{self.config.name} has {want!r}")
        return text

    def _read_index(self) -> dict[str, str]:
        idx = self._read_json(INDEX_FILE)
        wm = idx.get("weight_map")
        if not isinstance(wm, dict):
            _fail(f"{INDEX_FILE} weight_map: missing or not an object")
        for k, v in wm.items():
            if not isinstance(v, str) or os.path.basename(v) != v or not v:
                _fail(f"{INDEX_FILE} weight_map[{k!r}]: {v!r} is not a plain shard file name")
        return wm

    def _shard(self, name: str) -> _Shard:
        sh = self._shards.get(name)
        if sh is None:
            path = os.path.join(self.root, name)
            if not os.path.isfile(path):
                _fail(f"{name}: shard file named by the index does not exist in {self.root}")
            sh = _Shard(path, open)
            self.bytes_read += sh.header_bytes
            self._shards[name] = sh
        return sh

    # -- schema --
    def schema_entry(self, key: str) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
        """``(shape, accepted dtypes)`` of a schema key, ``None`` for keys outside the schema."""
        e = self._schema_bf16.get(key)
        if e is None:
            return None
        return e[0], _accepted_dtypes(key, e[1], self.config)

    def keys(self) -> list[str]:
        """Every key the index maps (schema keys and any extra released keys)."""
        return list(self.weight_map)

    def missing_keys(self) -> list[str]:
        return [k for k in self._schema_bf16 if k not in self.weight_map]

    def info(self, key: str) -> TensorInfo:
        """The header entry of ``key`` (reads at most the shard header), checked against the
        schema."""
        if key not in self.weight_map:
            where = "a schema key" if key in self._schema_bf16 else "not a schema key"
            _fail(f"{key}: missing from {INDEX_FILE} weight_map ({where} for preset "
                  f"{self.config.name})")
        info = self._shard(self.weight_map[key]).info(key)
        entry = self.schema_entry(key)
        if entry is not None:
            shape, dtypes = entry
            if info.dtype not in dtypes:
                _fail(f"{key}: dtype {info.dtype} in {self.weight_map[key]}, schema expects "
                      f"{' or '.join(dtypes)}")
            if info.shape != shape:
                _fail(f"{key}: shape {list(info.shape)} in {self.weight_map[key]}, schema "
                      f"expects {list(shape)}")
        return info

    def validate(self) -> None:
        """Check every schema key is mapped and its header entry matches (headers only)."""
        miss = self.missing_keys()
        if miss:
            _fail(f"{miss[0]}: missing from {INDEX_FILE} weight_map ({len(miss)} schema keys "
                  f"missing)")
        for k in self._schema_bf16:
            self.info(k)

    # -- raw reads --
    def tensor(self, key: str) -> torch.Tensor:
        """The stored tensor of ``key`` in its storage dtype (F8_E8M0 -> uint8 codes, I8 ->
        int8), reading exactly its byte range from its shard."""
        info = self.info(key)
        dtype, _ = DTYPES[info.dtype]
        n = info.end - info.begin
        name = self.weight_map[key]
        if n == 0:
            return torch.empty(info.shape, dtype=dtype)
        buf = bytearray(n)
        with open(self._shards[name].path, "rb") as f:
            f.seek(info.begin)
            got = f.readinto(buf)
        self.bytes_read += got or 0
        if got != n:
            _fail(f"{key}: shard {name} is truncated: read {got} of {n} bytes")
        if sys.byteorder != "little":  # pragma: no cover - safetensors is little-endian
            _fail("big-endian hosts are not supported")
        return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(info.shape)

    def _stem(self, key: str) -> str:
        return key[:-len(".weight")] if key.endswith(".weight") else key

    def linear(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(payload, scales)`` of a quantized linear ``stem`` (or ``stem.weight``) in the
        :mod:`goldens.quant` checkpoint layout: FP8 -> (float8_e4m3fn ``[N, K]``, uint8
        ``[N/32, K/32]``); packed FP4 -> (uint8 ``[N, K/2]``, uint8 ``[N, K/32]``)."""
        stem = self._stem(key)
        w = self.tensor(f"{stem}.weight")
        if w.dtype == torch.int8:
            w = from_checkpoint_int8(w)
        elif w.dtype != torch.float8_e4m3fn:
            _fail(f"{stem}.weight: stored {w.dtype}, not a quantized (FP8 or I8) linear")
        return w, self.tensor(f"{stem}.scale")

    def format(self, key: str) -> str:
        """``linear_format`` of ``key`` given its stored dtype."""
        stem = self._stem(key)
        full = f"{stem}.weight" if f"{stem}.weight" in self.weight_map else stem
        return linear_format(full, self.config, self.info(full).dtype)

    def dense(self, key: str) -> torch.Tensor:
        """FP32 ``[N, K]`` of any weight (dequantized FP8/FP4, upcast BF16/F32), exact."""
        stem = self._stem(key)
        full = f"{stem}.weight" if f"{stem}.weight" in self.weight_map else stem
        st = self.info(full).dtype
        if st == "F8_E4M3":
            return dequantize_fp8_weight(*self.linear(stem))
        if st == "I8":
            return dequantize_fp4_expert_weight(*self.linear(stem))
        return self.tensor(full).to(torch.float32)

    # -- golden-ready helpers --
    def _layer(self, layer: int) -> str:
        self.config.layer_config(layer)  # validates the index
        return f"layers.{layer}"

    def norm(self, key: str) -> torch.Tensor:
        """A norm weight upcast to FP32."""
        return self.tensor(key).to(torch.float32)

    def attn_norm(self, layer: int) -> torch.Tensor:
        return self.norm(f"{self._layer(layer)}.attn_norm.weight")

    def ffn_norm(self, layer: int) -> torch.Tensor:
        return self.norm(f"{self._layer(layer)}.ffn_norm.weight")

    def final_norm(self) -> torch.Tensor:
        return self.norm("norm.weight")

    def embed(self) -> torch.Tensor:
        """BF16 ``[vocab, hidden]`` embedding table."""
        return self.tensor("embed.weight")

    def head(self) -> torch.Tensor:
        """FP32 ``[vocab, hidden]`` LM head (fp32 format)."""
        return self.tensor("head.weight").to(torch.float32)

    def hc_site(self, layer: int, site: str) -> HcSiteWeights:
        """FP32 mHC parameters of ``site`` (``"attn"`` or ``"ffn"``)."""
        if site not in ("attn", "ffn"):
            _fail(f"site: {site!r} must be 'attn' or 'ffn'")
        p = f"{self._layer(layer)}.hc_{site}"
        return HcSiteWeights(self.tensor(f"{p}_fn"), self.tensor(f"{p}_scale"),
                             self.tensor(f"{p}_base"))

    def qkv_weights(self, layer: int) -> QKVWeights:
        """Checkpoint-layout Q/KV weights (FP8 + E8M0), norms upcast to FP32."""
        p = f"{self._layer(layer)}.attn"
        wq_a, wq_a_s = self.linear(f"{p}.wq_a")
        wq_b, wq_b_s = self.linear(f"{p}.wq_b")
        wkv, wkv_s = self.linear(f"{p}.wkv")
        return QKVWeights(wq_a, wq_a_s, self.norm(f"{p}.q_norm.weight"), wq_b, wq_b_s,
                          wkv, wkv_s, self.norm(f"{p}.kv_norm.weight"))

    def wo_a(self, layer: int) -> torch.Tensor:
        """``wo_a`` dequantized (exactly) to BF16 ``[o_groups, o_lora_rank, o_group_in]``."""
        c = self.config
        w = dequantize_fp8_weight(*self.linear(f"{self._layer(layer)}.attn.wo_a"))
        return w.to(torch.bfloat16).reshape(c.o_groups, c.o_lora_rank, c.o_group_in)

    def o_weights(self, layer: int) -> OWeights:
        wo_b, wo_b_s = self.linear(f"{self._layer(layer)}.attn.wo_b")
        return OWeights(self.wo_a(layer), wo_b, wo_b_s)

    def attn_sink(self, layer: int) -> torch.Tensor:
        return self.tensor(f"{self._layer(layer)}.attn.attn_sink")

    def compressor_weights(self, layer: int) -> CompressorWeights:
        """A KV source's compressor and index-key weights, input-major as
        :mod:`goldens.compressor` wants: ratio 2 ``wkv``/``wgate`` FP32 ``[hidden, head_dim]``;
        ratio 1 ``wkv`` BF16, no gate; ``index_wk`` BF16 ``[head_dim, index_head_dim]``."""
        lc = self.config.layer_config(layer)
        if not lc.is_kv_source:
            src = f"its KV source is layer {lc.kv_source}" if lc.kv_source is not None \
                else "it is a sliding-window layer"
            _fail(f"layer {layer}: owns no compressor ({src})")
        p = f"layers.{layer}.attn"
        if lc.ratio == 2:
            wkv = self.tensor(f"{p}.compressor.wkv.weight").to(torch.float32).T.contiguous()
            wgate = self.tensor(f"{p}.compressor.wgate.weight").to(torch.float32).T.contiguous()
        else:
            wkv = self.tensor(f"{p}.compressor.wkv.weight").to(torch.bfloat16).T.contiguous()
            wgate = None
        return CompressorWeights(
            wkv=wkv, norm=self.norm(f"{p}.compressor.norm.weight"),
            index_wk=self.tensor(f"{p}.indexer.wk.weight").to(torch.bfloat16).T.contiguous(),
            index_norm=self.norm(f"{p}.indexer.k_norm.weight"), wgate=wgate)

    def indexer_weights(self, layer: int) -> IndexerWeights:
        """An index source's ``wq_b`` (checkpoint FP8) and ``weights_proj`` (BF16
        ``[hidden, H]``)."""
        lc = self.config.layer_config(layer)
        if not lc.is_index_source:
            src = f"its index source is layer {lc.index_source}" \
                if lc.index_source is not None else "it is a sliding-window layer"
            _fail(f"layer {layer}: carries no indexer query weights ({src})")
        p = f"layers.{layer}.attn.indexer"
        wq_b, wq_b_s = self.linear(f"{p}.wq_b")
        wp = self.tensor(f"{p}.weights_proj.weight").to(torch.bfloat16).T.contiguous()
        return IndexerWeights(wq_b, wq_b_s, wp)

    def router(self, layer: int) -> RouterWeights:
        p = f"{self._layer(layer)}.ffn.gate"
        return RouterWeights(self.tensor(f"{p}.weight").to(torch.float32),
                             self.tensor(f"{p}.bias").to(torch.float32))

    def expert(self, layer: int, e: int) -> ExpertWeights:
        """ONE routed expert: packed uint8 payloads + uint8 E8M0 scales (W1/W3 ``[I, D/2]``,
        W2 ``[D, I/2]``)."""
        n = self.config.moe.n_routed_experts
        if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < n:
            _fail(f"expert: {e!r} outside [0, {n})")
        p = f"{self._layer(layer)}.ffn.experts.{e}"
        return ExpertWeights(*self.linear(f"{p}.w1"), *self.linear(f"{p}.w3"),
                             *self.linear(f"{p}.w2"))

    def experts(self, layer: int) -> ExpertLoader:
        """Lazy lookup for :mod:`goldens.moe`: each index reads one expert."""
        self._layer(layer)
        return ExpertLoader(self, layer)

    def shared_expert(self, layer: int) -> ExpertWeights:
        p = f"{self._layer(layer)}.ffn.shared_experts"
        return ExpertWeights(*self.linear(f"{p}.w1"), *self.linear(f"{p}.w3"),
                             *self.linear(f"{p}.w2"))


def _expected_text_fields(c: V41Config) -> dict:
    return {"hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads, "head_dim": c.head_dim,
            "sliding_window": c.sliding_window,
            "kv_source_layer_ids": list(c.kv_source_layer_ids),
            "index_source_layer_ids": list(c.index_source_layer_ids)}


# ---- config.json ------------------------------------------------------------------------------

def config_json(config: V41Config) -> dict:
    """``config.json`` contents for ``config``: ``text_config`` + ``quantization_config``."""
    c, r, m, ix, hc, q, en = (config, config.rope, config.moe, config.index, config.hc,
                              config.quant, config.engram)
    text = {
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "num_key_value_heads": 1, "head_dim": c.head_dim, "qk_rope_head_dim": r.rope_dim,
        "q_lora_rank": c.q_lora_rank, "o_lora_rank": c.o_lora_rank, "o_groups": c.o_groups,
        "sliding_window": c.sliding_window, "compress_ratios": list(c.compress_ratios),
        "kv_source_layer_ids": list(c.kv_source_layer_ids),
        "index_source_layer_ids": list(c.index_source_layer_ids),
        "candidate_source_layer_id": c.candidate_source_layer_id,
        "candidate_topk_blocks": ix.candidate_topk_blocks,
        "candidate_block_size": ix.candidate_block_size,
        "index_n_heads": ix.n_heads, "index_head_dim": ix.head_dim, "index_topk": ix.topk,
        "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": r.max_position,
        "rope_theta": r.theta, "compress_rope_theta": r.compress_theta,
        "rope_scaling": {"type": "yarn", "factor": r.factor,
                         "original_max_position_embeddings": r.original_max_position,
                         "beta_fast": r.beta_fast, "beta_slow": r.beta_slow},
        "n_routed_experts": m.n_routed_experts, "n_shared_experts": m.n_shared_experts,
        "num_experts_per_tok": m.num_experts_per_tok,
        "moe_intermediate_size": m.intermediate_size, "scoring_func": m.scoring_func,
        "gate_temperature": m.gate_temperature, "norm_topk_prob": m.norm_topk_prob,
        "routed_scaling_factor": m.routed_scaling_factor, "swiglu_limit": m.swiglu_limit,
        "hc_mult": hc.hc_mult, "hc_sinkhorn_iters": hc.sinkhorn_iters, "hc_eps": hc.eps,
        "engram_layer_ids": list(en.layer_ids),
        "engram_num_embeddings": list(en.num_embeddings),
        "engram_max_ngram_size": en.max_ngram_size, "engram_vocab_size": en.vocab_size,
        "engram_n_heads": en.n_heads, "engram_head_dim": en.head_dim,
        "engram_pad_token_id": en.pad_token_id,
        "engram_compressed_vocab_size": en.compressed_vocab_size,
        "torch_dtype": q.dtype,
    }
    quant = {"quant_method": q.quant_method, "activation_scheme": q.activation_scheme,
             "fmt": "e4m3", "scale_fmt": q.scale_fmt,
             "weight_block_size": list(q.weight_block_size), "expert_dtype": q.expert_dtype}
    return {"model_type": "deepseek_v4_1", "preset": c.name, "text_config": text,
            "quantization_config": quant}


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
