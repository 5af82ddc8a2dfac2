"""The v41 kernel path of one TP rank's attention half-layer (the ``decode_attn_<mode>``
leaves): the mode's building-block kernels launched one after another on the rank.

Per rank, on the active prefix of the batch only (``tokens = active``; the host collective
writes the padding rows as zeros, and ``active = 0`` launches nothing):

=============================  ============================================================
launch                         what it computes / publishes
=============================  ============================================================
``v41.rope_rows``              the layer profile's rope rows at ``position_ids``
``v41.compressor_ratio{1,2}``  Full only: compressed KV + index keys (MXFP4), ratio-2 ring
``v41.qkv_proj_rope``          ``q`` of the rank's heads, ``kv``, ``qr``
``v41.rope_rows``              Full/Reindex: the compressed profile's rows (index query)
``v41.index_query``            Full/Reindex: index q and head weights from ``qr`` and ``x``
``v41.paged_indexer``          Full/Reindex: Top-K physical rows (Reindex: inside the mask)
``v41.hierarchical_indexer``   the candidate source only: candidate mask from the scores
``v41.window_publish``         the token's KV row into the MXFP8 window cache
``v41.sparse_attention``       window rows + compressed Top-K rows, the rank's heads
``v41.o_proj``                 the rank's FP32 partial
=============================  ============================================================

The host does metadata only: it slices the active prefix, pads the row-id lists with -1 to
the kernel's key tile, carries one kernel's output to the next launch, and copies the inout
caches a launch returns back into the rank's cache replica.  Every launch's inputs that
carry caller metadata (slots, row ids, tables, positions) are validated by the building
block's own host check in a dry pass BEFORE the first launch, so bad input writes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import torch

from goldens.config import Mode, V41Config, local_heads
from goldens.qkv import local_wq_b
from harness.entries import (compressor_ratio1, compressor_ratio2, index_query, o_proj, paged_indexer,
                             qkv_proj_rope, rope_rows)
from harness.entries import hierarchical_sparse_indexer as hierarchical
from harness.entries import sparse_attention as sparse
from harness.entries import window_publish
from harness import launch_record
from harness.entries._kernel import launch_step, sequential_cost
from harness.fixtures import SENTINEL
from harness.registry import Work

_FULL = (Mode.C2A_FULL, Mode.C1A_FULL)
_INDEXED = (Mode.C2A_FULL, Mode.C1A_FULL, Mode.C1A_REINDEX)
_I32 = torch.int32
ROW_SENTINEL = -13  # unwritten int outputs


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _pad_cols(ids: torch.Tensor, width: int) -> torch.Tensor:
    """INT32 row ids padded with -1 columns to ``width`` (the kernel's key tile)."""
    out = torch.full((ids.shape[0], width), -1, dtype=_I32)
    out[:, :ids.shape[1]] = ids.to(_I32)
    return out


@dataclasses.dataclass
class RankLauncher:
    """Launches v41 modules for one rank and keeps their cost records.  ``dry=True``
    launches nothing: it runs the host validator given for the step on its arguments and
    returns zero outputs of the ABI's shapes (the validation pass)."""

    platform: object
    config: V41Config
    rank: int
    preset: str
    dry: bool = False
    records: list = dataclasses.field(default_factory=list)
    memo: "LaunchMemo | None" = None  # a5sim launch reuse (see :func:`launch_key`)
    trace: list | None = None  # dry: (module, axes, args and outputs) of every launch
    launched: int = 0  # kernels interpreted / run on this rank
    observed: dict = dataclasses.field(default_factory=dict)  # kernel outputs the comparison reads ("qr")
    reused: int = 0  # launches answered by the memo (an identical earlier launch's outputs)

    def __call__(self, module: str, axes: dict, args: dict, *, validate=None,
                 options: dict | None = None) -> dict:
        axes = {"preset": self.preset, **axes}
        if self.dry:
            if validate is not None:
                validate(args)
            outs = _abi_outputs(self.config, module, axes, args, sentinel=False)
            if self.trace is not None:
                self.trace.append((module, axes, {**args, **outs}))
            return outs
        key = None if self.memo is None else launch_key(module, axes, options, args,
                                                         data=not self.memo.by_shape)
        if key is not None and (hit := self.memo.get(key)) is not None:
            outputs, record = hit
            self.reused += 1
            if record:  # the earlier launch's cost, booked to this rank
                self.records.append({**record, "rank": self.rank})
            if outputs is None:  # a shape-keyed estimate: nothing was computed to hand back
                return _abi_outputs(self.config, module, axes, args, sentinel=True)
            launch_record.record(module, self.rank, axes, args, outputs)
            return {k: v.clone() for k, v in outputs.items()}
        from harness.platforms import KernelSpec
        program = self.platform.compile(KernelSpec(module, options or {}), self.config, axes)
        tensors = {}
        for a in program.args:
            if a.name in args:
                tensors[a.name] = args[a.name]
            else:  # an output the caller does not keep: filled so unwritten bytes show
                fill = SENTINEL if a.torch_dtype.is_floating_point else ROW_SENTINEL
                tensors[a.name] = torch.full(a.shape, fill, dtype=a.torch_dtype)
        result = self.platform.launch(program, self.rank, tensors)
        self.launched += 1
        result.raise_for_error()
        record = result.cost_record()
        if record:
            record["module"] = module
            self.records.append(record)
        if key is not None:
            kept = None if self.memo.by_shape else {k: v.clone() for k, v in result.outputs.items()}
            self.memo.put(key, (kept, record))
        launch_record.record(module, self.rank, axes, args, result.outputs)
        return dict(result.outputs)

    def rows(self, module: str, axes: dict, n: int, chunk: int, row_args: dict, args: dict, *,
             num_tokens: bool = False) -> dict:
        """``module`` over ``n`` row-independent tokens in launches of at most ``chunk``
        rows on a5sim's interpreter (its memory; one launch elsewhere, and on an
        estimate-only platform, which interprets nothing): ``row_args`` are sliced per
        launch, ``args`` shared, ``num_tokens`` (if the ABI has it) the launch's rows.
        Returns every output concatenated over the rows."""
        step = launch_step(self.platform, n, chunk)
        parts = []
        for t0 in range(0, n, step):
            m = min(step, n - t0)
            call = {**args, **{k: v[t0:t0 + m].contiguous() for k, v in row_args.items()}}
            if num_tokens:
                call["num_tokens"] = torch.tensor([m], dtype=_I32)
            parts.append(self(module, {**axes, "tokens": m}, call))
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def cost(self) -> list:
        return [sequential_cost(self.records)] if self.records else []


def _abi_outputs(config, module: str, axes: dict, args: dict, *, sentinel: bool) -> dict:
    """Outputs of a launch that computes nothing, in ``module``'s ABI shapes: its inout
    arguments unchanged, its outputs zero (the dry validation pass) or, with ``sentinel``,
    the sentinels (a shape-keyed estimate: nothing computed, and nothing may look so)."""
    import importlib
    outs = {}
    for a in importlib.import_module(module).abi(config, axes):
        dtype = getattr(torch, a.dtype)
        if a.role == "inout":
            outs[a.name] = args[a.name]
        elif a.role == "out" and not sentinel:
            outs[a.name] = torch.zeros(a.shape, dtype=dtype)
        elif a.role == "out":
            outs[a.name] = torch.full(a.shape, SENTINEL if dtype.is_floating_point else ROW_SENTINEL,
                                      dtype=dtype)
    return outs


_METADATA_DTYPES = (torch.int16, torch.int32, torch.int64, torch.bool)


def launch_key(module: str, axes: dict, options: dict | None, args: dict, *,
               data: bool = True) -> tuple:
    """The identity of a launch: module, options, axes and every input byte.  ``data=False``
    (estimate-only launches) keeps the names, dtypes and shapes of every input but the bytes
    of the integer metadata only (counts, positions, slots, row ids: INT16/32/64 and bool):
    the cost model follows valid counts held in tensors, not activation, weight or cache
    payloads (float and uint8 codes) -- ``tests/platforms/test_a5sim_estimate_only.py``.  The a5sim
    interpreter is deterministic, so a launch equal to an earlier one of the same case (the
    replicated pieces every TP rank runs on its own replica, an epoch repeating the same
    inputs, a rerun of the same case) returns the earlier outputs and cost record instead of
    being interpreted again; launches that differ per rank (its heads' q, attention and
    o_proj) always run."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(args):
        t = args[name].contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        if t.numel() and (data or t.dtype in _METADATA_DTYPES):
            h.update(t.view(torch.uint8).numpy().tobytes())
    return module, repr(sorted((options or {}).items())), repr(sorted(axes.items())), h.hexdigest()


class LaunchMemo:
    """Outputs of earlier a5sim launches by :func:`launch_key`, least recently used first
    out, at most ``budget`` bytes of outputs (process-wide: one per worker process)."""

    def __init__(self, budget: int = 512 << 20, *, by_shape: bool = False):
        self.budget, self.used, self.items = budget, 0, {}
        self.by_shape = by_shape  # keys without payload bytes; only cost records are kept

    def get(self, key):
        hit = self.items.pop(key, None)
        if hit is not None:
            self.items[key] = hit  # most recent last
        return hit

    def put(self, key, value) -> None:
        size = sum(t.numel() * t.element_size() for t in (value[0] or {}).values())
        if size > self.budget // 4:
            return
        while self.items and self.used + size > self.budget:
            old = self.items.pop(next(iter(self.items)))
            self.used -= sum(t.numel() * t.element_size() for t in (old[0] or {}).values())
        self.items[key] = value
        self.used += size


MEMO = LaunchMemo()  # launches verified at the default level (tensor)
MEMOS: dict = {}  # (verify level, cost model) -> memo, for the others (:func:`launch_memo`)
ESTIMATE_MEMO = LaunchMemo(by_shape=True)  # cost-only launches: records by shape, no outputs


def _rope(launch: RankLauncher, cos_t, sin_t, pos, n: int):
    half = cos_t.shape[1]
    args = {"freqs_cos": cos_t, "freqs_sin": sin_t, "position_ids": pos.to(_I32).contiguous(),
            "num_tokens": torch.tensor([n], dtype=_I32),
            "rope_cos": torch.ones(n, half), "rope_sin": torch.zeros(n, half)}
    out = launch("v41.rope_rows", {"tokens": n, "capacity": cos_t.shape[0]}, args,
                 validate=rope_rows.validate_launch)
    return out["rope_cos"], out["rope_sin"]


def _compress(launch: RankLauncher, config, lc, x, w, md, rope, sc, state, n: int):
    """Full: the compressor of the layer's ratio publishes into the source caches ``sc``
    (and the ratio-2 ring ``state``) in place."""
    src = lc.kv_source
    caches = {"compressed_kv": sc.compressed_kv, "compressed_kv_scale": _u8(sc.compressed_kv_scale),
              "index_key": sc.index_key, "index_key_scale": sc.index_key_scale}
    args = {"x": x, "wkv": w.wkv, "norm": w.norm, "index_wk": w.index_wk, "index_norm": w.index_norm,
            "freqs_cos": rope.compressed_cos, "freqs_sin": rope.compressed_sin,
            "query_start_loc": md.query_start_loc.to(_I32), "position_ids": md.position_ids[:n].to(_I32),
            "token_to_req_indices": md.token_to_req_indices[:n].to(_I32),
            "compressed_slots": md.compressed_slots[src][:n].to(_I32),
            "num_tokens": torch.tensor([n], dtype=_I32),
            **{k: v.clone() for k, v in caches.items()}}
    axes = {"tokens": n, "blocks": sc.compressed_kv.shape[0], "capacity": rope.compressed_cos.shape[0]}
    if lc.ratio == 2:
        table = md.state_block_tables[src]
        args.update(wgate=w.wgate, state_block_table=table.to(_I32), state_cache=state.clone(),
                    workspace=torch.zeros(n + table.shape[0], config.state_width))
        axes.update(requests=table.shape[0], state_blocks=state.shape[0])
        out = launch("v41.compressor_ratio2", axes, args,
                     validate=lambda a: compressor_ratio2.validate_launch(config, a))
        state.copy_(out["state_cache"])
    else:
        out = launch("v41.compressor_ratio1", axes, args,
                     validate=lambda a: compressor_ratio1.validate_launch(config, a))
    for k, v in caches.items():
        v.copy_(out[k])


def _select(launch: RankLauncher, config, layer, lc, x, qr, w, md, batch, rope, caches, n: int):
    """Full/Reindex: index query, paged indexer over the source's index keys (score-budget
    chunks), the candidate mask at the candidate source; publishes the layer's Top-K rows
    (and mask) into the scratch.  Returns the Top-K rows ``[n, topk]``."""
    src, scratch = lc.kv_source, caches.scratch
    sc, table = caches.sources[src], batch.compressed_block_tables[src]
    ix, bs = config.index, config.cache.block_size
    ccos, csin = _rope(launch, rope.compressed_cos, rope.compressed_sin, md.position_ids[:n], n)
    iq = launch.rows("v41.index_query", {}, n, index_query.A5SIM_CHUNK,
                     {"qr": qr, "rope_cos": ccos, "rope_sin": csin, "x": x},
                     {"wq_b": _u8(w.wq_b), "wq_b_scale": w.wq_b_scale, "weights_proj": w.weights_proj},
                     num_tokens=True)
    width = table.shape[1] * bs
    # the kernel scores whole key tiles: the table is padded with unallocated (-1) pages
    from v41.paged_indexer import KEY_TILE
    padded_width = width if width <= KEY_TILE else -(-width // KEY_TILE) * KEY_TILE
    if padded_width != width:
        wide = torch.full((table.shape[0], padded_width // bs), -1, dtype=_I32)
        wide[:, :table.shape[1]] = table
        table = wide
    mask = None
    if lc.mode is Mode.C1A_REINDEX:
        mask = torch.zeros(n, padded_width, dtype=torch.uint8)
        mask[:, :width] = scratch.candidate_mask[lc.candidate_source][:n]
    step = min(launch_step(launch.platform, n, paged_indexer.LAUNCH_ROWS),
               paged_indexer.logits_chunk_rows(config, width, paged_indexer.DEFAULT_MAX_LOGITS_BYTES))
    q = iq["q"].reshape(n, ix.n_heads, ix.head_dim)
    topk = torch.full((n, ix.topk), -1, dtype=_I32)
    scores = torch.empty(n, max(padded_width, ix.topk))
    for t0 in range(0, n, step):
        m = min(step, n - t0)
        args = {"q": q[t0:t0 + m].contiguous(), "weights": iq["weights"][t0:t0 + m].contiguous(),
                "index_key": sc.index_key, "index_key_scale": sc.index_key_scale,
                "index_block_table": table.to(_I32),
                "token_to_req": md.token_to_req_indices[t0:t0 + m].to(_I32),
                "compressed_lens": md.compressed_lens[src][t0:t0 + m].to(_I32)}
        if mask is not None:
            args["candidate_mask"] = mask[t0:t0 + m].contiguous()
        axes = {"tokens": m, "pages": table.shape[1], "requests": table.shape[0],
                "blocks": sc.index_key.shape[0], "candidates": mask is not None}
        out = launch("v41.paged_indexer", axes, args,
                     validate=lambda a: paged_indexer.validate_launch(config, a))
        topk[t0:t0 + m] = out["topk_rows"]
        scores[t0:t0 + m] = out["scores"]
    scratch.topk_rows[layer][:n] = topk
    if lc.is_candidate_source:
        # block maxima reduce over whole 32-byte tiles: the score rows are padded with
        # masked (-inf) positions to 8 blocks, which are never kept
        cbs = ix.candidate_block_size
        padded = -(-width // (8 * cbs)) * 8 * cbs
        rows = torch.full((n, padded), float("-inf"))
        rows[:, :width] = scores[:, :width]
        args = {"scores": rows, "compressed_lens": md.compressed_lens[src][:n].to(_I32)}
        out = launch("v41.hierarchical_indexer", {"tokens": n, "width": padded}, args,
                     validate=lambda a: hierarchical.validate_launch(config, a))
        scratch.candidate_mask[layer][:n] = out["candidate_mask"][:, :width].to(scratch.candidate_mask[layer].dtype)
    scratch.published.add(layer)
    return topk


def _attend(launch: RankLauncher, config, tp, q, window, md, compressed, topk, sink, n: int):
    """Sparse attention of the rank's heads over the window rows and (if ``topk``) the
    compressed Top-K rows; ``[n, heads, head_dim]`` BF16."""
    from v41.sparse_attention import default_keys
    wk, ck = default_keys(config)
    bs, d = config.cache.block_size, config.head_dim
    if topk is None:  # SWA: one empty compressed block, every compressed id -1
        ccache = torch.zeros(1, bs, 1, d // 2, dtype=torch.uint8)
        cscale = torch.zeros(1, bs, 1, d // config.cache.compressed_group, dtype=torch.uint8)
        cids = torch.full((n, ck), -1, dtype=_I32)
    else:
        ccache, cscale = compressed.compressed_kv, _u8(compressed.compressed_kv_scale)
        cids = _pad_cols(topk, ck)
    args = {"q": q, "window_kv": _u8(window.payload), "window_kv_scale": _u8(window.scales),
            "indices": _pad_cols(md.window_indices[:n], wk), "compressed_kv": ccache,
            "compressed_kv_scale": cscale, "compressed_indices": cids, "attn_sink": sink}
    step = sparse.chunk_tokens(args, launch.platform)
    out = torch.empty(n, local_heads(config, tp), d, dtype=torch.bfloat16)
    axes = {"tp": tp, "keys": wk, "ckeys": ck, "blocks": window.payload.shape[0],
            "cblocks": ccache.shape[0], "window_only": topk is None}
    for t0 in range(0, n, step):
        m = min(step, n - t0)
        part = {**args, "q": q[t0:t0 + m].contiguous(), "indices": args["indices"][t0:t0 + m],
                "compressed_indices": cids[t0:t0 + m]}
        out[t0:t0 + m] = launch("v41.sparse_attention", {**axes, "tokens": m}, part,
                                validate=sparse.validate_launch)["out"]
    return out


def rank_partial(launch: RankLauncher, config: V41Config, layer: int, x, w, caches, batch, rope,
                 tp: int, rank: int, active: int):
    """One rank's FP32 ``[T, hidden]`` partial (rows >= ``active`` zero) and its Top-K rows
    ``[T, topk]`` (-1 past ``active``; None for SWA) through the v41 kernels; ``caches`` is
    the rank's replica, updated in place with what the kernels publish."""
    lc, md, T = config.layer_config(layer), batch.metadata, x.shape[0]
    n, hd = active, config.head_dim
    partial = torch.zeros(T, config.hidden_size)
    topk_full = None if lc.mode is Mode.SWA else torch.full((T, config.index.topk), -1, dtype=_I32)
    if n == 0:
        launch.observed["qr"] = torch.zeros(0, config.q_lora_rank, dtype=torch.bfloat16)
        return partial, topk_full
    xa = x[:n].contiguous()
    cos_t, sin_t = rope.profile(lc)
    rc, rs = _rope(launch, cos_t, sin_t, md.position_ids[:n], n)
    if lc.mode in _FULL:
        _compress(launch, config, lc, xa, w.compressor, md, rope, caches.sources[lc.kv_source],
                  caches.states.get(lc.kv_source), n)
    qkv, wl = w.attn.qkv, w.attn.shard(config, tp, rank)
    wq_b, wq_b_scale = local_wq_b(_u8(qkv.wq_b), qkv.wq_b_scale, config, tp, rank)
    proj = launch.rows("v41.qkv_proj_rope", {"tp": tp}, n, qkv_proj_rope.A5SIM_CHUNK,
                       {"x": xa, "rope_cos": rc, "rope_sin": rs},
                       {"wq_a": _u8(qkv.wq_a), "wq_a_scale": qkv.wq_a_scale, "q_norm": qkv.q_norm,
                        "wq_b": wq_b.contiguous(), "wq_b_scale": wq_b_scale.contiguous(), "wkv": _u8(qkv.wkv),
                        "wkv_scale": qkv.wkv_scale, "kv_norm": qkv.kv_norm})
    launch.observed["qr"] = proj["qr"]
    topk = None
    if lc.mode in _INDEXED:
        topk = _select(launch, config, layer, lc, xa, proj["qr"], w.indexer, md, batch, rope, caches, n)
    elif lc.mode is not Mode.SWA:  # Reuse: the source's published rows
        topk = caches.scratch.topk_rows[lc.index_source][:n].clone()
    wc = caches.windows[layer]
    pub = {"kv": proj["kv"], "window_slots": md.window_slots[:n].to(_I32),
           "window_kv": _u8(wc.payload).clone(), "window_kv_scale": _u8(wc.scales).clone()}
    out = launch("v41.window_publish", {"tokens": n, "blocks": wc.payload.shape[0]}, pub,
                 validate=window_publish.validate_launch)
    _u8(wc.payload).copy_(out["window_kv"])
    _u8(wc.scales).copy_(out["window_kv_scale"])
    heads = local_heads(config, tp)
    o = _attend(launch, config, tp, proj["q"].reshape(n, heads, hd), wc, md,
                caches.sources.get(lc.kv_source) if topk is not None else None, topk, wl.attn_sink, n)
    part = launch.rows("v41.o_proj", {"tp": tp}, n, o_proj.A5SIM_CHUNK,
                       {"attn_out": o.reshape(n, heads * hd), "rope_cos": rc, "rope_sin": rs},
                       {"wo_a": wl.o.wo_a.reshape(-1, config.o_group_in).contiguous(),
                        "wo_b": _u8(wl.o.wo_b).contiguous(), "wo_b_scale": wl.o.wo_b_scale.contiguous()})
    partial[:n] = part["partial"]
    if topk_full is not None:
        topk_full[:n] = topk
    return partial, topk_full


