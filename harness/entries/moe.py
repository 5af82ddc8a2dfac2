"""``moe``: the MoE half of the Block on v41 kernels with expert parallelism (golden:
``goldens.forward.ffn_site``, the mHC-wrapped ``goldens.moe.moe_block``).

The EP world is the DP groups x TP ranks (``ep = dp * tp``, EP rank ``g * tp + r``), each
rank holding its residual slab of its DP group's tokens (``ceil(T / tp)`` rows, the
group's active prefix split by :func:`goldens.config.rank_slab`) and the ``L = E / ep``
contiguous experts ``[rank * L, (rank + 1) * L)``.  Per epoch, every rank launches over its
slab rows ``v41.hc_mixes`` (this site's mixes first), ``v41.hc_pre`` (collapse with the
INCOMING attention pre-mix), ``v41.rmsnorm`` (``ffn_norm``, once), ``v41.gate`` (its
active rows only: the rest route nowhere) and ``v41.shared_expert``; the host's EP
dispatch (:class:`harness.ep_transport.EpGroup`) sends each (token, slot) row to the rank
owning the expert; each rank runs ``v41.routed_experts`` over what it received; the EP
combine returns every row to its token owner in ascending expert order, where
``v41.moe_combine`` adds the shared output and the routed rows in FP32 with one BF16 cast
and ``v41.hc_post`` forms the new streams.  The host does metadata, transports and
orchestration only.  Epochs repeat the same inputs (a rank's identical launches are reused
from the launch memo).  An estimate-only run (a5sim ``cost`` level) computes no router
output, so its dispatch follows :func:`balanced_routes`, and an EP rank whose packed
experts pass ``routed_experts.ESTIMATE_RANK_BYTES`` (a FLASH EP4 rank) is estimated in
chunks of experts (:func:`harness.entries.routed_experts.estimate_rank_in_chunks`).

Fixture (``case.dp`` groups of ``case.tokens`` rows, ``case.group_active(g)`` active):
``g{g}.x_hc`` FP32 ``[T, hc, D]`` (BF16 values), ``g{g}.pre_in`` FP32 ``[T, hc]`` (the
attention site's pre-mix), the FFN site's ``w.hc.{fn,scale,base}``, ``w.ffn_norm`` BF16,
``w.gate.{weight,bias}`` FP32, the shared expert ``w.shared.*`` (MXFP8) and the routed
experts ``w.routed.*`` (packed MXFP4, stacked ``[E, ...]``; constant broadcast placeholders
inside :func:`harness.fixtures.weight_placeholders`, for estimate-only runs).  Outputs ``x_hc_out`` FP32
``[dp, T, hc, D]``, ``pre_out`` FP32 ``[dp, T, hc]`` and ``moe_output`` BF16 ``[dp, T, D]`` (the
block output ``hc_post`` consumes), sentinel-filled; every row of every slab is written:
the mHC kernels run on inactive rows too, whose MoE output is exact zero.

Comparison, each rank's slab on its own (``g{g}.r{r}.``): ``x_hc_out``, ``pre_out`` and the
active rows of ``moe_output`` by the contract's per-row bound against the golden (no
acceptance rule: the router's selection must be the golden's), no sentinel left; the
inactive rows of ``moe_output`` exact zero.  ``moe_output`` is compared on its own because
in the streams an expert error sits under the residual lanes (2^-6 .. 2^6 row scales).
"""

from __future__ import annotations

import torch

from goldens.config import rank_slab
from goldens.forward import FfnSiteWeights, ffn_site
from goldens.mhc import HcSiteWeights, hc_pre
from goldens.moe import ExpertWeights, moe_block, quantize_routed_expert, quantize_shared_expert
from goldens.norm import rms_norm
from goldens.router import route
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel, check_zero_rows
from harness.entries import attention_kernels, routed_experts
from harness.entries.hc_pre import pre_mix, residual_lanes
from harness.ep_transport import EpGroup
from harness.fixtures import SENTINEL, STREAM_SENTINEL, placeholders_wanted, randn, sentinel, uniform
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes

_I32 = torch.int32
EXPERT_FIELDS = ExpertWeights._fields  # w1, w1_scale, w3, w3_scale, w2, w2_scale


# ---- fixture and golden ----------------------------------------------------------------------

