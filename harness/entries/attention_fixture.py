"""Fixtures of the attention-mode entries: one flat dict of named tensors per case.

Every tensor under a stable name, so a saved case replays from ``inputs.safetensors``;
:func:`weights_from`, :func:`batch_from`, :func:`caches_from` rebuild the golden structures
as fresh copies.  ``g{g}.`` prefixes DP group g (its own batch of ``tokens`` rows, its own
caches); weights and RoPE tables are shared:

* ``w.attn.qkv.*``, ``w.attn.o.*``, ``w.attn.attn_sink``, ``w.comp.*``, ``w.idx.*``;
* ``rope.{base,compressed}_{cos,sin}``: serving-owned full tables;
* ``g{g}.x``: the normalized attention input (padding rows hold junk 7.0, never read);
* ``g{g}.meta.{query_start_loc,kv_seq_lens,window_block_table,state_table}`` and
  ``g{g}.meta.ctable.r{ratio}`` (one compressed table per ratio, shared by its sources);
* ``g{g}.cache.{name}.L{layer}``: every cache tensor of :meth:`ModelCaches.tensors`
  (windows, compressed KV / index keys, state ring, Top-K / candidate scratch);
  ``g{g}.scratch.published``: INT32 ``[num_layers]`` 0/1, the layers that published;
* ``out``: the BF16 ``[dp, tokens, hidden]`` output buffer, filled with the sentinel.

Kinds: ``mixed`` ragged requests, one of them empty; ``long`` prefixes of 6-10 blocks
(decode) or 4-8 (prefill), far past the window; ``masked`` request 0 has state block -1
(ratio-2 compressor disabled), request 1 no prefix (fewer visible positions than window and
Top-K); ``zero`` every third active input row zero; ``sink`` sinks +12 (even heads) / -30.
Block tables are nonidentity permutations with one trailing -1 column.

Top-K / candidate scratch of a Reuse or Reindex layer is published by running the source
layer's golden first (its own seeded input, same batch), so the source caches, Top-K rows
and candidate mask are what the model would hold.
"""

from __future__ import annotations

import dataclasses

import torch

from goldens.compressor import CompressorWeights, SourceCaches
from goldens.config import Mode, V41Config
from goldens.modes import (ForwardBatch, ForwardScratch, IndexerWeights, ModelCaches, ModeWeights,
                           RopeTables, WindowCache, attention_half_layer, build_forward_batch,
                           random_mode_weights)
from goldens.o_proj import OWeights
from goldens.qkv import QKVWeights
from goldens.quant import quantize_compressed_kv, quantize_index_key
from goldens.tp import AttentionWeights
from goldens.window_cache import publish_window_kv
from harness.fixtures import block_table, generator, nonidentity_permutation, randn, sentinel, split_lengths

_I32 = torch.int32
PAD_VALUE = 7.0  # junk in the input's padding rows: never read into an active value


# ---- weights ---------------------------------------------------------------------------------

def _flatten(prefix: str, obj, out: dict) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, torch.Tensor):
            out[f"{prefix}{f.name}"] = value
        elif dataclasses.is_dataclass(value):
            _flatten(f"{prefix}{f.name}.", value, out)


def _sub(flat: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v.clone() for k, v in flat.items() if k.startswith(prefix)}


def weights_flat(config: V41Config, layer: int, case) -> dict:
    w = random_mode_weights(config, layer, seed=case.seed)
    out: dict = {}
    _flatten("w.attn.", w.attn, out)
    if w.compressor is not None:
        _flatten("w.comp.", w.compressor, out)
    if w.indexer is not None:
        _flatten("w.idx.", w.indexer, out)
    if case.kind == "sink":
        sink = out["w.attn.attn_sink"].clone()
        sink[0::2] = sink[0::2] * 4 + 12.0
        sink[1::2] = -30.0
        out["w.attn.attn_sink"] = sink
    return out


def weights_from(config: V41Config, layer: int, flat: dict) -> ModeWeights:
    attn = AttentionWeights(QKVWeights(**_sub(flat, "w.attn.qkv.")), OWeights(**_sub(flat, "w.attn.o.")),
                            flat["w.attn.attn_sink"].clone())
    comp, idx = _sub(flat, "w.comp."), _sub(flat, "w.idx.")
    return ModeWeights(config.layer_config(layer).mode, attn,
                       CompressorWeights(**comp) if comp else None, IndexerWeights(**idx) if idx else None)


def rope_from(flat: dict) -> RopeTables:
    return RopeTables(*(flat[f"rope.{n}"] for n in ("base_cos", "base_sin", "compressed_cos", "compressed_sin")))


# ---- geometry --------------------------------------------------------------------------------