def _full_rows(t: torch.Tensor, tp: int) -> torch.Tensor:
    """An uninitialized tensor ``tp`` times ``t``'s rows: a rank's shard as the full weight
    the building block's ``work`` divides by ``tp``."""
    return torch.empty((t.shape[0] * tp, *t.shape[1:]), dtype=t.dtype)


def launches_work(config, trace: list, tp: int) -> Work:
    """The summed :class:`~harness.registry.Work` of a dry pass's launches, each rated by
    its building block's own entry ``work`` (the same declarations as its roofline)."""
    from harness import registry
    from harness.case import Case
    entries = {"v41.rope_rows": "rope_rows", "v41.qkv_proj_rope": "qkv_proj_rope",
               "v41.window_publish": "window_publish", "v41.sparse_attention": "sparse_attention",
               "v41.o_proj": "o_proj", "v41.compressor_ratio1": "compressor_ratio1",
               "v41.compressor_ratio2": "compressor_ratio2", "v41.index_query": "index_query",
               "v41.paged_indexer": "paged_indexer", "v41.hierarchical_indexer": "hierarchical_sparse_indexer",
               "v41.hc_mixes": "hc_mixes", "v41.hc_pre": "hc_pre", "v41.hc_post": "hc_post",
               "v41.rmsnorm": "rmsnorm"}
    total, flops = 0, {}
    for module, axes, args in trace:
        name = entries[module]
        inputs = dict(args)
        if module == "v41.qkv_proj_rope":
            inputs["wq_b"], inputs["wq_b_scale"] = _full_rows(args["wq_b"], tp), _full_rows(args["wq_b_scale"], tp)
        if module == "v41.o_proj":
            for k in ("attn_out", "wo_a", "wo_b", "wo_b_scale"):
                inputs[k] = _full_rows(args[k], tp)
        if module == "v41.paged_indexer":
            inputs.setdefault("topk_rows", args.get("topk_rows"))
        case = Case(entry=name, tokens=axes["tokens"], tp=axes.get("tp", 1), preset=axes.get("preset", "tiny"))
        w = registry.get(name).work(config, case, inputs)
        total += w.bytes
        for k, v in w.flops.items():
            flops[k] = flops.get(k, 0) + v
    return Work(total, flops)


