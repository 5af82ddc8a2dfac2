"""Checkpoint schema: every key's (shape, safetensors dtype) from a config, the
``linear_format`` rules, the config.json a preset implies, and :class:`CheckpointError`.
See :mod:`goldens.checkpoint` for the layout and the storage decisions."""

from __future__ import annotations

import re

import torch

from goldens.config import MX_GROUP, V41Config

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


