"""Checkpoint schema, byte-range loader and synthetic writer (TINY; FLASH schema only).

Round trips compare the bytes the writer streamed against what the loader returns and against
the ``safetensors`` library as an independent reader; byte-range reads are proven by counting
every byte read through the module's ``open``; every error names the key, file or field.
"""

import json
import math
import os
import shutil
import struct
import time

import pytest
import torch

import goldens.checkpoint.reader as ckreader
import goldens.checkpoint.schema as ckschema
import goldens.checkpoint.writer as ckwriter
from goldens.checkpoint import (CONFIG_FILE, DTYPES, INDEX_FILE, Checkpoint, CheckpointError,
                                checkpoint_schema, linear_format, write_synthetic_checkpoint)
from goldens.compressor import compressor_ratio1, index_key_from_latent
from goldens.config import FLASH, TINY, with_overrides
from goldens.mhc import hc_mixes
from goldens.moe import moe_block
from goldens.o_proj import grouped_output
from goldens.quant import dequantize_fp8_weight, from_checkpoint_int8
from goldens.router import route

SEED = 1234
SHARD = 1 << 20  # several shards at TINY (~9.9 MB of tensors)


def _nbytes(shape, dt):
    return math.prod(shape) * DTYPES[dt][1]



@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A TINY checkpoint and every data byte the writer streamed, per key."""
    root = tmp_path_factory.mktemp("tiny_ckpt")
    seen: dict[str, bytearray] = {}
    t0 = time.perf_counter()
    def collect(key, chunk):
        seen.setdefault(key, bytearray()).extend(chunk)

    index = write_synthetic_checkpoint(root, TINY, SEED, shard_bytes=SHARD, on_bytes=collect)
    elapsed = time.perf_counter() - t0
    return root, index, {k: bytes(v) for k, v in seen.items()}, elapsed


@pytest.fixture
def copy(written, tmp_path):
    """A private copy of the TINY checkpoint the test may damage."""
    dst = tmp_path / "ckpt"
    shutil.copytree(written[0], dst)
    return dst


def _shard_of(root, key):
    with open(os.path.join(root, INDEX_FILE)) as f:
        return os.path.join(root, json.load(f)["weight_map"][key])


def _rewrite_header(path, edit):
    """Re-serialize a shard's header after ``edit(header)``; the data bytes are kept."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def _edit_json(path, edit):
    with open(path) as f:
        data = json.load(f)
    edit(data)
    with open(path, "w") as f:
        json.dump(data, f)


# ---- schema -----------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [TINY, FLASH], ids=["tiny", "flash"])
def test_schema_follows_layer_config(cfg):
    s = checkpoint_schema(cfg)
    for lc in cfg.layers():
        p = f"layers.{lc.layer}.attn"
        has = lambda name: f"{p}.{name}" in s  # noqa: E731
        assert has("compressor.wkv.weight") == lc.is_kv_source
        assert has("compressor.norm.weight") == lc.is_kv_source
        assert has("compressor.wgate.weight") == (lc.is_kv_source and lc.ratio == 2)
        assert has("indexer.wq_b.weight") == lc.is_index_source
        assert has("indexer.wq_b.scale") == lc.is_index_source
        assert has("indexer.weights_proj.weight") == lc.is_index_source
        assert has("indexer.wk.weight") == lc.is_kv_source
        assert has("indexer.k_norm.weight") == lc.is_kv_source
        for name in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b"):
            assert s[f"{p}.{name}.weight"][1] == "F8_E4M3"
            assert s[f"{p}.{name}.scale"][1] == "F8_E8M0"
    count = lambda suffix: sum(k.endswith(suffix) for k in s)  # noqa: E731
    assert count("indexer.wq_b.weight") == len(cfg.index_source_layer_ids)
    assert count("indexer.wk.weight") == count("compressor.wkv.weight") \
        == len(cfg.kv_source_layer_ids)
    assert count(".w1.weight") == cfg.num_layers * (cfg.moe.n_routed_experts + 1)


