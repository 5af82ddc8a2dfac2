"""The reference and the alternate path of the attention-mode entries (no v41 kernel yet).

* :func:`golden`: ``goldens.modes.attention_half_layer`` in the replicated wiring at the
  case's TP size, per DP group: the output ``out`` ``[dp, T, hidden]``, the Top-K rows the
  layer attended to ``topk`` ``[dp, T, topk]``, the indexer scores ``g{g}.index_scores``
  and every cache tensor after the call (``g{g}.cache.*``).
* :func:`alternate`: the same mode recomposed per TP rank from the golden building blocks
  (compressor, index query, paged indexer with a score budget of two rows per chunk, window
  publication, sparse attention with 3-query / 2-head chunks, output projection).  Every
  rank runs the replicated part on its own copy of the caches; the FP32 partials cross the
  host transports of ``harness.transport`` with one-based epochs, the whole half-layer
  repeated ``case.epochs`` times from the same inputs on retained windows.  ``replicated``:
  ``TpGroup.publish_reduce``/``all_reduce`` (every rank's output returned as ``out_ranks``
  for the byte-identity check); ``sharded``: each rank's input slab through
  ``publish_gather``/``all_gather``, partials through ``reduce_scatter``, slabs
  reassembled (``out_slab_tail``: the slab rows past ``T``, which must be zero).
* :func:`output_reference`: the output reference for a Top-K selection other than the
  nominal one and for accepted Q-A latents (:mod:`harness.entries.qr_rounding`), from the
  reference caches and the original weights.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from goldens.compressor import compress_and_publish
from goldens.config import Mode, V41Config, rank_slab
from goldens.indexer import index_query, paged_indexer, score_row_bytes
from goldens.modes import attention_half_layer
from goldens.o_proj import o_proj_partial
from goldens.qkv import kv_proj_rope, q_lora, q_proj_rope
from goldens.rope import materialize_rope_rows
from goldens.sparse_attention import concat_kv_parts, gather_compressed_kv, sparse_attention
from goldens.tp import (AttentionBatch, attention_keys, attention_rank_partial, decode_attention,
                        replicated_wiring)
from goldens.window_cache import gather_window_kv, publish_window_kv
from harness.entries.attention_fixture import (batch_from, caches_flat, caches_from, num_state_blocks,
                                               rope_from, weights_from)
from harness.registry import SutOutput
from harness.transport import TpGroup

_FULL = (Mode.C2A_FULL, Mode.C1A_FULL)
_INDEXED = (Mode.C2A_FULL, Mode.C1A_FULL, Mode.C1A_REINDEX)


@contextmanager
def small_shape_threads(config: V41Config):
    """One torch intra-op thread for TINY-sized tensors (extra threads only add scheduling
    cost there, up to 20x on a loaded 2-core runner); FLASH shapes keep the default."""
    if config.hidden_size > 1024:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def group_state(config: V41Config, case, inputs: dict, g: int, layer: int):
    """Fresh ``(weights, rope, batch, caches, x)`` of DP group ``g`` from the flat inputs."""
    batch = batch_from(config, case, inputs, g, num_state_blocks(inputs, g))
    return (weights_from(config, layer, inputs), rope_from(inputs), batch,
            caches_from(config, inputs, g, case.tokens), inputs[f"g{g}.x"].clone())


def golden(config: V41Config, case, inputs: dict, layer: int) -> dict:
    mode = config.layer_config(layer).mode
    out, topk, result = [], [], {}
    for g in range(case.dp):
        w, rope, batch, caches, x = group_state(config, case, inputs, g, layer)
        y, caches, aux = attention_half_layer(config, layer, x, w, caches, batch, rope, tp=case.tp,
                                              wiring="replicated", active=case.group_active(g))
        out.append(y)
        if aux.topk_rows is not None:
            topk.append(aux.topk_rows)
        if aux.index_scores is not None:
            result[f"g{g}.index_scores"] = aux.index_scores
        result.update(caches_flat(config, caches, g))
    result["out"] = torch.stack(out)
    if mode is not Mode.SWA:
        result["topk"] = torch.stack(topk)
    return result


def _rope_rows(config, lc, batch, rope, active):
    cos_t, sin_t = rope.profile(lc)
    half = config.rope_dim // 2
    rc, rs = torch.ones(batch.tokens, half), torch.zeros(batch.tokens, half)
    materialize_rope_rows(cos_t, sin_t, batch.metadata.position_ids, active, rc, rs)
    return rc, rs


def rank_partial(config: V41Config, layer: int, x, w, caches, batch, rope, tp: int, rank: int,
                 active: int):
    """One rank's FP32 ``[T, hidden]`` partial and its Top-K rows; ``caches`` is this
    rank's replica (updated in place: window, publication, state, scratch)."""
    lc = config.layer_config(layer)
    md = batch.metadata
    rc, rs = _rope_rows(config, lc, batch, rope, active)
    parts, topk = [], None
    if lc.mode is not Mode.SWA:
        src, scratch = lc.kv_source, caches.scratch
        sc = caches.sources[src]
        if lc.mode in _FULL:
            compress_and_publish(config, lc.ratio, x, w.compressor, query_start_loc=md.query_start_loc,
                                 position_ids=md.position_ids, token_to_req_indices=md.token_to_req_indices,
                                 num_tokens=active, compressed_slots=md.compressed_slots[src],
                                 freqs_cos=rope.compressed_cos, freqs_sin=rope.compressed_sin, caches=sc,
                                 state_block_table=md.state_block_tables.get(src),
                                 state_cache=caches.states.get(src))
        if lc.mode in _INDEXED:
            table = batch.compressed_block_tables[src]
            iq = index_query(config, q_lora(x, w.attn.qkv, config), w.indexer.wq_b, w.indexer.wq_b_scale, x,
                             w.indexer.weights_proj, md.position_ids, active, rope.compressed_cos,
                             rope.compressed_sin)
            cand = scratch.candidate_mask[lc.candidate_source] if lc.mode is Mode.C1A_REINDEX else None
            budget = 2 * score_row_bytes(config, int(table.shape[1]) * config.cache.block_size)
            res = paged_indexer(config, iq.q, iq.weights, sc.index_key, sc.index_key_scale, table,
                                md.token_to_req_indices, md.compressed_lens[src], active, candidate_mask=cand,
                                select_candidates=lc.is_candidate_source, max_logits_bytes=budget)
            scratch.topk_rows[layer].copy_(res.topk_rows)
            if lc.is_candidate_source:
                scratch.candidate_mask[layer].copy_(res.candidate_mask)
            scratch.published.add(layer)
            topk = res.topk_rows.clone()
        else:
            topk = scratch.topk_rows[lc.index_source].clone()
        topk[active:] = -1
        parts.append(gather_compressed_kv(sc.compressed_kv, sc.compressed_kv_scale, topk))
    wc = caches.windows[layer]
    publish_window_kv(wc.payload, wc.scales, kv_proj_rope(x, w.attn.qkv, rc, rs, config), md.window_slots)
    keys, valid = concat_kv_parts(gather_window_kv(wc.payload, wc.scales, md.window_indices), *parts)
    wl = w.attn.shard(config, tp, rank)
    q = q_proj_rope(q_lora(x, wl.qkv, config), wl.qkv.wq_b, wl.qkv.wq_b_scale, rc, rs, config)
    o = sparse_attention(q, keys, valid, wl.attn_sink, query_chunk=3, head_chunk=2)
    return o_proj_partial(o, rc, rs, wl.o, config), topk


