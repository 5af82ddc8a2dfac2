"""``decode_<mode>``: the mHC composition around the ``decode_attn_<mode>`` leaf, on v41
kernels (the contract's "Decode composition").

Per DP group and epoch, every TP rank launches ``v41.hc_mixes`` (this site's pre / post /
comb from its input lanes), ``v41.hc_pre`` (collapse with the INCOMING delayed pre-mix),
``v41.rmsnorm`` (``attn_norm``), the leaf's kernels (:mod:`harness.entries.attention_kernels`)
and ``v41.hc_post``.  Replicated: each rank runs the mHC kernels over every row and gets the
all-reduced attention output.  Sharded: each rank runs them over its capacity slab only
(the residual stream never crosses the group); the normalized slab is all-gathered, the
FP32 partials reduce-scattered back to slabs.

Fixture: the leaf's (``attention_fixture``) plus, per group, residual lanes ``g{g}.x_hc``
FP32 ``[T, hc, D]`` (BF16 values) and the incoming pre-mix ``g{g}.pre_in`` FP32 ``[T, hc]``
(kind ``first``: the first site's one-hot lane 0, :func:`goldens.mhc.initial_pre_mix`);
the site's ``w.hc.{fn,scale,base}`` and BF16 ``w.attn_norm``.  Outputs: ``x_hc_out``
``[dp, T, hc, D]``, ``pre_out`` ``[dp, T, hc]`` (fully written), ``attention_output``
``[dp, T, D]`` BF16, a caller-initialized InOut (sentinel): the active rows are the
half-layer output, the inactive rows unchanged.  The leaf's own outputs (``out``, Top-K,
caches) are compared as the leaf's entry compares them.

Golden: ``goldens.mhc.hc_mixes``, ``hc_pre``, ``goldens.norm.rms_norm``, the leaf golden
on that input (``goldens.modes.attention_half_layer``), ``hc_post``.  Comparison: the leaf's
checks on ``out``; ``pre_out`` by the per-row bound; ``x_hc_out`` by the per-row bound
against ``hc_post`` REPLAYED on the SUT's own attention output with the golden mixes (the
contract's replay, so an attention difference inside its budget is not charged twice);
``attention_output`` byte-equal to ``out`` on active rows and to its input elsewhere.

``prefill_<mode>`` is the same composition as the contract's prefill sequence-parallel
site (residuals token-sharded: the sharded wiring only; its golden is this replicated-form
composition, which ``tests/goldens/test_prefill_sp.py`` proves byte-equal on active rows to
the SP golden ``goldens.prefill_sp``):
each rank's mHC kernels run over its ACTIVE rows only, ``max(0, min(T_local, n - r*T_local))``,
and every inactive row of ``x_hc_out``, ``pre_out`` and ``attention_output`` is exact zero
(checked on its own), not an untouched InOut: no kernel runs on those rows, the zeros are
the host's output buffers as allocated; each rank's shard is compared on its own
(``g{g}.r{r}.x_hc_out`` ...).  ``case.dp_tokens`` (``--dp-tokens``) gives each DP group its
own group-global count (0: an idle group, every output row zero, no cache byte changed);
what each rank is handed (count, slab capacity, positions) is checked before any launch
(:mod:`harness.entries.sp_launch`).
"""

from __future__ import annotations

import torch

from goldens.mhc import HcSiteWeights, hc_mixes, hc_post, hc_pre, initial_pre_mix
from goldens.norm import rms_norm
from harness.case import Case, Support, standard_matrix
from harness.compare import check_non_owned_bytes, check_row_bound, check_sentinel, check_zero_rows
from harness.entries import attention, attention_kernels, sp_launch
from harness.entries import attention_fixture as fixture
from harness.entries import attention_paths as paths
from harness.entries.hc_pre import pre_mix, residual_lanes
from harness.fixtures import SENTINEL, STREAM_SENTINEL, randn, sentinel, uniform
from harness.registry import Entry, SutOutput, Work, register