def test_flash_schema_released_facts():
    s = checkpoint_schema(FLASH)
    # layer 20: ratio-1 KV source with wkv and norm but no wgate
    assert "layers.20.attn.compressor.wkv.weight" in s
    assert "layers.20.attn.compressor.norm.weight" in s
    assert "layers.20.attn.compressor.wgate.weight" not in s
    assert "layers.2.attn.compressor.wgate.weight" in s
    assert sorted(int(k.split(".")[1]) for k in s if k.endswith("indexer.wq_b.weight")) \
        == [2, 8, 14, 20, 24, 28, 32, 36]
    assert sorted(int(k.split(".")[1]) for k in s if k.endswith("indexer.wk.weight")) \
        == [2, 8, 14, 20]
    assert s["layers.0.hc_attn_fn"] == ((24, 20480), "F32")
    assert s["layers.0.hc_attn_scale"] == ((3,), "F32")
    assert s["layers.0.hc_ffn_base"] == ((24,), "F32")
    assert s["layers.0.attn.attn_sink"] == ((64,), "F32")
    assert s["layers.0.attn.wq_b.weight"] == ((64 * 512, 1280), "F8_E4M3")
    assert s["layers.0.attn.wo_a.weight"] == ((8 * 1024, 4096), "F8_E4M3")
    assert s["layers.0.attn.wo_a.scale"] == ((256, 128), "F8_E8M0")
    assert s["layers.0.attn.wo_b.weight"] == ((5120, 8192), "F8_E4M3")
    assert s["layers.36.attn.indexer.wq_b.weight"] == ((32 * 128, 1280), "F8_E4M3")
    assert s["layers.2.attn.indexer.wk.weight"] == ((128, 512), "BF16")
    assert s["layers.2.attn.indexer.weights_proj.weight"] == ((32, 5120), "BF16")
    assert s["layers.39.ffn.gate.bias"] == ((384,), "F32")
    assert s["layers.39.ffn.experts.383.w1.weight"] == ((2304, 2560), "I8")
    assert s["layers.39.ffn.experts.383.w1.scale"] == ((2304, 160), "F8_E8M0")
    assert s["layers.39.ffn.experts.383.w2.weight"] == ((5120, 1152), "I8")
    assert s["layers.39.ffn.shared_experts.w2.scale"] == ((160, 72), "F8_E8M0")
    assert s["embed.weight"] == ((129280, 5120), "BF16")
    # FP32-format keys: released BF16 storage by default, F32 on request
    assert s["head.weight"][1] == s["layers.0.ffn.gate.weight"][1] == "BF16"
    f32 = checkpoint_schema(FLASH, fp32_storage="F32")
    assert f32["head.weight"][1] == f32["layers.2.attn.compressor.wgate.weight"][1] == "F32"
    assert f32["layers.20.attn.compressor.wkv.weight"][1] == "BF16"  # ratio 1 stays bf16


def test_linear_format_rules():
    assert linear_format("head.weight", FLASH, "BF16") == "fp32"
    assert linear_format("layers.5.ffn.gate.weight", FLASH, "BF16") == "fp32"
    assert linear_format("layers.5.attn.wo_a.weight", FLASH, "F8_E4M3") == "bf16"
    assert linear_format("layers.2.attn.compressor.wkv", FLASH, "BF16") == "fp32"
    assert linear_format("layers.20.attn.compressor.wkv", FLASH, "BF16") == "bf16"
    assert linear_format("layers.5.attn.wq_b", FLASH, "F8_E4M3") == "mxfp8"
    assert linear_format("layers.5.ffn.experts.0.w1", FLASH, "I8") == "mxfp4"
    assert linear_format("layers.5.attn.attn_sink", FLASH, "F32") == "fp32"


# ---- round trip -------------------------------------------------------------------------------

def test_round_trip_byte_for_byte(written):
    root, index, seen, elapsed = written
    schema = checkpoint_schema(TINY)
    assert set(seen) == set(schema) == set(index["weight_map"])
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    t0 = time.perf_counter()
    ck = Checkpoint(root, TINY)
    ck.validate()
    for key, (shape, dt) in schema.items():
        t = ck.tensor(key)
        assert tuple(t.shape) == shape and t.dtype == DTYPES[dt][0], key
        assert t.contiguous().view(torch.uint8).numpy().tobytes() == seen[key], key
    load = time.perf_counter() - t0
    print(f"TINY write {elapsed:.2f}s, load all {len(schema)} tensors {load:.2f}s")