def leaf_work(layer: int):
    """``Entry.work`` of the leaf at ``layer``: one rank's launches (group 0, rank 0)."""
    def work(config, case, inputs) -> Work:
        return launches_work(config, dry_run(config, case, inputs, layer, 0), case.tp)
    return work


def dry_run(config, case, inputs, layer: int, g: int) -> list:
    """Group ``g``'s rank-0 launches without launching: every building block's host check
    runs on its arguments (raising ValueError naming the field), nothing is written to
    ``inputs``.  Returns the trace ``(module, axes, arguments and outputs)``."""
    from harness.entries import attention_paths as paths
    trace: list = []
    w, rope, batch, caches, x = paths.group_state(config, case, inputs, g, layer)
    dry = RankLauncher(None, config, 0, case.preset, dry=True, trace=trace)
    rank_partial(dry, config, layer, x, w, caches, batch, rope, case.tp, 0, case.group_active(g))
    return trace


def reuse_launches(platform) -> bool:
    """Launch reuse (:func:`launch_key`) is on for the a5sim interpreter unless
    ``V41_A5SIM_REUSE=0``; real cards always launch."""
    return getattr(platform, "name", "") == "a5sim" and os.environ.get("V41_A5SIM_REUSE", "1") != "0"


def launch_memo(platform) -> LaunchMemo | None:
    """The memo launches on ``platform`` may reuse (None: reuse off): one per verify level,
    so a launch checked at ``tensor`` never stands in for one that must be ``lowered``; an
    estimate-only platform's uncomputed outputs live in their own memo, and so do a
    numerics-only platform's launches (no estimate to stand in for one that has it)."""
    if not reuse_launches(platform):
        return None
    if getattr(platform, "estimate_only", False):
        return ESTIMATE_MEMO
    level = getattr(platform, "verify_level", None)
    costed = getattr(platform, "cost_model", True)
    if level in (None, "tensor") and costed:
        return MEMO
    return MEMOS.setdefault((level, costed), LaunchMemo())


def kernel_sut(layer: int):
    """The a5sim/a5 SUT of the leaf at ``layer``: a dry validation pass of every group's
    launches (nothing launched, nothing written) first, then every group, rank and epoch
    through :func:`rank_partial` and the host transports of the case's wiring
    (``attention_paths.alternate``).  Cost: one record per (group, rank, epoch)."""
    from harness.entries import attention_paths as paths

    def run(platform, config, case, inputs):
        for g in range(case.dp):
            dry_run(config, case, inputs, layer, g)
        records: list = []
        memo = launch_memo(platform)

        def partial_fn(config, layer, x, w, caches, batch, rope, tp, rank, active, epoch):
            launch = RankLauncher(platform, config, rank, case.preset, memo=memo)
            result = rank_partial(launch, config, layer, x, w, caches, batch, rope, tp, rank, active)
            records.extend(launch.cost())
            return (*result, launch.observed)

        return paths.alternate(layer, partial_fn, lambda: records)(platform, config, case, inputs)
    return run
