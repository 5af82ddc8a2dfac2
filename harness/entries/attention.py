"""The six attention modes' leaves, one table: ``decode_attn_<mode>`` on v41 kernels
(:mod:`harness.entries.attention_kernels`), the prefill leaves ``prefill_attn_<mode>`` on the
same chain over prefill batches (requests of several new tokens over a cached prefix,
chunks longer than the ratio-2 state ring; replicated output), and the golden-alt
recompositions ``golden_alt_decode_attn_<mode>`` / ``golden_alt_prefill_attn_<mode>`` (the
per-rank recomposition through the golden pieces and host transports, kept as golden
self-consistency checks), for mode in swa, c2a_full, c2a_reuse, c1a_full, c1a_reindex,
c1a_reuse at the mode's representative layer of the preset
(``config.representative_layer``).  Fixture: ``attention_fixture``; reference:
``attention_paths``.

Comparison per DP group ``g`` (output names carry ``g{g}.``):

* Top-K: Full/Reindex ``check_topk`` on the SUT's rows against the golden's rows and
  scores (Reindex: inside the input candidate mask) BEFORE the output; an accepted
  selection other than the nominal one gets its output reference recomputed from the
  reference caches and original weights (``attention_paths.output_reference``).  Reuse:
  the rows must be the source's, byte for byte.
* Q-A latent acceptance (kernel SUTs, which return each rank's ``qr`` as ``qr_ranks``): an
  active row whose ``qr`` differs from the golden's only by legitimate BF16 roundings at
  ties (:mod:`harness.entries.qr_rounding`) gets its output reference recomputed on that
  ``qr`` (with the accepted selection); the bounds are unchanged and the output verdicts
  name the rows in their note.
* output on active rows: SWA and C2A modes the Attention budget ``check_c2a_budget`` (the
  reference's ``decode_attn_swa`` / ``decode_attn_c2a_full`` output comparator); C1A the
  strict per-row bound ``check_row_bound``;
  padding rows ``check_zero_rows``; active rows ``check_sentinel``; multi-rank replicated:
  ``check_replicas`` over the ranks' outputs (and Top-K rows); sharded: slab rows past T
  zero.
* caches: every tensor the mode does not own byte-identical to the input; owned tensors
  byte-identical outside the published slots, published rows dequantized (window MXFP8
  1 %, compressed KV / index keys MXFP4 4 %), the ratio-2 state ring by the reference's
  state budget (``check_state_rel_l2``: relative L2 <= 0.5 % at each written slot, exact
  elsewhere), the published Top-K
  scratch equal to the rows the layer attended to, the candidate mask equal to the golden's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from goldens.config import Mode
from goldens.modes import owned_keys
from goldens.qkv import q_lora
from goldens.quant import dequantize_compressed_kv, dequantize_index_key, dequantize_window_kv
from harness.case import Case, Support, standard_matrix
from harness.compare import (MXFP4_CACHE_MAX_REL_L2, MXFP8_CACHE_MAX_REL_L2, check_c2a_budget,
                             check_dequantized_rows, check_non_owned_bytes, check_replicas, check_row_bound,
                             check_sentinel, check_state_rel_l2, check_topk, check_zero_rows)
from harness.entries import attention_fixture as fixture
from harness.entries import attention_kernels as kernels
from harness.entries import attention_paths as paths
from harness.entries import qr_rounding
from harness.fixtures import SENTINEL
from harness.registry import Entry, register
from harness.verdict import single

KINDS = ("mixed", "long", "masked", "zero", "sink")
_INDEXED = (Mode.C2A_FULL, Mode.C1A_FULL, Mode.C1A_REINDEX)
_REUSE = (Mode.C2A_REUSE, Mode.C1A_REUSE)
_PUBLICATION = ("compressed_kv", "compressed_kv_scale", "index_key", "index_key_scale")


@dataclass(frozen=True)
class ModeSpec:
    mode: Mode
    budget: str  # "attention": check_c2a_budget (SWA, C2A); "row": the strict C1A per-row bound


MODES = (ModeSpec(Mode.SWA, "attention"), ModeSpec(Mode.C2A_FULL, "attention"),
         ModeSpec(Mode.C2A_REUSE, "attention"),
         ModeSpec(Mode.C1A_FULL, "row"), ModeSpec(Mode.C1A_REINDEX, "row"), ModeSpec(Mode.C1A_REUSE, "row"))


# ---- comparison --------------------------------------------------------------------------------

def _missing(name: str) -> list:
    return [single(name, "present", 1.0, 0.0, metric="output missing from the SUT's result")]


def _slot_rows(t: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    raw = t.contiguous().view(torch.uint8) if t.element_size() == 1 else t
    return raw.reshape(-1, t.shape[-1])[slots].view(t.dtype)


def _dequantized(config, name, flat, key_of, slots):
    group, fn = {"window_kv": (config.cache.window_group, dequantize_window_kv),
                 "compressed_kv": (config.cache.compressed_group, dequantize_compressed_kv),
                 "index_key": (config.cache.index_group, dequantize_index_key)}[name]
    return fn(_slot_rows(flat[key_of(name)], slots), _slot_rows(flat[key_of(f"{name}_scale")], slots), group)


def _ring_slots(config, md, state_table: torch.Tensor) -> list[int]:
    """Ring rows the ratio-2 compressor writes: the last min(len, capacity) rows of each
    live request whose state block is valid."""
    cap, qsl, pos = config.cache.state_capacity, md.query_start_loc.tolist(), md.position_ids.tolist()
    slots = []
    for r, blk in enumerate(state_table[:, 0].tolist()):
        n = qsl[r + 1] - qsl[r]
        if blk >= 0 and n:
            slots += [blk * cap + pos[t] % cap for t in range(qsl[r + 1] - min(n, cap), qsl[r + 1])]
    return slots


def _cache_verdicts(config, case, layer, g, md, inputs, gold, actual) -> list:
    lc, n, verdicts = config.layer_config(layer), case.group_active(g), []
    owned = owned_keys(config, layer)
    prefix = f"g{g}.cache."
    for key in sorted(k for k in inputs if k.startswith(prefix)):
        name, owner = key[len(prefix):].rsplit(".L", 1)
        if key not in actual:
            verdicts += _missing(key)
        elif (name, int(owner)) not in owned:
            verdicts += check_non_owned_bytes(key, actual[key], inputs[key])
        elif name == "state_cache":
            slots = _ring_slots(config, md, md.state_block_tables[lc.kv_source])
            verdicts += check_state_rel_l2(key, actual[key], gold[key], slots)
        elif name == "topk_rows":  # the published selection is the one the layer attended to
            verdicts += (check_non_owned_bytes(key, actual[key], actual["topk"][g]) if "topk" in actual
                         else _missing("topk"))
        elif name == "candidate_mask":
            verdicts += check_non_owned_bytes(key, actual[key], gold[key])
        else:
            slots = (md.window_slots if name.startswith("window") else md.compressed_slots[lc.kv_source])[:n]
            verdicts += check_non_owned_bytes(key, actual[key], inputs[key], owned=slots)
            slots = slots[slots >= 0]
            if not name.endswith("_scale") and slots.numel():
                def key_of(nm):
                    return f"{prefix}{nm}.L{owner}"
                bound = MXFP8_CACHE_MAX_REL_L2 if name == "window_kv" else MXFP4_CACHE_MAX_REL_L2
                verdicts += check_dequantized_rows(f"{key}.dequantized", _dequantized(config, name, actual, key_of, slots),
                                                   _dequantized(config, name, gold, key_of, slots), max_rel_l2=bound)
    return verdicts


def _topk_verdicts(config, case, layer, g, batch, inputs, gold, actual):
    """(verdicts, accepted selection or None) of group ``g``: Top-K acceptance before the
    output; the selection is returned when it differs from the nominal one."""
    lc, md = config.layer_config(layer), batch.metadata
    if lc.mode is Mode.SWA:
        return [], None
    if "topk" not in actual:
        return _missing("topk"), None
    if lc.mode in _REUSE:  # Reuse uses its supplied selection directly
        return check_non_owned_bytes(f"g{g}.topk", actual["topk"][g], gold["topk"][g]), None
    src = lc.kv_source
    cand = (inputs[f"g{g}.cache.candidate_mask.L{lc.candidate_source}"]
            if lc.mode is Mode.C1A_REINDEX else None)
    res = check_topk(f"g{g}.topk", actual["topk"][g], gold["topk"][g], gold[f"g{g}.index_scores"],
                     md.compressed_lens[src], batch.compressed_block_tables[src], md.token_to_req_indices,
                     page_size=config.cache.block_size, candidate_mask=cand, topk=config.index.topk)
    return list(res.verdicts), (actual["topk"][g] if res.passed and res.differs else None)


def _accepted_latents(config, case, layer, g, inputs, actual):
    """(rows, per-rank Q-A latents) of group ``g``: the active rows where some rank's ``qr``
    (``qr_ranks``, from the kernel SUT) differs from the golden's and is accepted as a
    legitimate BF16 rounding (:mod:`harness.entries.qr_rounding`), and each rank's golden
    ``qr`` with those rows replaced by its own; ``([], None)`` when nothing is accepted."""
    if "qr_ranks" not in actual:
        return [], None
    w = fixture.weights_from(config, layer, inputs)
    x, n = inputs[f"g{g}.x"], case.group_active(g)
    nominal = q_lora(x, w.attn.qkv, config)
    latents, rows = [], set()
    for sut in actual["qr_ranks"][g]:
        accepted = qr_rounding.accepted_rows(x, w.attn.qkv, config.rms_norm_eps, sut, nominal, n)
        qr = nominal.clone()
        qr[accepted] = sut[accepted]
        latents.append(qr)
        rows.update(accepted)
    return sorted(rows), (latents if rows else None)


def _noted(verdicts: list, rows: list[int]) -> list:
    if not rows:
        return verdicts
    note = (f"reference of rows {rows} recomputed on the SUT's qr (BF16 rounding ties of the Q-A "
            f"projection accepted)")
    return [dataclasses.replace(v, note=f"{v.note}; {note}" if v.note else note) for v in verdicts]


def _rank_verdicts(spec: ModeSpec, case, g: int, actual) -> list:
    """Sharded: the slab rows past T must come back and be zero.  Replicated multi-rank:
    every rank's output (and Top-K) must come back, byte-identical, rank 0's equal to the
    compared output."""
    if case.wiring == "sharded":
        if "out_slab_tail" not in actual:
            return _missing("out_slab_tail")
        return check_zero_rows(f"g{g}.out_slab_tail", actual["out_slab_tail"][g])
    if case.tp == 1:
        return []
    keys = ["out_ranks"] + (["topk_ranks"] if spec.mode is not Mode.SWA else [])
    verdicts = []
    for key in keys:
        if key not in actual or actual[key].shape[1] != case.tp:
            verdicts += _missing(f"{key} (one per TP rank)")
            continue
        verdicts += check_replicas(f"g{g}.{key}", list(actual[key][g]))
    if "out_ranks" in actual and actual["out_ranks"].shape[1] == case.tp:
        verdicts += check_non_owned_bytes(f"g{g}.out_ranks[0]", actual["out_ranks"][g][0],
                                          actual["out"][g])
    return verdicts


def compare(spec: ModeSpec, config, case, inputs, gold, actual) -> list:
    layer = config.representative_layer(spec.mode)
    T = case.tokens
    if "out" not in actual:
        return _missing("out")
    if actual["out"].shape[0] != case.dp:
        return [single("out", "dp_groups", float(actual["out"].shape[0]), float(case.dp),
                       relation=">=", metric=f"DP groups in the output must equal dp={case.dp}")]
    verdicts = []
    for g in range(case.dp):
        n = case.group_active(g)
        batch = fixture.batch_from(config, case, inputs, g, fixture.num_state_blocks(inputs, g))
        topk_verdicts, selection = _topk_verdicts(config, case, layer, g, batch, inputs, gold, actual)
        verdicts += topk_verdicts
        tied, latents = _accepted_latents(config, case, layer, g, inputs, actual)
        ref = (gold["out"][g] if selection is None and latents is None else
               paths.output_reference(config, case, inputs, gold, g, layer, selection, latents))
        out, name = actual["out"][g], f"g{g}.out"
        if n:
            check = check_c2a_budget if spec.budget == "attention" else check_row_bound
            verdicts += _noted(check(name, out, ref, rows=slice(0, n)), tied)
            verdicts += check_sentinel(name, out, SENTINEL, rows=slice(0, n), ref=ref)
        verdicts += check_zero_rows(name, out, rows=slice(n, T))
        verdicts += _rank_verdicts(spec, case, g, actual)
        verdicts += _cache_verdicts(config, case, layer, g, batch.metadata, inputs, gold, actual)
    return verdicts


# ---- entries ----------------------------------------------------------------------------------

# the contract's reserved-capacity TP4 batch (33 rows, 31 active, six requests)
RESERVED_TP4 = dict(tp=4, tokens=33, active_tokens=31, requests=6)


def _matrix(name: str, phase: str, support: Support) -> tuple[tuple[Case, ...], tuple[Case, ...]]:
    if phase == "decode":
        base = Case(entry=name, tokens=8, requests=3)
        cases = standard_matrix(name, support, base, "composing")
        cases = [c.with_(kind=k) for c, k in zip(cases, ("mixed", "long", "masked", "sink"))]
        cases += [base.with_(tp=2, dp=2, kind="zero", epochs=2),
                  base.with_(wiring="sharded", kind="mixed", **RESERVED_TP4)]
    else:
        base = Case(entry=name, tokens=24, requests=3)
        cases = [c.with_(kind=k) for c, k in zip(standard_matrix(name, support, base, "tp_only"), ("mixed", "long"))]
        cases += [base.with_(kind="masked", **RESERVED_TP4), base.with_(tp=2, dp=2, tokens=16, kind="sink", epochs=2),
                  base.with_(tokens=12, requests=2, kind="zero")]
    slow = (Case(entry=name, tp=4, tokens=192, requests=32, preset="flash"),) if phase == "decode" else ()
    return tuple(cases), slow


def _leaf_matrix(name: str, support: Support) -> tuple[tuple[Case, ...], tuple[Case, ...]]:
    """The kernel leaf's cases: the contract's leaf split (2,2) in both wirings, the
    replicated one with a reserved-capacity batch (8 rows, 7 active, kind ``masked``: a
    disabled state block and a request without prefix), the sharded one kind ``sink``
    with two epochs; the TP4 reserved-capacity batch (33 rows, 31 active, six requests)
    replicated with two epochs, as the contract's reserved case is for every mode (the
    compositions ``decode_<mode>`` run it sharded); FLASH T=192 at one TP4 group under
    ``slow``."""
    base = Case(entry=name, tokens=8, requests=3)
    leaf = standard_matrix(name, support, base, "leaf")
    cases = [leaf[0].with_(kind="masked", active_tokens=7), leaf[1].with_(kind="sink", epochs=2),
             base.with_(epochs=2, kind="masked", **RESERVED_TP4)]
    slow = (Case(entry=name, tp=4, tokens=192, requests=32, preset="flash"),)
    return tuple(cases), slow


def _prefill_leaf_matrix(name: str) -> tuple[tuple[Case, ...], tuple[Case, ...]]:
    """The prefill kernel leaf's cases (a TINY prefill case costs 40-200 s on a5sim): the
    (2,2) split with two epochs (DP groups independent, TP replicas compared, cache
    publication repeated) by default; TP1 with reserved capacity runs in
    ``tests/platforms/test_a5sim_prefill_attn.py`` (SWA, C1A Reindex); TP1, the TP4
    reserved-capacity batch, a TP4 long prefix and an empty-kind batch under ``slow``."""
    base = Case(entry=name, tokens=24, requests=3)
    cases = (base.with_(tp=2, dp=2, tokens=16, kind="sink", epochs=2),)
    slow = (base.with_(kind="mixed"),
            base.with_(kind="masked", **RESERVED_TP4),
            base.with_(tp=4, kind="long"),
            base.with_(tokens=12, requests=2, kind="zero"))
    return cases, slow


def _make(spec: ModeSpec, phase: str, sut: str = "golden-alt") -> Entry:
    """The entry of ``spec``'s mode in ``phase``: ``sut="kernel"`` the v41 leaf
    ``<phase>_attn_<mode>`` (:mod:`harness.entries.attention_kernels`; prefill: replicated
    output, the FP32 all-reduce on the host, as the contract keeps the standalone prefill
    leaves); otherwise the golden-alt recomposition ``golden_alt_<phase>_attn_<mode>``."""
    kernel = sut == "kernel"
    name = f"{phase}_attn_{spec.mode.value}" if kernel else f"golden_alt_{phase}_attn_{spec.mode.value}"
    wirings = ("replicated", "sharded") if phase == "decode" else ("replicated",)
    support = Support(phase=phase, tp_sizes=(1, 2, 4, 8), dp_sizes=(1, 2), wirings=wirings, kinds=KINDS,
                      inactive_rows=True)
    if not kernel:
        matrix, slow = _matrix(name, phase, support)
    else:
        matrix, slow = _leaf_matrix(name, support) if phase == "decode" else _prefill_leaf_matrix(name)

    def layer(config):
        return config.representative_layer(spec.mode)

    def build_inputs(config, case):
        with paths.small_shape_threads(config):
            return fixture.build_inputs(config, case, layer(config))

    def golden(config, case, inputs):
        with paths.small_shape_threads(config):
            return paths.golden(config, case, inputs, layer(config))

    def compare_case(config, case, inputs, gold, actual):
        with paths.small_shape_threads(config):
            return compare(spec, config, case, inputs, gold, actual)

    def alternate(platform, config, case, inputs):
        with paths.small_shape_threads(config):
            return paths.alternate(layer(config))(platform, config, case, inputs)

    def kernel_path(platform, config, case, inputs):
        with paths.small_shape_threads(config):
            return kernels.kernel_sut(layer(config))(platform, config, case, inputs)

    what = "v41 building-block kernels per rank" if kernel else "golden pieces per rank (golden-alt)"
    return register(Entry(
        name=name,
        description=f"{phase} {spec.mode.value} attention half-layer at the preset's representative layer "
                    f"({what}): output, Top-K rows and every cache tensor by ownership, DP groups independent",
        support=support, matrix=matrix, slow_cases=slow,
        representative=() if kernel else None,
        build_inputs=build_inputs, golden=golden, compare=compare_case,
        kernels={"a5sim": kernel_path, "a5": kernel_path} if kernel else {},
        work=(lambda config, case, inputs: kernels.leaf_work(layer(config))(config, case, inputs)) if kernel else None,
        alternate=None if kernel else alternate,
        alternate_label="" if kernel else
        f"{name}: per-rank golden pieces via host transports "
        f"({'all-reduce' if phase == 'prefill' else 'all-reduce / all-gather+reduce-scatter'}), tiny chunk budgets",
    ))


ENTRIES = {e.name: e for e in ([_make(s, p, "kernel") for p in ("decode", "prefill") for s in MODES]
                               + [_make(s, p) for p in ("decode", "prefill") for s in MODES])}