def _group_alternate(config, case, inputs, g: int, layer: int, partial_fn=None, site=None) -> dict:
    """Group ``g`` through ``partial_fn(config, layer, x, w, caches, batch, rope, tp, rank,
    active, epoch)`` per rank (default: the golden pieces, :func:`rank_partial`) and the host
    transports of the case's wiring, ``case.epochs`` times.

    ``partial_fn`` may return a third item, a dict of what the rank's launches returned
    besides the partial: its ``"qr"`` (the Q-A latent of the active rows) comes back as
    ``qr_ranks`` ``[tp, T, q_lora]`` (last epoch) for :mod:`harness.entries.qr_rounding`.

    ``site`` (an mHC composition around the leaf) supplies each rank's normalized input,
    ``site.prepare(rank, epoch)``: ``[T, D]`` replicated, the rank's capacity slab
    ``[width, D]`` sharded; and takes each rank's output, ``site.finish(rank, epoch, y)``
    (the all-reduced ``[T, D]`` / the reduce-scattered slab).  Without it every rank's input
    is ``g{g}.x``."""
    T, tp, active, hidden = case.tokens, case.tp, case.group_active(g), config.hidden_size
    if partial_fn is None:
        def partial_fn(config, layer, x, w, caches, batch, rope, tp, rank, active, epoch):
            return rank_partial(config, layer, x, w, caches, batch, rope, tp, rank, active)
    group = TpGroup(tp, T, hidden)
    sharded = case.wiring == "sharded"
    for epoch in range(1, case.epochs + 1):
        states = [group_state(config, case, inputs, g, layer) for _ in range(tp)]
        xs = [site.prepare(r, epoch) if site else None for r in range(tp)]
        if sharded:  # each rank holds only its slab of the normalized input
            for r, (_, _, _, _, x) in enumerate(states):
                first, count = rank_slab(active, tp, r, T)
                slab = torch.zeros(group.width, hidden, dtype=torch.bfloat16)
                slab[:count] = xs[r][:count] if site else x[first:first + count]
                group.publish_gather(r, epoch, slab)
            gathered = [group.all_gather(epoch, active) for _ in range(tp)]
        topks, latents = [], []
        for r, (w, rope, batch, caches, x) in enumerate(states):
            x_in = gathered[r] if sharded else (xs[r] if site else x)
            partial, topk, *seen = partial_fn(config, layer, x_in, w, caches, batch, rope, tp, r, active, epoch)
            topks.append(topk)
            latents.append(seen[0].get("qr") if seen else None)
            (group.publish_partial if sharded else group.publish_reduce)(r, epoch, partial)
        if sharded:
            per_rank = [group.reduce_scatter(r, epoch, active) for r in range(tp)]
            slabs = torch.cat(per_rank)
            ranks = [slabs[:T]]
        else:
            ranks = [group.all_reduce(epoch, T) for _ in range(tp)]
            for out in ranks:
                out[active:] = 0  # padding rows are zero (zero_bf16_padding)
            per_rank = ranks
        if site:
            for r in range(tp):
                site.finish(r, epoch, per_rank[r])
    result = {"out": ranks[0], **caches_flat(config, states[0][3], g)}
    if sharded:
        result["out_slab_tail"] = slabs[T:]
    else:
        result["out_ranks"] = torch.stack(ranks)
    if topks[0] is not None:
        result["topk"] = topks[0]
        result["topk_ranks"] = torch.stack(topks)
    if all(q is not None for q in latents):  # the last epoch's Q-A latents, rows past active zero
        qr = torch.zeros(tp, T, latents[0].shape[-1], dtype=latents[0].dtype)
        for r, q in enumerate(latents):
            qr[r, :q.shape[0]] = q
        result["qr_ranks"] = qr
    return result


