"""``decode_layer_<mode>``: one decode Block on v41 kernels, the ``decode_<mode>`` attention
composition followed by the ``moe`` composition, with the attention site's pre-mix handed
to the FFN site and the FFN site's pre-mix returned for the next layer (golden:
``goldens.forward.attention_site`` then ``ffn_site``).

Sharded wiring only: the residual stream stays in each TP rank's slab across both sites,
and the EP world is the DP groups x TP ranks (``ep = dp * tp``; the MoE consumes the
sequence-parallel local rows directly, as the contract asks of a decode EP integration).
The attention half runs exactly as :mod:`harness.entries.decode_compose` (leaf kernels, mHC
kernels, TP transports); its new streams and pre-mix are the MoE half's inputs
(:mod:`harness.entries.moe`: router, shared expert, EP dispatch, routed experts, combine,
mHC post).  Inputs: the attention composition's fixture plus the FFN site's weights under
``ffn.`` (``ffn.w.hc.*``, ``ffn.w.gate.*``, ``ffn.w.shared.*``, ``ffn.w.routed.*``); outputs:
the attention composition's (``x_hc_out``, ``pre_out``, ``attention_output``, the leaf's)
and the FFN site's under ``ffn.`` (``ffn.x_hc_out``, ``ffn.pre_out``, ``ffn.moe_output``).

Comparison: the attention half as ``decode_<mode>`` compares it; the FFN half by the moe
entry's checks against the FFN golden REPLAYED on the SUT's own attention-site streams and
pre-mix (the contract's replay: an attention difference inside its budget is not charged
again to the MoE half).
"""

from __future__ import annotations

import dataclasses

from harness.case import Case, Support
from harness.entries import attention, decode_compose, moe
from harness.entries._kernel import sequential_cost
from harness.registry import Entry, SutOutput, Work

FFN = "ffn."
FFN_OUTPUTS = ("x_hc_out", "pre_out", "moe_output")


def _ffn_inputs(flat: dict, x_hc, pre) -> dict:
    """The moe entry's view: the FFN weights without their prefix, the attention site's
    streams ``x_hc [dp, T, hc, D]`` and pre-mix ``pre [dp, T, hc]`` as its group inputs."""
    out = {k[len(FFN):]: v for k, v in flat.items() if k.startswith(FFN)}
    for g in range(x_hc.shape[0]):
        out[f"g{g}.x_hc"], out[f"g{g}.pre_in"] = x_hc[g].clone(), pre[g].clone()
    return out


def build_inputs(config, case, layer: int) -> dict:
    flat = decode_compose.build_inputs(config, case, layer)
    for k, v in moe.build_inputs(config, case).items():
        if k.startswith("w.") or k in FFN_OUTPUTS:
            flat[FFN + k] = v
    return flat


def golden(config, case, inputs, layer: int) -> dict:
    gold = decode_compose.golden(config, case, inputs, layer)
    ffn = moe.golden(config, case, _ffn_inputs(inputs, gold["x_hc_out"], gold["pre_out"]))
    gold.update({FFN + k: v for k, v in ffn.items()})
    return gold


def compare(spec, config, case, inputs, gold, actual) -> list:
    verdicts = decode_compose.compare(spec, config, case, inputs, gold, actual)
    if "x_hc_out" not in actual or "pre_out" not in actual:
        return verdicts  # the attention half already named what is missing
    ffn_in = _ffn_inputs(inputs, actual["x_hc_out"], actual["pre_out"])
    replay = moe.golden(config, case, ffn_in)
    ffn_actual = {k: actual[FFN + k] for k in FFN_OUTPUTS if FFN + k in actual}
    return verdicts + [dataclasses.replace(v, output=FFN + v.output)
                       for v in moe.compare(config, case, ffn_in, replay, ffn_actual)]


def kernel_sut(layer: int):
    """The attention composition's launches, then the moe composition's on its outputs."""
    attention_sut = decode_compose.kernel_sut(layer)

    def run(platform, config, case, inputs) -> SutOutput:
        moe.check_ep_world(case)  # before any launch
        att = attention_sut(platform, config, case, inputs)
        ffn_in = _ffn_inputs(inputs, att.outputs["x_hc_out"], att.outputs["pre_out"])
        for k in FFN_OUTPUTS:
            ffn_in[k] = inputs[FFN + k]
        ffn = moe.kernel_sut(platform, config, case, ffn_in)
        outputs = {**att.outputs, **{FFN + k: v for k, v in ffn.outputs.items()}}
        return SutOutput(outputs, _merge_costs(att.costs, ffn.costs))
    return run


def _slowest(records: list) -> dict | None:
    timed = [r for r in records if r.get("aicore_e2e_us") is not None]
    return max(timed, key=lambda r: r["aicore_e2e_us"]) if timed else None


def _merge_costs(first: list, second: list) -> list:
    """One record: the slowest rank's attention half plus the slowest rank's MoE half (the
    EP dispatch waits for every rank's attention site, so the halves add on the critical
    path); both halves' records when either lacks an estimate."""
    a, f = _slowest(first), _slowest(second)
    if a is None or f is None:
        return list(first) + list(second)
    return [sequential_cost([{**a, "module": "attention site"}, {**f, "module": "moe site"}])]


def work(layer: int):
    def rate(config, case, inputs):
        a = decode_compose.work(layer)(config, case, inputs)
        f = moe.work(config, case, _ffn_inputs(inputs, inputs["x_hc_out"], inputs["pre_out"]))
        flops = dict(a.flops)
        for k, v in f.flops.items():
            flops[k] = flops.get(k, 0) + v
        return Work(a.bytes + f.bytes, flops)
    return rate


def _make(spec) -> Entry:
    name = f"decode_layer_{spec.mode.value}"
    support = Support(phase="decode", tp_sizes=(2, 4), dp_sizes=(1, 2), ep_sizes=(2, 4, 8),
                      wirings=("sharded",), kinds=decode_compose.KINDS, inactive_rows=True,
                      ep_world=True)
    base = Case(entry=name, tp=2, dp=1, ep=2, tokens=8, active_tokens=7, requests=3, wiring="sharded")
    # every Block case is slow: tests/platforms/test_a5sim_decode_layer.py runs SWA's first
    # one by default (with defects in either half), the cases only add the other modes
    cases = ()
    slow = (base,) + (
        base.with_(tp=4, ep=4, tokens=33, active_tokens=31, requests=6, epochs=2, kind="masked"),
        base.with_(tp=4, dp=2, ep=8, active_tokens=None, dp_tokens=(8, 5)))

    description = (f"decode Block, {spec.mode.value}: the decode_{spec.mode.value} composition then the moe "
                   f"composition (pre-mix handed over, sharded residual slabs, EP = DP x TP)")
    return decode_compose.register_mode_entry(spec, name, description, support, cases, slow, build_inputs,
                                              golden, compare, kernel_sut, work)


ENTRIES = {e.name: e for e in (_make(s) for s in attention.MODES)}
