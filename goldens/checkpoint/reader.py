"""Checkpoint reader: safetensors headers and byte-range tensor reads, and per-layer
golden weights.  Never loads a whole shard.  See :mod:`goldens.checkpoint`."""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from goldens.compressor import CompressorWeights
from goldens.checkpoint.schema import (CONFIG_FILE, DTYPES, INDEX_FILE, MAX_HEADER_BYTES,
                                       _accepted_dtypes, _expected_text_fields, _fail,
                                       checkpoint_schema, linear_format)
from goldens.config import V41Config
from goldens.mhc import HcSiteWeights
from goldens.moe import ExpertWeights
from goldens.o_proj import OWeights
from goldens.qkv import QKVWeights
from goldens.quant import dequantize_fp4_expert_weight, dequantize_fp8_weight, from_checkpoint_int8

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