def _experts(config, seed: int) -> tuple[ExpertWeights, list[ExpertWeights] | None]:
    """The shared expert and the routed experts, quantized by the golden's rules; inside
    :func:`harness.fixtures.weight_placeholders` the routed ones are None (placeholders)."""
    d, i, e = config.hidden_size, config.moe.intermediate_size, config.moe.n_routed_experts

    def three(tag):
        return (randn((i, d), seed, f"{tag}/w1", scale=d ** -0.5), randn((i, d), seed, f"{tag}/w3", scale=d ** -0.5),
                randn((d, i), seed, f"{tag}/w2", scale=i ** -0.5))
    routed = None if placeholders_wanted() else [quantize_routed_expert(*three(f"e{j}")) for j in range(e)]
    return quantize_shared_expert(*three("shared")), routed


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t


def build_inputs(config, case) -> dict:
    d, hc, T, e = config.hidden_size, config.hc.hc_mult, case.tokens, config.moe.n_routed_experts
    mix, hc_dim = config.mix_hc, config.hc_dim
    flat = {"w.hc.fn": randn((mix, hc_dim), case.seed, "ffn_fn", scale=hc_dim ** -0.5),
            "w.hc.scale": uniform((3,), case.seed, "ffn_scale", 0.5, 2.0),
            "w.hc.base": randn((mix,), case.seed, "ffn_base"),
            "w.ffn_norm": (1.0 + randn((d,), case.seed, "ffn_norm", scale=0.1)).to(torch.bfloat16),
            "w.gate.weight": randn((e, d), case.seed, "gate_weight", scale=d ** -0.5),
            "w.gate.bias": randn((e,), case.seed, "gate_bias", scale=0.5)}
    shared, routed = _experts(config, case.seed)
    placeholders = routed_experts.placeholder_weights(config) if routed is None else None
    for f in EXPERT_FIELDS:
        flat[f"w.shared.{f}"] = _u8(getattr(shared, f))
        flat[f"w.routed.{f}"] = (placeholders[f] if routed is None
                                 else torch.stack([_u8(getattr(x, f)) for x in routed]))
    for g in range(case.dp):
        gc = case.with_(seed=case.seed + 101 * g)
        flat[f"g{g}.x_hc"] = residual_lanes(config, gc, "ffn_x_hc")
        flat[f"g{g}.pre_in"] = pre_mix(config, gc, "ffn_pre_in")
    flat["x_hc_out"] = sentinel((case.dp, T, hc, d), torch.float32, STREAM_SENTINEL)
    flat["pre_out"] = sentinel((case.dp, T, hc), torch.float32)
    flat["moe_output"] = sentinel((case.dp, T, d))
    return flat


def site_weights(config, inputs) -> FfnSiteWeights:
    """The golden's view of the fixture's FFN site (shared payloads back to E4M3)."""
    def expert(prefix, j=None):
        ts = [inputs[f"{prefix}.{f}"] if j is None else inputs[f"{prefix}.{f}"][j] for f in EXPERT_FIELDS]
        if prefix == "w.shared":
            ts[0], ts[2], ts[4] = (t.view(torch.float8_e4m3fn) for t in (ts[0], ts[2], ts[4]))
        return ExpertWeights(*ts)
    routed = [expert("w.routed", j) for j in range(config.moe.n_routed_experts)]
    return FfnSiteWeights(HcSiteWeights(inputs["w.hc.fn"], inputs["w.hc.scale"], inputs["w.hc.base"]),
                          inputs["w.ffn_norm"], inputs["w.gate.weight"], inputs["w.gate.bias"],
                          expert("w.shared"), routed)


def moe_output(config, x_hc, pre, w: FfnSiteWeights, active: int) -> torch.Tensor:
    """BF16 ``[T, D]``: the MoE block output of the site (the ``y`` that
    :func:`goldens.forward.ffn_site` hands to ``hc_post``), zero on rows past ``active``."""
    x = rms_norm(hc_pre(x_hc, pre, config), w.norm, config.rms_norm_eps)
    y = torch.zeros(x.shape, dtype=torch.bfloat16)
    if active:
        idx, wts = route(x[:active], w.gate_weight, w.gate_bias, config)
        y[:active] = moe_block(x[:active], idx, wts, w.experts, w.shared, config)
    return y


def golden(config, case, inputs) -> dict:
    w = site_weights(config, inputs)
    outs = [ffn_site(config, inputs[f"g{g}.x_hc"], inputs[f"g{g}.pre_in"], w, case.group_active(g))
            for g in range(case.dp)]
    ys = [moe_output(config, inputs[f"g{g}.x_hc"], inputs[f"g{g}.pre_in"], w, case.group_active(g))
          for g in range(case.dp)]
    return {"x_hc_out": torch.stack([o[0] for o in outs]), "pre_out": torch.stack([o[1] for o in outs]),
            "moe_output": torch.stack(ys)}