def _query_lens(case, g: int) -> list[int]:
    B, N, tag = case.requests, case.group_active(g), f"g{g}/qlens"
    if case.kind == "mixed" and B >= 2:
        lens = split_lengths(N, B - 1, case.seed, tag, allow_empty=N < B - 1)
        at = int(torch.randint(0, B, (1,), generator=generator(case.seed, tag, "empty")))
        return lens[:at] + [0] + lens[at:]
    return split_lengths(N, B, case.seed, tag, allow_empty=N < B)


def _prefix_lens(config: V41Config, case, g: int, decode: bool) -> torch.Tensor:
    bs, W, B = config.cache.block_size, config.sliding_window, case.requests
    if case.kind == "long":
        lo, hi = (6 * bs, 10 * bs) if decode else (4 * bs, 8 * bs)
    else:
        lo, hi = (W + 1, 3 * bs) if decode else (1, 2 * bs)
    kv = torch.randint(lo, hi + 1, (B,), generator=generator(case.seed, f"g{g}", "kv"))
    if not decode and case.kind != "long":
        kv[0::2] = 0  # fresh prompts beside prompts with a cached prefix
    if case.kind == "masked" and B > 1:
        kv[1] = 0
    return kv.to(_I32)


def _pages(lengths: list[int], per_page: int) -> list[int]:
    return [max(1, -(-n // per_page)) for n in lengths]


def group_meta(config: V41Config, case, g: int) -> dict:
    """Metadata tensors of DP group ``g`` (see the module doc)."""
    decode = "decode_" in case.entry
    bs, B = config.cache.block_size, case.requests
    lens = _query_lens(case, g)
    kv = _prefix_lens(config, case, g, decode)
    new = [int(k) + n for k, n in zip(kv.tolist(), lens)]
    wp = _pages(new, bs)
    meta = {"query_start_loc": torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=_I32),
            "kv_seq_lens": kv,
            "window_block_table": block_table(wp, sum(wp) + 2, case.seed, f"g{g}/window", max(wp) + 1)}
    ratios = sorted({config.compress_ratios[s] for s in config.kv_source_layer_ids})
    cpages = {r: _pages([n // r for n in new], bs) for r in ratios}
    nblocks = max(sum(p) for p in cpages.values()) + 1
    for r, p in cpages.items():
        meta[f"ctable.r{r}"] = block_table(p, nblocks, case.seed, f"g{g}/ctable{r}", max(p) + 1)
    state = nonidentity_permutation(B + 3, case.seed, f"g{g}/state")[:B].to(_I32)[:, None].clone()
    if case.kind == "masked":
        state[0, 0] = -1
    meta["state_table"] = state
    return {f"g{g}.meta.{k}": v for k, v in meta.items()}


def batch_from(config: V41Config, case, flat: dict, g: int, num_state_blocks: int) -> ForwardBatch:
    p = f"g{g}.meta."
    ctables = {s: flat[f"{p}ctable.r{config.compress_ratios[s]}"] for s in config.kv_source_layer_ids}
    states = {s: flat[f"{p}state_table"] for s in config.kv_source_layer_ids if config.compress_ratios[s] == 2}
    return build_forward_batch(config, flat[f"{p}query_start_loc"], flat[f"{p}kv_seq_lens"],
                               flat[f"{p}window_block_table"], ctables, states,
                               num_padded_tokens=case.tokens, num_state_blocks=num_state_blocks, tp=case.tp)


# ---- caches ----------------------------------------------------------------------------------

def cache_layers(config: V41Config, layer: int) -> list[int]:
    """The mode's layer, its sources, and one neighbour whose window it must not touch."""
    lc = config.layer_config(layer)
    near = layer + 1 if layer + 1 < config.num_layers else layer - 1
    found = {layer, near} | {s for s in (lc.kv_source, lc.index_source, lc.candidate_source) if s is not None}
    return sorted(found)


def prerequisites(config: V41Config, layer: int) -> list[int]:
    """Layers that must publish in this forward before ``layer`` runs (in order)."""
    lc = config.layer_config(layer)
    src = {Mode.C2A_REUSE: lc.index_source, Mode.C1A_REUSE: lc.index_source,
           Mode.C1A_REINDEX: lc.candidate_source}.get(lc.mode)
    return [] if src is None else prerequisites(config, src) + [src]


def _fill_history(config: V41Config, caches: ModelCaches, seed: int, tag: str) -> None:
    for layer, wc in caches.windows.items():
        kv = randn((wc.rows, config.head_dim), seed, f"{tag}/hist/window{layer}", torch.bfloat16)
        publish_window_kv(wc.payload, wc.scales, kv, torch.arange(wc.rows))
    for src, sc in caches.sources.items():
        n = sc.num_blocks * config.cache.block_size
        p, s = quantize_compressed_kv(randn((n, config.head_dim), seed, f"{tag}/hist/ckv{src}"),
                                      config.cache.compressed_group)
        sc.compressed_kv.copy_(p.view(sc.compressed_kv.shape))
        sc.compressed_kv_scale.view(torch.uint8).copy_(s.view(torch.uint8).view(sc.compressed_kv_scale.shape))
        p, s = quantize_index_key(randn((n, config.index.head_dim), seed, f"{tag}/hist/ik{src}"),
                                  config.cache.index_group)
        sc.index_key.copy_(p.view(sc.index_key.shape))
        sc.index_key_scale.copy_(s.view(sc.index_key_scale.shape))
    for src, st in caches.states.items():
        st.copy_(randn(tuple(st.shape), seed, f"{tag}/hist/state{src}"))


def caches_flat(config: V41Config, caches: ModelCaches, g: int) -> dict:
    out = {f"g{g}.cache.{name}.L{layer}": t for (name, layer), t in caches.tensors().items()}
    published = torch.zeros(config.num_layers, dtype=_I32)
    published[sorted(caches.scratch.published)] = 1
    out[f"g{g}.scratch.published"] = published
    return out


def caches_from(config: V41Config, flat: dict, g: int, tokens: int) -> ModelCaches:
    pre = f"g{g}.cache."
    items = {}
    for key, t in flat.items():
        if key.startswith(pre):
            name, layer = key[len(pre):].rsplit(".L", 1)
            items[(name, int(layer))] = t.clone()
    names = ("compressed_kv", "compressed_kv_scale", "index_key", "index_key_scale")
    layers = {layer for _, layer in items}
    windows = {L: WindowCache(items[("window_kv", L)], items[("window_kv_scale", L)])
               for L in layers if ("window_kv", L) in items}
    sources = {L: SourceCaches(**{n: items[(n, L)] for n in names}) for L in layers if ("compressed_kv", L) in items}
    states = {L: items[("state_cache", L)] for L in layers if ("state_cache", L) in items}
    published = {int(i) for i in flat[f"g{g}.scratch.published"].nonzero().flatten().tolist()}
    scratch = ForwardScratch(tokens, {L: t for (n, L), t in items.items() if n == "topk_rows"},
                             {L: t for (n, L), t in items.items() if n == "candidate_mask"}, published)
    return ModelCaches(windows, sources, states, scratch)


def num_state_blocks(flat: dict, g: int) -> int | None:
    return next((int(t.shape[0]) for k, t in flat.items() if k.startswith(f"g{g}.cache.state_cache.")), None)


def x_input(config: V41Config, case, g: int, tag: str) -> torch.Tensor:
    x = randn((case.tokens, config.hidden_size), case.seed, f"g{g}/{tag}")
    if case.kind == "zero":
        x[:case.group_active(g):3] = 0
    x[case.group_active(g):] = PAD_VALUE
    return x.to(torch.bfloat16)


# ---- the whole fixture -----------------------------------------------------------------------

def build_inputs(config: V41Config, case, layer: int) -> dict:
    """Every tensor of one case, deterministic in ``case.seed`` (see the module doc)."""
    flat = weights_flat(config, layer, case)
    metas = [group_meta(config, case, g) for g in range(case.dp)]
    longest = max(int((m[f"g{g}.meta.kv_seq_lens"]).max()) + case.tokens for g, m in enumerate(metas))
    rope = RopeTables.build(config, -(-(longest + 1) // 64) * 64)
    flat.update({f"rope.{f.name}": getattr(rope, f.name) for f in dataclasses.fields(rope)})
    for g, meta in enumerate(metas):
        flat.update(meta)
        wp = meta[f"g{g}.meta.window_block_table"]
        cblocks = max(int((t >= 0).sum()) for k, t in meta.items() if ".ctable." in k) + 1
        caches = ModelCaches.allocate(config, window_blocks=int((wp >= 0).sum()) + 2, compressed_blocks=cblocks,
                                      state_blocks=case.requests + 3, layers=cache_layers(config, layer),
                                      fill=0x22)
        _fill_history(config, caches, case.seed, f"g{g}")
        batch = batch_from(config, case, meta, g, case.requests + 3)
        caches.begin_forward(config, batch)
        for src in prerequisites(config, layer):
            attention_half_layer(config, src, x_input(config, case, g, f"x_src{src}"),
                                 random_mode_weights(config, src, seed=case.seed), caches, batch, rope,
                                 active=case.group_active(g))
        flat.update(caches_flat(config, caches, g))
        flat[f"g{g}.x"] = x_input(config, case, g, "x")
    flat["out"] = sentinel((case.dp, case.tokens, config.hidden_size))
    return flat