KINDS = ("mixed", "long", "masked", "first")


# ---- fixture and golden ----------------------------------------------------------------------

def build_inputs(config, case, layer: int) -> dict:
    leaf_case = case.with_(kind="mixed" if case.kind == "first" else case.kind)
    flat = fixture.build_inputs(config, leaf_case, layer)
    hc, T, d = config.hc.hc_mult, case.tokens, config.hidden_size
    for g in range(case.dp):
        gc = case.with_(seed=case.seed + 101 * g)
        flat[f"g{g}.x_hc"] = residual_lanes(config, gc, "site_x_hc")
        flat[f"g{g}.pre_in"] = initial_pre_mix(T, config) if case.kind == "first" else pre_mix(config, gc)
        flat.pop(f"g{g}.x")  # the composition computes the leaf's input
    mix, hc_dim = config.mix_hc, config.hc_dim
    flat["w.hc.fn"] = randn((mix, hc_dim), case.seed, "site_fn", scale=hc_dim ** -0.5)
    flat["w.hc.scale"] = uniform((3,), case.seed, "site_scale", 0.5, 2.0)
    flat["w.hc.base"] = randn((mix,), case.seed, "site_base")
    flat["w.attn_norm"] = (1.0 + randn((d,), case.seed, "attn_norm", scale=0.1)).to(torch.bfloat16)
    if sequence_parallel(case):  # what each TP rank is handed (checked before any launch)
        for g in range(case.dp):
            batch = fixture.batch_from(config, case, flat, g, fixture.num_state_blocks(flat, g))
            flat.update(sp_launch.group_meta(case, g, batch.metadata.position_ids))
    flat["attention_output"] = sentinel((case.dp, T, d))
    flat["x_hc_out"] = sentinel((case.dp, T, hc, d), torch.float32, STREAM_SENTINEL)
    flat["pre_out"] = sentinel((case.dp, T, hc), torch.float32)
    return flat


def _site(inputs) -> HcSiteWeights:
    return HcSiteWeights(inputs["w.hc.fn"], inputs["w.hc.scale"], inputs["w.hc.base"])


def sequence_parallel(case) -> bool:
    """The prefill SP site: inactive rows exact zero in every composition output."""
    return case.entry.startswith("prefill_")


def golden(config, case, inputs, layer: int) -> dict:
    leaf_inputs, mixes = dict(inputs), []
    for g in range(case.dp):
        m = hc_mixes(inputs[f"g{g}.x_hc"], _site(inputs), config)
        collapsed = hc_pre(inputs[f"g{g}.x_hc"], inputs[f"g{g}.pre_in"], config)
        leaf_inputs[f"g{g}.x"] = rms_norm(collapsed, inputs["w.attn_norm"], config.rms_norm_eps)
        mixes.append(m)
    result = paths.golden(config, case, leaf_inputs, layer)
    for g, m in enumerate(mixes):  # kept for the comparison (replays, accepted selections)
        result[f"g{g}.x_norm"] = leaf_inputs[f"g{g}.x"]
        result[f"g{g}.mix_post"], result[f"g{g}.mix_comb"] = m.post, m.comb
    att = inputs["attention_output"].clone()
    for g in range(case.dp):
        n = case.group_active(g)
        att[g, :n] = result["out"][g, :n]
    result["attention_output"] = att
    result["x_hc_out"] = torch.stack([hc_post(result["out"][g], inputs[f"g{g}.x_hc"], m.post, m.comb, config)
                                      for g, m in enumerate(mixes)])
    result["pre_out"] = torch.stack([m.pre for m in mixes])
    if sequence_parallel(case):
        for g in range(case.dp):
            for name in ("attention_output", "x_hc_out", "pre_out"):
                result[name][g, case.group_active(g):] = 0
    return result