def _slab(case, r: int) -> tuple[int, int]:
    """(first row, rows) of TP rank ``r``'s slab inside its group's ``T`` rows."""
    width = -(-case.tokens // case.tp)
    lo = min(r * width, case.tokens)
    return lo, min(width, case.tokens - lo)


def compare(config, case, inputs, gold, actual) -> list:
    verdicts = []
    d = config.hidden_size
    for name in ("x_hc_out", "pre_out", "moe_output"):
        if name not in actual:
            from harness.entries.attention import _missing
            return _missing(name)
    for g in range(case.dp):
        for r in range(case.tp):
            lo, m = _slab(case, r)
            if m == 0:
                continue
            rows, tag = slice(lo, lo + m), f"g{g}.r{r}"
            lanes = actual["x_hc_out"][g][rows].reshape(-1, d)
            ref = gold["x_hc_out"][g][rows].reshape(lanes.shape)
            verdicts += check_row_bound(f"{tag}.x_hc_out", lanes, ref)
            verdicts += check_sentinel(f"{tag}.x_hc_out", lanes, STREAM_SENTINEL, ref=ref)
            verdicts += check_row_bound(f"{tag}.pre_out", actual["pre_out"][g][rows], gold["pre_out"][g][rows])
            verdicts += check_sentinel(f"{tag}.pre_out", actual["pre_out"][g][rows], SENTINEL,
                                       ref=gold["pre_out"][g][rows])
            count = rank_slab(case.group_active(g), case.tp, r, case.tokens)[1]
            y, ref = actual["moe_output"][g], gold["moe_output"][g]
            if count:  # the MoE output itself: the streams alone would hide it under the residual
                act = slice(lo, lo + count)
                verdicts += check_row_bound(f"{tag}.moe_output", y[act], ref[act])
                verdicts += check_sentinel(f"{tag}.moe_output", y[act], SENTINEL, ref=ref[act])
            if m > count:
                verdicts += check_zero_rows(f"{tag}.moe_output", y, rows=slice(lo + count, lo + m))
    return verdicts


# ---- kernel SUT ------------------------------------------------------------------------------

def _local(inputs, rank: int, n_local: int) -> dict:
    """EP rank ``rank``'s routed expert weights, stacked ``[L, ...]`` (a view: no copy)."""
    return {f: inputs[f"w.routed.{f}"][rank * n_local:(rank + 1) * n_local] for f in EXPERT_FIELDS}


def check_ep_world(case) -> int:
    """``case.ep``, which must be ``dp * tp`` (the EP world is the DP groups x TP ranks);
    raises ValueError naming the field otherwise."""
    if case.ep != case.dp * case.tp:
        raise ValueError(f"case.ep: {case.ep} must equal dp * tp = {case.dp * case.tp} (the EP world "
                         f"is the DP groups x TP ranks)")
    return case.ep


def balanced_routes(config, count: int, first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An estimate-only run's routing (its router computed nothing): global row ``t``'s slot
    ``c`` goes to expert ``(t * k + c) mod E`` with weight ``1 / k``, every expert equally
    loaded; the estimate is the figure for that routing."""
    k, e = config.moe.num_experts_per_tok, config.moe.n_routed_experts
    rows = torch.arange(first_row, first_row + count)[:, None] * k + torch.arange(k)
    return (rows % e).to(_I32), torch.full((count, k), 1.0 / k)


def make_sut(variants: dict | None = None):
    """The SUT; ``variants`` maps a kernel module to a deliberately wrong variant of it (the
    tests' proof that the comparison catches a defect inside the composition)."""
    def run(platform, config, case, inputs) -> SutOutput:
        return kernel_sut(platform, config, case, inputs, variants or {})
    return run


def kernel_sut(platform, config, case, inputs, variants: dict | None = None) -> SutOutput:
    """The per-rank launches and host transports of the module doc, ``case.epochs`` times."""
    ep = check_ep_world(case)
    memo = attention_kernels.launch_memo(platform)
    launchers = [attention_kernels.RankLauncher(platform, config, rank, case.preset, memo=memo)
                 for rank in range(ep)]
    group = new_ep_group(config, case)  # its windows live across epochs
    outs = None
    for epoch in range(1, case.epochs + 1):
        outs = site_epoch(platform, config, case, inputs, launchers, group, epoch, variants)
    names = ("x_hc_out", "pre_out", "moe_output")
    for k in names:  # the caller's sentinel-filled buffers, every row written
        inputs[k].copy_(outs[k])
    records = [r for lc in launchers for r in lc.cost()]
    return SutOutput({k: inputs[k] for k in names}, records)


def new_ep_group(config, case) -> EpGroup:
    """The EP transport of ``case``'s world: one window per rank of ``ceil(T / tp)`` rows."""
    return EpGroup(check_ep_world(case), config.moe.n_routed_experts, config.moe.num_experts_per_tok,
                   -(-case.tokens // case.tp), config.hidden_size)


def site_epoch(platform, config, case, inputs, launchers, group: EpGroup, epoch: int,
               variants: dict | None = None) -> dict:
    """One epoch of the FFN site over every EP rank (``launchers[rank]``) through ``group``'s
    windows at ``epoch``: returns ``x_hc_out`` FP32 ``[dp, T, hc, D]``, ``pre_out`` FP32
    ``[dp, T, hc]`` and ``moe_output`` BF16 ``[dp, T, D]`` (rows of an empty slab zero)."""
    variants = variants or {}

    def opts(module):
        return {"variant": variants[module]} if module in variants else None
    tp, T, d, k = case.tp, case.tokens, config.hidden_size, config.moe.num_experts_per_tok
    ep = check_ep_world(case)
    n_local = config.moe.n_routed_experts // ep
    estimate_only = getattr(platform, "estimate_only", False)
    x_hc_out = torch.zeros(case.dp, T, config.hc.hc_mult, d)
    moe_out = torch.zeros(case.dp, T, d, dtype=torch.bfloat16)
    pre_out = torch.zeros(case.dp, T, config.hc.hc_mult)
    shared_w = {f: inputs[f"w.shared.{f}"] for f in EXPERT_FIELDS}
    kept = {}
    for rank in range(ep):  # phase 1: mHC pre, norm, router, shared expert, dispatch
        g, r = divmod(rank, tp)
        lo, m = _slab(case, r)
        count = rank_slab(case.group_active(g), tp, r, T)[1]
        launch = launchers[rank]
        if m == 0:
            group.publish_dispatch(rank, epoch, torch.zeros(0, d, dtype=torch.bfloat16),
                                   torch.zeros(0, k, dtype=_I32), torch.zeros(0, k))
            continue
        x_hc = inputs[f"g{g}.x_hc"][lo:lo + m].contiguous()
        mixes = launch("v41.hc_mixes", {"tokens": m},
                       {"x_hc": x_hc, "fn": inputs["w.hc.fn"], "scale": inputs["w.hc.scale"],
                        "base": inputs["w.hc.base"]})
        collapsed = launch("v41.hc_pre", {"tokens": m},
                           {"x_hc": x_hc, "pre": inputs[f"g{g}.pre_in"][lo:lo + m].contiguous()})["y"]
        x = launch("v41.rmsnorm", {"tokens": m}, {"x": collapsed, "weight": inputs["w.ffn_norm"]})["y"]
        n = torch.tensor([count], dtype=_I32)
        routes = launch("v41.gate", {"tokens": m},
                        {"x_norm": x, "gate_weight": inputs["w.gate.weight"],
                         "correction_bias": inputs["w.gate.bias"], "num_tokens": n})
        shared = launch("v41.shared_expert", {"tokens": m}, {"x": x, "num_tokens": n, **shared_w},
                        options=opts("v41.shared_expert"))["y"]
        idx, wts = routes["indices"][:count].contiguous(), routes["weights"][:count].contiguous()
        if estimate_only:  # nothing was computed: route as a balanced router would
            idx, wts = balanced_routes(config, count, g * T + lo)
        group.publish_dispatch(rank, epoch, x[:count].contiguous(), idx, wts)
        kept[rank] = (g, lo, m, count, x_hc, mixes, shared)
    for rank in range(ep):  # phase 2: each rank's local experts over what it received
        got = group.receive(rank, epoch)
        rows = got.x.shape[0]
        if rows == 0:
            group.publish_combine(rank, epoch, torch.zeros(0, d, dtype=torch.bfloat16))
            continue
        args = {"x": got.x, "route_weight": got.weights[:, None].contiguous(),
                "expert_offsets": got.expert_offsets, **_local(inputs, rank, n_local)}
        if routed_experts.split_rank(platform, config, case):  # a FLASH EP4 rank, estimate only
            routed_experts.estimate_rank_in_chunks(
                platform, config, case, rank, args,
                variants.get("v41.routed_experts", "reference"), launch=launchers[rank])
            y = torch.zeros(rows, d, dtype=torch.bfloat16)  # nothing computed
        else:
            y = launchers[rank]("v41.routed_experts", {"rows": rows, "ep": ep}, args,
                                validate=lambda a: routed_experts.validate_launch(config, a),
                                options=opts("v41.routed_experts"))["y"]
        group.publish_combine(rank, epoch, y)
    for rank, (g, lo, m, count, x_hc, mixes, shared) in kept.items():  # phase 3: combine, mHC post
        routed, _ = group.collect(rank, epoch)
        launch = launchers[rank]
        y = launch("v41.moe_combine", {"tokens": m},
                   {"routed": routed[:m].reshape(m, k * d).contiguous(), "shared": shared,
                    "num_tokens": torch.tensor([count], dtype=_I32)}, options=opts("v41.moe_combine"))["y"]
        out = launch("v41.hc_post", {"tokens": m},
                     {"y": y, "x_hc": x_hc, "post": mixes["post"], "comb": mixes["comb"]})["out"]
        x_hc_out[g, lo:lo + m] = out
        moe_out[g, lo:lo + m] = y
        pre_out[g, lo:lo + m] = mixes["pre"]
    return {"x_hc_out": x_hc_out, "pre_out": pre_out, "moe_output": moe_out}


def work(config, case, inputs) -> Work:
    """One EP rank's share (rank 0): its slab's mHC, norm, router and shared expert, its
    L experts' packed weights and their rows (the dispatch averages ``T * k / ep``
    rows per rank), the combine; FLOPs on the cube for the expert matmuls."""
    from harness.platforms.topology import CUBE_BF16, VECTOR_FP32
    d, i, k = config.hidden_size, config.moe.intermediate_size, config.moe.num_experts_per_tok
    ep, m = case.dp * case.tp, -(-case.tokens // case.tp)
    n_local = config.moe.n_routed_experts // ep
    local = _local(inputs, 0, n_local)
    shared = [inputs[f"w.shared.{f}"] for f in EXPERT_FIELDS]
    rows = -(-m * k * case.dp * case.tp // ep)
    streams = m * config.hc.hc_mult * d * 4
    nbytes = (tensor_bytes(*local.values(), *shared, inputs["w.gate.weight"]) + 2 * streams
              + 2 * rows * d * 2 + m * k * d * 2)
    cube = 2 * 3 * d * i * (m + rows)
    vector = 2 * config.moe.n_routed_experts * m + 10 * (m + rows) * i + 20 * m * config.hc.hc_mult * d
    return Work(nbytes, {CUBE_BF16: cube, VECTOR_FP32: vector})


# ---- entry -----------------------------------------------------------------------------------

SUPPORT = Support(phase="prefill", tp_sizes=(1, 2, 4), dp_sizes=(1, 2), ep_sizes=(2, 4, 8),
                  wirings=("sharded",), kinds=("mixed",), inactive_rows=True, ep_world=True)


def _matrix():
    """The contract's CI combinations by default, EP4 with TP2 (DP2, two epochs) and with TP4
    (DP1, an empty rank), reserved capacity in each; under ``slow`` EP2 TP1 DP2 with an idle
    group (``tests/platforms/test_a5sim_moe.py`` runs it by default) and the eight-card EP8
    TP4 DP2."""
    base = Case(entry="moe", tokens=9, requests=1, wiring="sharded")
    cases = (base.with_(ep=4, tp=2, dp=2, dp_tokens=(9, 5), epochs=2),
             base.with_(ep=4, tp=4, dp=1, active_tokens=7))
    slow = (base.with_(ep=2, tp=1, dp=2, dp_tokens=(6, 0)),
            base.with_(ep=8, tp=4, dp=2, dp_tokens=(8, 3)))
    # FLASH (384 experts) needs a fixture that streams experts instead of holding ~6.8 GB of
    # packed weights in the flat input dict: not built yet, so no FLASH case is claimed.
    return cases, slow


_cases, _slow = _matrix()
ENTRY = register(Entry(
    name="moe",
    description="MoE half of the Block: hc_mixes, collapse with the attention pre-mix, ffn_norm, gate, shared "
                "expert, EP dispatch, routed experts per rank, EP combine, moe_combine, hc_post (v41 kernels)",
    support=SUPPORT, matrix=_cases, slow_cases=_slow,
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": make_sut(), "a5": make_sut()}, work=work,
))