def alternate(layer: int, partial_fn=None, records=None):
    """The SUT function of the entry for ``layer`` (see the module doc); ``partial_fn``
    replaces the per-rank golden pieces (the kernel path), whose cost ``records()`` are
    returned with the outputs."""
    def run(platform, config, case, inputs) -> SutOutput:
        groups = [_group_alternate(config, case, inputs, g, layer, partial_fn) for g in range(case.dp)]
        out = inputs["out"]  # the sentinel-filled buffer: every row is written
        for g, res in enumerate(groups):
            out[g] = res.pop("out")
        stacked = {k: torch.stack([res.pop(k) for res in groups])
                   for k in ("out_ranks", "out_slab_tail", "topk", "topk_ranks", "qr_ranks") if k in groups[0]}
        result = {"out": out, **stacked}
        for res in groups:
            result.update(res)
        return SutOutput(result, records() if records else [])
    return run


def output_reference(config: V41Config, case, inputs: dict, gold: dict, g: int, layer: int,
                     topk: torch.Tensor | None = None, qr: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Output reference of group ``g`` for an accepted Top-K selection ``topk`` (None: the
    golden's rows) and accepted per-rank Q-A latents ``qr`` (``[T, q_lora]`` per TP rank;
    None: ``q_lora`` of the input): the reference caches after the call (``gold``), the
    original weights and inputs, the replicated wiring at the case's TP size (rank-order
    FP32 sum, one BF16 cast)."""
    lc = config.layer_config(layer)
    w, rope, batch, _, x = group_state(config, case, inputs, g, layer)
    ref = caches_from(config, gold, g, case.tokens)
    n = case.group_active(g)
    rc, rs = _rope_rows(config, lc, batch, rope, n)
    compressed = None
    if lc.mode is not Mode.SWA:
        rows = (gold["topk"][g] if topk is None else topk).clone()
        rows[n:] = -1
        sc = ref.sources[lc.kv_source]
        compressed = gather_compressed_kv(sc.compressed_kv, sc.compressed_kv_scale, rows)
    wc = ref.windows[layer]
    md = batch.metadata
    ab = AttentionBatch(rc, rs, md.window_slots, md.window_indices, wc.payload, wc.scales, compressed)
    if qr is None:
        return decode_attention(x, w.attn, ab, config, case.tp, "replicated", n)
    keys, valid = attention_keys(x, w.attn, ab, config)
    return replicated_wiring(x, lambda xg, r: attention_rank_partial(xg, keys, valid, w.attn.shard(config, case.tp, r),
                                                                     ab, config, qr[r]), case.tp, n)
