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

from goldens.checkpoint.schema import (  # noqa: F401
    CHECKED_FIELDS,
    CONFIG_FILE,
    CheckpointError,
    DTYPES,
    INDEX_FILE,
    MAX_HEADER_BYTES,
    checkpoint_schema,
    config_json,
    linear_format,
)
from goldens.checkpoint.reader import (  # noqa: F401
    Checkpoint,
    ExpertLoader,
    IndexerWeights,
    RouterWeights,
    TensorInfo,
)
from goldens.checkpoint.writer import (  # noqa: F401
    default_shard_bytes,
    write_synthetic_checkpoint,
)