def test_independent_reader_agrees(written):
    """The ``safetensors`` library reads the same tensors from the shards."""
    from safetensors import safe_open
    root, index, seen, _ = written
    for name in sorted(set(index["weight_map"].values())):
        with safe_open(os.path.join(root, name), framework="pt") as f:
            keys = list(f.keys())
            assert keys
            for key in keys[:: max(1, len(keys) // 25)]:
                t = f.get_tensor(key)
                assert t.contiguous().view(torch.uint8).numpy().tobytes() == seen[key], key


def test_same_seed_identical_files_different_seed_differs(written, tmp_path):
    root = written[0]
    same, other = tmp_path / "same", tmp_path / "other"
    write_synthetic_checkpoint(same, TINY, SEED, shard_bytes=SHARD)
    write_synthetic_checkpoint(other, TINY, SEED + 1, shard_bytes=SHARD)
    names = sorted(os.listdir(root))
    assert names == sorted(os.listdir(same)) == sorted(os.listdir(other))
    shards = [n for n in names if n.endswith(".safetensors")]
    for n in names:
        assert (root / n).read_bytes() == (same / n).read_bytes(), n
    for n in shards:
        assert (root / n).read_bytes() != (other / n).read_bytes(), n
    a, b = Checkpoint(root, TINY), Checkpoint(other, TINY)
    for key in ("layers.0.attn.wq_a.weight", "layers.4.ffn.experts.3.w1.weight",
                "layers.6.attn.compressor.wkv.weight", "norm.weight"):
        assert not torch.equal(a.tensor(key).view(torch.uint8), b.tensor(key).view(torch.uint8))


# ---- byte-range reads -------------------------------------------------------------------------

class _Counter:
    """Wraps the module's ``open``: records (path, offset, bytes) of every shard read."""

    def __init__(self):
        self.reads: list[tuple[str, int, int]] = []

    def open(self, path, mode="r", *a, **kw):
        f = open(path, mode, *a, **kw)
        if "b" not in mode or not str(path).endswith(".safetensors"):
            return f
        counter = self

        class Wrapped:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def seek(self, off, whence=0):
                return f.seek(off, whence)

            def read(self, n=-1):
                pos = f.tell()
                b = f.read(n)
                counter.reads.append((os.path.basename(path), pos, len(b)))
                return b

            def readinto(self, buf):
                pos = f.tell()
                got = f.readinto(buf)
                counter.reads.append((os.path.basename(path), pos, got))
                return got

            def close(self):
                f.close()

        return Wrapped()

    def total(self):
        return sum(r[2] for r in self.reads)


def _header_len(path):
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def test_tensor_reads_only_its_byte_range(written, monkeypatch):
    root = written[0]
    counter = _Counter()
    monkeypatch.setattr(ckreader, "open", counter.open, raising=False)
    ck = Checkpoint(root, TINY)
    assert counter.reads == []  # construction reads JSON only, no shard
    key = "layers.5.ffn.experts.7.w2.weight"
    shard = _shard_of(root, key)
    info_shape, dt = checkpoint_schema(TINY)[key]
    want = _nbytes(info_shape, dt)
    hl = _header_len(shard)
    ck.tensor(key)
    assert counter.total() == hl + want == ck.bytes_read
    assert counter.total() < os.path.getsize(shard) // 10
    info = ck.info(key)
    assert counter.reads[-1] == (os.path.basename(shard), info.begin, want)
    # a second tensor of the same shard: header cached, exactly its bytes
    counter.reads.clear()
    key2 = "layers.5.ffn.experts.7.w2.scale"
    ck.tensor(key2)
    assert counter.reads == [(os.path.basename(shard), ck.info(key2).begin,
                              _nbytes(*checkpoint_schema(TINY)[key2]))]


def test_expert_loads_one_expert(written, monkeypatch):
    root = written[0]
    counter = _Counter()
    monkeypatch.setattr(ckreader, "open", counter.open, raising=False)
    ck = Checkpoint(root, TINY)
    schema = checkpoint_schema(TINY)
    layer, e = 7, 11
    ew = ck.expert(layer, e)
    keys = [f"layers.{layer}.ffn.experts.{e}.{w}.{s}" for w in ("w1", "w3", "w2")
            for s in ("weight", "scale")]
    shards = {_shard_of(root, k) for k in keys}
    headers = sum(_header_len(p) for p in shards)
    assert counter.total() == headers + sum(_nbytes(*schema[k]) for k in keys)
    i, d = TINY.moe.intermediate_size, TINY.hidden_size
    assert ew.w1.dtype == torch.uint8 and tuple(ew.w1.shape) == (i, d // 2)
    assert tuple(ew.w1_scale.shape) == (i, d // 32) and ew.w1_scale.dtype == torch.uint8
    assert tuple(ew.w2.shape) == (d, i // 2) and tuple(ew.w2_scale.shape) == (d, i // 32)
    assert torch.equal(ew.w1, from_checkpoint_int8(ck.tensor(keys[0])))


# ---- golden-ready helpers ---------------------------------------------------------------------

def test_helpers_feed_the_goldens(written):
    ck = Checkpoint(written[0], TINY)
    c = TINY
    gen = torch.Generator().manual_seed(3)
    t = 5
    x = torch.randn(t, c.hidden_size, generator=gen).to(torch.bfloat16)

    # wo_a: FP8 + 32x32 scales in the file, exact BF16 [groups, o_lora, o_group_in] on load
    wo_a = ck.wo_a(4)
    assert wo_a.dtype == torch.bfloat16
    assert tuple(wo_a.shape) == (c.o_groups, c.o_lora_rank, c.o_group_in)
    full = dequantize_fp8_weight(*ck.linear("layers.4.attn.wo_a"))
    assert torch.equal(wo_a.float().reshape(full.shape), full)
    o = torch.randn(t, c.num_heads, c.head_dim, generator=gen).to(torch.bfloat16)
    assert grouped_output(o, wo_a, c).shape == (t, c.o_groups * c.o_lora_rank)

    # compressors: ratio 2 FP32 input-major with gate, ratio 1 BF16 without
    w2 = ck.compressor_weights(2)
    assert w2.wkv.dtype == w2.wgate.dtype == torch.float32
    assert tuple(w2.wkv.shape) == (c.hidden_size, c.head_dim)
    assert torch.equal(w2.wkv.T, ck.dense("layers.2.attn.compressor.wkv"))
    w1 = ck.compressor_weights(6)
    assert w1.wgate is None and w1.wkv.dtype == torch.bfloat16
    latent = compressor_ratio1(c, x, w1.wkv, w1.norm)
    half = c.rope_dim // 2
    key = index_key_from_latent(c, latent, w1.index_wk, w1.index_norm,
                                torch.ones(t, half), torch.zeros(t, half))
    assert key.shape == (t, c.index.head_dim) and torch.isfinite(key.float()).all()
    with pytest.raises(CheckpointError, match="layer 3: owns no compressor .*layer 2"):
        ck.compressor_weights(3)
    with pytest.raises(CheckpointError, match="layer 9: carries no indexer .*layer 8"):
        ck.indexer_weights(9)
    iw = ck.indexer_weights(8)
    assert tuple(iw.weights_proj.shape) == (c.hidden_size, c.index.n_heads)
    assert tuple(iw.wq_b.shape) == (c.index.n_heads * c.index.head_dim, c.q_lora_rank)

    # mHC, router, experts (lazy, one at a time) through the goldens
    x_hc = torch.randn(t, c.hc.hc_mult, c.hidden_size, generator=gen)
    mixes = hc_mixes(x_hc, ck.hc_site(3, "ffn"), c)
    assert torch.isfinite(mixes.comb).all()
    r = ck.router(3)
    assert r.weight.dtype == torch.float32 and tuple(r.weight.shape) == (
        c.moe.n_routed_experts, c.hidden_size)
    assert float(r.bias.abs().max()) < 0.1
    idx, wt = route(x, r.weight, r.bias, c)
    loaded = []

    class Spy:
        def __getitem__(self, e):
            loaded.append(e)
            return ck.experts(3)[e]

    y = moe_block(x, idx, wt, Spy(), ck.shared_expert(3), c)
    assert y.shape == (t, c.hidden_size) and torch.isfinite(y.float()).all()
    assert set(loaded) <= set(idx.flatten().tolist())

    q = ck.qkv_weights(0)
    assert q.q_norm.dtype == torch.float32 and q.wq_b.dtype == torch.float8_e4m3fn
    assert ck.head().dtype == torch.float32 and ck.embed().dtype == torch.bfloat16
    assert ck.attn_sink(1).shape == (c.num_heads,)


def test_synthetic_value_scales(written):
    ck = Checkpoint(written[0], TINY)
    for key in ("norm.weight", "layers.3.attn_norm.weight", "layers.6.attn.kv_norm.weight"):
        v = ck.norm(key)
        assert abs(float(v.mean()) - 1.0) < 0.05 and 0.05 < float(v.std()) < 0.2
    for stem in ("layers.2.attn.wq_a", "layers.2.attn.wo_b", "layers.1.ffn.experts.0.w1",
                 "layers.1.ffn.shared_experts.w2", "head", "layers.2.attn.compressor.wgate"):
        w = ck.dense(stem)
        k = w.shape[1]
        assert abs(float(w.std()) * k ** 0.5 - 1.0) < 0.15, stem
    scale = ck.tensor("layers.0.hc_attn_scale")
    assert bool(((scale >= 0.5) & (scale <= 1.0)).all())


def test_overwrite_single_shard_and_fp32_storage(written, copy):
    """Rewriting with one shard and FP32 storage: refused without ``overwrite``; every
    tensor's bytes are independent of sharding; FP32-format keys become F32 with the BF16
    file's values as their BF16 rounding; helpers return FP32 either way."""
    seen = written[2]
    with pytest.raises(CheckpointError, match="already holds a checkpoint"):
        write_synthetic_checkpoint(copy, TINY, SEED)
    index = write_synthetic_checkpoint(copy, TINY, SEED, shard_bytes=1 << 30,
                                       fp32_storage="F32", overwrite=True)
    assert sorted(os.listdir(copy)) == sorted(
        [CONFIG_FILE, INDEX_FILE, "model-00001-of-00001.safetensors"])
    assert set(index["weight_map"].values()) == {"model-00001-of-00001.safetensors"}
    ck = Checkpoint(copy, TINY)
    ck.validate()
    f32_keys = {"head.weight", "layers.2.attn.compressor.wkv.weight",
                "layers.4.attn.compressor.wgate.weight", "layers.7.ffn.gate.weight"}
    for key in f32_keys:
        assert ck.info(key).dtype == "F32"
        as_bf16 = ck.tensor(key).to(torch.bfloat16)
        assert as_bf16.view(torch.uint8).numpy().tobytes() == seen[key], key
    assert ck.info("layers.6.attn.compressor.wkv.weight").dtype == "BF16"  # ratio 1
    for key in ("embed.weight", "layers.3.attn.wq_b.scale", "layers.9.ffn.experts.15.w2.weight",
                "layers.6.attn.compressor.wkv.weight", "layers.0.hc_ffn_fn"):
        assert ck.tensor(key).contiguous().view(torch.uint8).numpy().tobytes() == seen[key]
    assert ck.head().dtype == ck.router(0).weight.dtype == torch.float32
    assert ck.format("head") == "fp32" and ck.format("layers.2.attn.compressor.wkv") == "fp32"
    with pytest.raises(CheckpointError, match="fp32_storage"):
        checkpoint_schema(TINY, fp32_storage="F16")


# ---- errors -----------------------------------------------------------------------------------

def test_missing_key(copy):
    key = "layers.4.attn.indexer.wk.weight"
    _edit_json(copy / INDEX_FILE, lambda d: d["weight_map"].pop(key))
    ck = Checkpoint(copy, TINY)
    with pytest.raises(CheckpointError, match=f"{key}: missing from {INDEX_FILE}"):
        ck.tensor(key)
    with pytest.raises(CheckpointError, match=key):
        ck.validate()
    with pytest.raises(CheckpointError, match="layers.9.attn.indexer.wk.weight: missing .*not a "
                                              "schema key"):
        ck.tensor("layers.9.attn.indexer.wk.weight")


def test_key_missing_from_its_shard(copy):
    key = "layers.1.attn.attn_sink"
    _rewrite_header(_shard_of(copy, key), lambda h: h.pop(key))
    with pytest.raises(CheckpointError, match=f"{key}: missing from shard model-"):
        Checkpoint(copy, TINY).tensor(key)


def test_wrong_shape(copy):
    key = "layers.3.attn.wkv.weight"  # [64, 256] stored as [256, 64]: same byte count

    def edit(h):
        h[key]["shape"] = h[key]["shape"][::-1]

    _rewrite_header(_shard_of(copy, key), edit)
    ck = Checkpoint(copy, TINY)
    with pytest.raises(CheckpointError, match=rf"{key}: shape \[256, 64\] .*expects \[64, 256\]"):
        ck.tensor(key)
    ck.tensor("layers.3.attn.wkv.scale")  # other keys of the shard still load


def test_wrong_dtype(copy):
    key = "layers.2.attn.wq_b.weight"

    def edit(h):
        h[key]["dtype"] = "I8"

    _rewrite_header(_shard_of(copy, key), edit)
    with pytest.raises(CheckpointError, match=f"{key}: dtype I8 .*expects F8_E4M3"):
        Checkpoint(copy, TINY).tensor(key)


@pytest.mark.parametrize("field,value", [
    ("hidden_size", 512), ("num_hidden_layers", 12), ("num_attention_heads", 16),
    ("head_dim", 128), ("sliding_window", 16), ("kv_source_layer_ids", [2, 6]),
    ("index_source_layer_ids", [2, 4, 6])])
def test_config_field_mismatch(copy, field, value):
    want = ckschema._expected_text_fields(TINY)[field]

    def edit(d):
        d["text_config"][field] = value

    _edit_json(copy / CONFIG_FILE, edit)
    with pytest.raises(CheckpointError) as err:
        Checkpoint(copy, TINY)
    msg = str(err.value)
    assert f"text_config.{field}" in msg and repr(value) in msg and repr(want) in msg


def test_preset_mismatch_names_field(written):
    other = with_overrides(TINY, sliding_window=16)
    with pytest.raises(CheckpointError, match=r"text_config.sliding_window: file has 8, "
                                              r"preset tiny has 16"):
        Checkpoint(written[0], other)


@pytest.mark.parametrize("field,value,pattern", [
    ("quant_method", "bf16", r"quantization_config.quant_method: file has 'bf16'.*'fp8'"),
    ("weight_block_size", [128, 128],
     r"quantization_config.weight_block_size: file has \[128, 128\].*\[32, 32\]")])
def test_quantization_config_mismatch(copy, field, value, pattern):
    _edit_json(copy / CONFIG_FILE, lambda d: d["quantization_config"].__setitem__(field, value))
    with pytest.raises(CheckpointError, match=pattern):
        Checkpoint(copy, TINY)


def test_missing_files(copy):
    os.remove(copy / INDEX_FILE)
    with pytest.raises(CheckpointError, match=f"{INDEX_FILE}: not found"):
        Checkpoint(copy, TINY)
    os.remove(copy / CONFIG_FILE)
    with pytest.raises(CheckpointError, match=f"{CONFIG_FILE}: not found"):
        Checkpoint(copy, TINY)


def _corrupt_length(path):
    with open(path, "r+b") as f:
        f.write(struct.pack("<Q", os.path.getsize(path)))


def _corrupt_json(path):
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(b"\x00not json")


def _corrupt_huge(path):
    with open(path, "r+b") as f:
        f.write(struct.pack("<Q", 1 << 40))


def _corrupt_offsets(path):
    def edit(h):
        k = next(k for k in h if k != "__metadata__")
        h[k]["data_offsets"][1] += 1

    _rewrite_header(path, edit)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(4)


@pytest.mark.parametrize("damage,pattern", [
    (_corrupt_length, "{shard}: corrupt header: header length .* runs past the end"),
    (_corrupt_json, "{shard}: corrupt header: not UTF-8 JSON"),
    (_corrupt_huge, "{shard}: corrupt header: header length .* exceeds"),
    (_corrupt_offsets, "{key}: corrupt header entry in {shard}: data_offsets span"),
    (_truncate, "{shard}: corrupt header: file is 4 bytes")])
def test_corrupt_header(copy, damage, pattern):
    key = "layers.5.attn.attn_sink"
    path = _shard_of(copy, key)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        first = next(k for k in json.loads(f.read(n)) if k != "__metadata__")
    damage(path)
    ck = Checkpoint(copy, TINY)
    target = first if damage is _corrupt_offsets else key
    with pytest.raises(CheckpointError,
                       match=pattern.format(shard=os.path.basename(path), key=target)):
        ck.tensor(target)


def test_truncated_data(copy):
    key = "head.weight"
    path = _shard_of(copy, key)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)
    with pytest.raises(CheckpointError, match=f"{key}: corrupt header entry .*data_offsets"):
        Checkpoint(copy, TINY).tensor(key)


def test_expert_index_checked(written):
    ck = Checkpoint(written[0], TINY)
    with pytest.raises(CheckpointError, match="expert: 16 outside"):
        ck.expert(0, 16)
    with pytest.raises(ValueError, match="layer"):
        ck.expert(10, 0)


def test_extra_released_keys_are_readable(copy):
    """Keys outside the schema (Engram, DSpark, ...) are tolerated and read raw."""
    extra = torch.arange(8 * 4, dtype=torch.int16).reshape(8, 4).to(torch.bfloat16)
    name = "model-extra.safetensors"
    header = {"layers.1.engram.q_weight": {"dtype": "BF16", "shape": [8, 4],
                                           "data_offsets": [0, 64]}}
    with open(copy / name, "wb") as f:
        f.write(ckwriter._header_bytes(header) + extra.view(torch.uint8).numpy().tobytes())
    _edit_json(copy / INDEX_FILE,
               lambda d: d["weight_map"].__setitem__("layers.1.engram.q_weight", name))
    ck = Checkpoint(copy, TINY)
    ck.validate()
    assert torch.equal(ck.tensor("layers.1.engram.q_weight"), extra)
    assert ck.schema_entry("layers.1.engram.q_weight") is None


def test_chunked_generation_keeps_layout(monkeypatch):
    """Large tensors are generated in 32-row chunks (FLASH streaming); forcing tiny chunks
    still produces exactly the schema's bytes, with whole 32x32 FP8 blocks per chunk."""
    monkeypatch.setattr(ckwriter, "_CHUNK_ELEMS", 2048)
    schema = checkpoint_schema(TINY)
    out: dict[str, bytearray] = {}
    for group in (("layers.0.attn.wq_b.weight", "layers.0.attn.wq_b.scale"),
                  ("layers.0.ffn.experts.1.w2.weight", "layers.0.ffn.experts.1.w2.scale"),
                  ("head.weight",)):
        ckwriter._emit(group, schema, SEED, lambda k, b: out.setdefault(k, bytearray()).extend(b))
        for k in group:
            assert len(out[k]) == _nbytes(*schema[k]), k
    shape, _ = schema["layers.0.attn.wq_b.weight"]
    w = torch.frombuffer(out["layers.0.attn.wq_b.weight"], dtype=torch.float8_e4m3fn)
    sc = torch.frombuffer(out["layers.0.attn.wq_b.scale"], dtype=torch.uint8)
    sshape = schema["layers.0.attn.wq_b.scale"][0]
    deq = dequantize_fp8_weight(w.reshape(shape), sc.reshape(sshape))
    assert abs(float(deq.std()) * shape[1] ** 0.5 - 1.0) < 0.1