def compare(spec, config, case, inputs, gold, actual) -> list:
    leaf_inputs = {**inputs, **{f"g{g}.x": gold[f"g{g}.x_norm"] for g in range(case.dp)}}
    verdicts = attention.compare(spec, config, case, leaf_inputs, gold, actual)
    for name in ("x_hc_out", "pre_out", "attention_output"):
        if name not in actual:
            return verdicts + attention._missing(name)
    sp = sequence_parallel(case)
    T, hc, d = case.tokens, config.hc.hc_mult, config.hidden_size
    for g in range(case.dp):
        n = case.group_active(g)
        post, comb = gold[f"g{g}.mix_post"], gold[f"g{g}.mix_comb"]
        replay = hc_post(actual["out"][g], inputs[f"g{g}.x_hc"], post, comb, config)
        if sp:  # every local shard on its own: rank r's slab, its active rows, then the rest
            width = -(-T // case.tp)
            shards = [(f"g{g}.r{r}", r * width, min((r + 1) * width, T)) for r in range(case.tp)]
            expect = torch.zeros_like(actual["attention_output"][g])
        else:
            shards = [(f"g{g}", 0, T)]
            expect = inputs["attention_output"][g].clone()
        for name, lo, hi in shards:
            act = slice(lo, max(lo, min(hi, n))) if sp else slice(lo, hi)
            if act.stop > act.start:
                lanes = actual["x_hc_out"][g][act].reshape(-1, d)
                ref = replay[act].reshape(lanes.shape)
                verdicts += check_row_bound(f"{name}.x_hc_out", lanes, ref)
                verdicts += check_sentinel(f"{name}.x_hc_out", lanes, STREAM_SENTINEL, ref=ref)
                verdicts += check_row_bound(f"{name}.pre_out", actual["pre_out"][g][act], gold["pre_out"][g][act])
                verdicts += check_sentinel(f"{name}.pre_out", actual["pre_out"][g][act], SENTINEL,
                                           ref=gold["pre_out"][g][act])
            if sp and hi > act.stop:  # inactive rows exact zero, each output on its own
                idle = slice(act.stop, hi)
                verdicts += check_zero_rows(f"{name}.x_hc_out", actual["x_hc_out"][g].reshape(T, hc * d), rows=idle)
                verdicts += check_zero_rows(f"{name}.pre_out", actual["pre_out"][g], rows=idle)
        expect[:n] = actual["out"][g][:n]
        verdicts += check_non_owned_bytes(f"g{g}.attention_output", actual["attention_output"][g], expect)
    return verdicts


# ---- kernel SUT ------------------------------------------------------------------------------

class KernelSite:
    """One DP group's mHC launches per rank and epoch (see the module doc); collects the
    rank's launcher so the leaf's launches add to the same cost record."""

    def __init__(self, platform, config, case, inputs, g: int, launchers: dict, memo):
        self.platform, self.config, self.case, self.inputs, self.g = platform, config, case, inputs, g
        self.launchers, self.memo = launchers, memo
        T, tp = case.tokens, case.tp
        self.width = -(-T // tp) if case.wiring == "sharded" else T
        self.mixes, self.x_hc_out = {}, torch.zeros(T, config.hc.hc_mult, config.hidden_size)
        self.pre_out = torch.zeros(T, config.hc.hc_mult)

    def launcher(self, rank: int, epoch: int):
        key = (self.g, rank, epoch)
        if key not in self.launchers:
            self.launchers[key] = attention_kernels.RankLauncher(self.platform, self.config, rank, self.case.preset,
                                                                 memo=self.memo)
        return self.launchers[key]

    def rows(self, rank: int) -> tuple[int, int]:
        """(first, count) of the capacity rows this rank's mHC kernels run over: every row of
        its slab (decode), its active rows only (prefill SP: the rest stay zero)."""
        first = rank * self.width if self.case.wiring == "sharded" else 0
        end = self.case.group_active(self.g) if sequence_parallel(self.case) else self.case.tokens
        return first, max(0, min(self.width, end - first))

    def prepare(self, rank: int, epoch: int) -> torch.Tensor:
        cfg, inp, g = self.config, self.inputs, self.g
        first, count = self.rows(rank)
        x = torch.zeros(self.width, cfg.hidden_size, dtype=torch.bfloat16)
        if count == 0:
            return x
        launch = self.launcher(rank, epoch)
        x_hc = inp[f"g{g}.x_hc"][first:first + count].contiguous()
        mixes = launch("v41.hc_mixes", {"tokens": count},
                       {"x_hc": x_hc, "fn": inp["w.hc.fn"], "scale": inp["w.hc.scale"], "base": inp["w.hc.base"]})
        collapsed = launch("v41.hc_pre", {"tokens": count},
                           {"x_hc": x_hc, "pre": inp[f"g{g}.pre_in"][first:first + count].contiguous()})["y"]
        x[:count] = launch("v41.rmsnorm", {"tokens": count}, {"x": collapsed, "weight": inp["w.attn_norm"]})["y"]
        self.mixes[rank] = mixes
        return x

    def finish(self, rank: int, epoch: int, y: torch.Tensor) -> None:
        first, count = self.rows(rank)
        if count == 0:
            return
        m = self.mixes[rank]
        out = self.launcher(rank, epoch)("v41.hc_post", {"tokens": count},
                                         {"y": y[:count].contiguous(),
                                          "x_hc": self.inputs[f"g{self.g}.x_hc"][first:first + count].contiguous(),
                                          "post": m["post"], "comb": m["comb"]})
        self.x_hc_out[first:first + count] = out["out"]
        self.pre_out[first:first + count] = m["pre"]


def kernel_sut(layer: int):
    """Dry validation of every group's leaf launches first, then per group the composition
    through ``attention_paths._group_alternate`` with a :class:`KernelSite`."""
    def run(platform, config, case, inputs) -> SutOutput:
        if sequence_parallel(case):  # the SP refusals, every group before any launch
            for g in range(case.dp):
                sp_launch.check_group(inputs, g, case.tp, case.tokens, inputs[f"g{g}.meta.query_start_loc"],
                                      inputs[f"g{g}.meta.kv_seq_lens"])
        memo = attention_kernels.launch_memo(platform)
        launchers: dict = {}
        leaf_inputs = dict(inputs)
        for g in range(case.dp):  # the dry pass needs an input of the right shape only
            leaf_inputs[f"g{g}.x"] = torch.zeros(case.tokens, config.hidden_size, dtype=torch.bfloat16)
            attention_kernels.dry_run(config, case, leaf_inputs, layer, g)
        result, outs, x_hc, pre = {}, [], [], []
        for g in range(case.dp):
            site = KernelSite(platform, config, case, inputs, g, launchers, memo)

            def partial_fn(config, layer, x, w, caches, batch, rope, tp, rank, active, epoch, site=site):
                launch = site.launcher(rank, epoch)
                return (*attention_kernels.rank_partial(launch, config, layer, x, w, caches, batch, rope, tp, rank,
                                                        active), launch.observed)
            res = paths._group_alternate(config, case, leaf_inputs, g, layer, partial_fn, site)
            outs.append(res.pop("out"))
            for k in ("out_ranks", "out_slab_tail", "topk", "topk_ranks", "qr_ranks"):
                if k in res:
                    result.setdefault(k, []).append(res.pop(k))
            result.update(res)
            x_hc.append(site.x_hc_out)
            pre.append(site.pre_out)
        for k in ("out_ranks", "out_slab_tail", "topk", "topk_ranks", "qr_ranks"):
            if k in result:
                result[k] = torch.stack(result[k])
        out = inputs["out"]
        for g, o in enumerate(outs):
            out[g] = o
        att = inputs["attention_output"]
        if sequence_parallel(case):  # the SP site's attention output: its shards, padding zero
            att.zero_()
        for g in range(case.dp):
            att[g, :case.group_active(g)] = out[g, :case.group_active(g)]
        inputs["x_hc_out"].copy_(torch.stack(x_hc))
        inputs["pre_out"].copy_(torch.stack(pre))
        result.update(out=out, attention_output=att, x_hc_out=inputs["x_hc_out"], pre_out=inputs["pre_out"])
        records = [r for lc in launchers.values() for r in lc.cost()]
        return SutOutput(result, records)
    return run


def work(layer: int):
    """``Entry.work``: one rank's launches, group 0 rank 0: the leaf's (on a zero input of
    the right shape) plus hc_mixes, hc_pre, rmsnorm and hc_post over the rank's rows (all
    rows replicated, its capacity slab sharded)."""
    def rate(config, case, inputs):
        hc, d, T = config.hc.hc_mult, config.hidden_size, case.tokens
        leaf_inputs = {**inputs, "g0.x": torch.zeros(T, d, dtype=torch.bfloat16)}
        leaf = attention_kernels.leaf_work(layer)(config, case, leaf_inputs)
        rows = -(-T // case.tp) if case.wiring == "sharded" else T
        x_hc, y = torch.empty(rows, hc, d), torch.empty(rows, d, dtype=torch.bfloat16)
        mix = {"pre": torch.empty(rows, hc), "post": torch.empty(rows, hc), "comb": torch.empty(rows, hc, hc)}
        trace = [("v41.hc_mixes", {"tokens": rows},
                  {"x_hc": x_hc, "fn": inputs["w.hc.fn"], "scale": inputs["w.hc.scale"], "base": inputs["w.hc.base"],
                   **mix}),
                 ("v41.hc_pre", {"tokens": rows}, {"x_hc": x_hc, "pre": mix["pre"], "y": y}),
                 ("v41.rmsnorm", {"tokens": rows}, {"x": y, "weight": inputs["w.attn_norm"], "y": y}),
                 ("v41.hc_post", {"tokens": rows}, {"y": y, "x_hc": x_hc, "post": mix["post"], "comb": mix["comb"],
                                                    "out": x_hc})]
        mhc = attention_kernels.launches_work(config, trace, case.tp)
        flops = dict(leaf.flops)
        for k, v in mhc.flops.items():
            flops[k] = flops.get(k, 0) + v
        return Work(leaf.bytes + mhc.bytes, flops)
    return rate


# ---- entries ---------------------------------------------------------------------------------

def _matrix(name: str, support: Support):
    """(1,1) in both wirings (kinds ``first``: the first site's one-hot pre-mix, ``long``)
    and (4,1) as the reserved-capacity case (33 rows, 31 active, 6 requests, 2 epochs) in
    both wirings; FLASH T=192 at one TP4 group (sharded) under ``slow``."""
    base = Case(entry=name, tokens=8, requests=3)
    tp1 = [c for c in standard_matrix(name, support, base, "composing") if c.tp == 1]
    cases = [c.with_(kind=k) for c, k in zip(tp1, ("first", "long"))]
    cases += [base.with_(tp=4, tokens=33, active_tokens=31, requests=6, epochs=2, wiring=wr, kind=k)
              for wr, k in zip(support.wirings, ("mixed", "masked"))]
    slow = (Case(entry=name, tp=4, tokens=192, requests=32, preset="flash", wiring="sharded"),)
    return tuple(cases), slow


def _prefill_matrix(name: str):
    """The prefill SP composition (residuals token-sharded: the sharded wiring only): TP2
    with reserved capacity (13 rows, 11 active: shards of 7, the second with 4 active) and
    the first site's one-hot pre-mix by default; under ``slow`` (a TINY prefill composition
    costs 60-250 s here, an eight-card one several times that): TP4 with the reserved 33/31
    batch, TP1, and the contract's eight-card checks (TP4 DP2, three epochs): ``--tokens 7
    --requests 3 --dp-tokens 7,1`` for C2A Full (and TP2 DP2 with an idle group, ``7,0``),
    ``--dp-tokens 8,5`` mixed for each C1A mode."""
    base = Case(entry=name, tokens=24, requests=3, wiring="sharded")
    cases = (base.with_(tp=2, tokens=13, active_tokens=11, kind="first"),)
    slow = (base.with_(tp=4, tokens=33, active_tokens=31, requests=6, kind="masked"),
            base.with_(kind="long"))
    eight = base.with_(tp=4, dp=2, epochs=3, kind="mixed")
    if name == "prefill_c2a_full":  # and an idle DP group (count 0: nothing runs, all zero)
        slow += (eight.with_(tokens=7, dp_tokens=(7, 1)),
                 base.with_(tp=2, dp=2, tokens=7, dp_tokens=(7, 0)))
    elif name.startswith("prefill_c1a_"):
        slow += (eight.with_(tokens=8, dp_tokens=(8, 5)),)
    return cases, slow


def _make(spec, phase: str = "decode") -> Entry:
    """``decode_<mode>`` (both wirings) or, for ``phase="prefill"``, the sequence-parallel
    ``prefill_<mode>`` (sharded wiring: local mHC, all-gather of the attention input,
    reduce-scatter of the FP32 partials; golden equal to ``goldens.prefill_sp``)."""
    name = f"{phase}_{spec.mode.value}"
    wirings = ("replicated", "sharded") if phase == "decode" else ("sharded",)
    support = Support(phase=phase, tp_sizes=(1, 2, 4, 8), dp_sizes=(1, 2), wirings=wirings,
                      kinds=KINDS, inactive_rows=True)
    matrix, slow = _matrix(name, support) if phase == "decode" else _prefill_matrix(name)
    # default pytest run: the TP4 sharded reserved-capacity case (the leaf's own TP2 case runs
    # in tests/platforms/test_a5sim_decode_attn.py); prefill: its one matrix case
    representative = tuple(c for c in matrix if c.tp == 4 and c.wiring == "sharded") if phase == "decode" else None

    description = (f"{phase} {spec.mode.value} mHC composition: hc_mixes, collapse with the incoming pre-mix, "
                   f"attn_norm, the {phase}_attn_{spec.mode.value} leaf, hc_post (v41 kernels per rank"
                   f"{'' if phase == 'decode' else ', residuals token-sharded'})")
    return register_mode_entry(spec, name, description, support, matrix, slow, build_inputs, golden,
                               compare, kernel_sut, work, representative=representative)


def register_mode_entry(spec, name: str, description: str, support: Support, matrix, slow,
                        build_inputs, golden, compare, kernel_sut, work,
                        representative: tuple | None = None) -> Entry:
    """Register an entry over ``spec``'s representative layer: ``build_inputs(config, case,
    layer)``, ``golden(config, case, inputs, layer)``, ``compare(spec, config, case, inputs,
    gold, actual)``, ``kernel_sut(layer)`` and ``work(layer)``, each run with the small-shape
    thread setting (:func:`attention_paths.small_shape_threads`); ``representative``: the
    matrix cases of the default pytest run (None: all)."""
    def layer(config):
        return config.representative_layer(spec.mode)

    def guarded(fn):
        def call(config, case, *args):
            with paths.small_shape_threads(config):
                return fn(config, case, *args)
        return call

    def sut(platform, config, case, inputs):
        with paths.small_shape_threads(config):
            return kernel_sut(layer(config))(platform, config, case, inputs)

    return register(Entry(
        name=name, description=description,
        support=support, matrix=matrix, slow_cases=slow, representative=representative,
        build_inputs=guarded(lambda c, k: build_inputs(c, k, layer(c))),
        golden=guarded(lambda c, k, i: golden(c, k, i, layer(c))),
        compare=guarded(lambda c, k, i, g, a: compare(spec, c, k, i, g, a)),
        kernels={"a5sim": sut, "a5": sut},
        work=lambda c, k, i: work(layer(c))(c, k, i),
    ))


ENTRIES = {e.name: e for e in (_make(s) for s in attention.MODES)}
PREFILL_ENTRIES = {e.name: e for e in (_make(s, "prefill") for s in attention.MODES)}
