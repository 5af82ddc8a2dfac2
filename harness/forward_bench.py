"""``python -m harness.bench --forward``: the estimated A5 time of one decode step of the whole
model at a deployment (TP, DP, EP, tokens per DP group), from the cost model.

The step is the preset's layer schedule (``config.layer_config``) plus the model boundary.
Each distinct piece is estimated once, estimate-only (cost model, no interpreter, placeholder
expert weights), and multiplied by how often the step runs it:

* attention half-layer of each mode: ``decode_<mode>`` (the mHC composition, sharded wiring)
  at ``tokens`` rows, one TP group; its estimate is the slowest rank's;
* MoE half-layer: ``moe`` at ``tp``/``dp``/``ep`` with ``tokens`` rows per DP group (the
  slowest EP rank; an EP8 rank's routed experts in one launch); the same for every layer;
* boundary, once per step: ``input_pack``, ``hc_head`` and the final ``rmsnorm`` on one
  rank's ``ceil(tokens / tp)`` residual rows, and ``lm_head`` (one TP rank's vocabulary
  shard over all ``tokens`` rows).

The step's roofline is the same sum over the pieces' rooflines (``harness.bench.roofline``),
so ``step / roofline`` is judged like a kernel's ratio.  ``--rows FILE`` takes pieces
already estimated (a FLASH scan's per-entry ``--json`` output) instead of running them again.  Collectives are not timed by the
cost model; their bytes per rank per layer are listed: the attention half-layer's
sequence-parallel all-gather and reduce-scatter (``harness.capacity.boundary_traffic``,
publish + read), and the EP dispatch and combine of the MoE half-layer for an average rank,
publish + read: ``ceil(T/tp) * k`` rows each way, BF16 hidden rows plus the INT32 expert id
and FP32 route weight of each dispatched row, i.e. ``ceil(T/tp) * k * (8*D + 16)``.
Nothing here imports pypto.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

from goldens.config import V41Config, preset as preset_config
from harness import registry
from harness.bench import bench_cases
from harness.capacity import boundary_traffic
from harness.case import Case, CaseError, validate_case

BOUNDARY = ("input_pack", "hc_head", "rmsnorm", "lm_head")


@dataclass(frozen=True)
class Deployment:
    preset: str = "flash"
    tokens: int = 192  # decode rows per DP group
    tp: int = 4
    dp: int = 2
    ep: int = 8


def check(dep: Deployment) -> str | None:
    """Why ``dep`` cannot be estimated (names the field and the bound), else None."""
    config = preset_config(dep.preset)
    for field in ("tokens", "tp", "dp", "ep"):
        value = getattr(dep, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"--{field}: must be an integer >= 1, got {value!r}"
    if dep.tokens > config.cache.decode_max_tokens:
        return (f"--tokens: {dep.tokens} decode rows per DP group exceed the "
                f"{config.cache.decode_max_tokens} of {dep.preset}")
    if dep.ep != dep.tp * dep.dp:
        return f"--ep: {dep.ep} must equal tp * dp = {dep.tp * dep.dp} (the EP world)"
    if config.moe.n_routed_experts % dep.ep:
        return f"--ep: {dep.ep} does not divide {config.moe.n_routed_experts} experts"
    for key, case in step_cases(dep).items():
        try:
            validate_case(case, registry.get(case.entry).support)
        except CaseError as err:
            return f"{key} ({case.case_id}): {err}"
    return None


def layer_counts(config: V41Config) -> dict[str, int]:
    """Layers per attention mode, in schedule order of first appearance."""
    counts = Counter(config.layer_config(i).mode.value for i in range(config.num_layers))
    return dict(counts)


def step_cases(dep: Deployment) -> dict[str, Case]:
    """The distinct cases of one step, keyed ``attention:<mode>``, ``moe`` and the boundary
    entry names."""
    config = preset_config(dep.preset)
    t_local = math.ceil(dep.tokens / dep.tp)
    cases = {}
    for mode in layer_counts(config):
        base = bench_cases([f"decode_{mode}"], dep.preset, None)[0]  # its first case of the preset
        cases[f"attention:{mode}"] = replace(
            base, tokens=dep.tokens, active_tokens=None, tp=dep.tp, dp=1, ep=None,
            requests=min(base.requests, dep.tokens), wiring="sharded", kind="mixed",
            epochs=1)
    cases["moe"] = Case(entry="moe", tokens=dep.tokens, tp=dep.tp, dp=dep.dp, ep=dep.ep,
                        requests=1, wiring="sharded", preset=dep.preset)
    for name in BOUNDARY:
        rows, tp = (dep.tokens, dep.tp) if name == "lm_head" else (t_local, 1)
        cases[name] = Case(entry=name, tokens=rows, tp=tp, preset=dep.preset)
    return cases


def saved_pieces(paths: list[str], topo: dict) -> dict[str, dict]:
    """Case id -> bench row of the estimated rows in ``paths`` (``harness.bench --json``
    output); raises ValueError for a file that is not bench rows or a row estimated on
    another simulated topology (its figure would not add up with this run's)."""
    from harness.bench_baseline import SAVABLE, TOPOLOGY_KEYS
    from harness.bench_merge import MergeError, read_rows

    try:
        rows = read_rows(paths)
    except MergeError as err:
        raise ValueError(str(err)) from None
    out = {}
    for row in rows:
        theirs = {k: row["topology"].get(k) for k in TOPOLOGY_KEYS}
        if theirs != {k: topo[k] for k in TOPOLOGY_KEYS}:
            raise ValueError(f"{row['case']}: estimated on {theirs}, this run simulates "
                             f"{ {k: topo[k] for k in TOPOLOGY_KEYS} }")
        if row["status"] in SAVABLE and row.get("estimated_us") is not None:
            out[row["case"]] = row
    return out


def collective_bytes(config: V41Config, dep: Deployment) -> dict[str, int]:
    """Bytes per rank per layer (publish + read): attention SP traffic and EP traffic."""
    t_local = math.ceil(dep.tokens / dep.tp)
    k, d = config.moe.num_experts_per_tok, config.hidden_size
    ep = 0 if dep.ep == 1 else t_local * k * (8 * d + 16)
    return {"attention": boundary_traffic(config, dep.tokens, dep.tp)["sequence_parallel"],
            "moe": ep}


def summarize(dep: Deployment, rows: dict[str, dict]) -> dict:
    """The step from each piece's bench row (``harness.bench.bench_row``: ``estimated_us``
    and ``roofline_us``); raises ValueError naming a piece without an estimate."""
    config = preset_config(dep.preset)
    missing = [k for k in step_cases(dep) if rows.get(k, {}).get("estimated_us") is None]
    if missing:
        raise ValueError(f"no estimate for {', '.join(missing)}: the step is not summed")
    coll = collective_bytes(config, dep)
    moe, layers = rows["moe"], []
    for mode, n in layer_counts(config).items():
        attn = rows[f"attention:{mode}"]
        layers.append({"mode": mode, "layers": n, "attention_us": attn["estimated_us"],
                       "moe_us": moe["estimated_us"],
                       "layer_us": attn["estimated_us"] + moe["estimated_us"],
                       "roofline_us": attn["roofline_us"] + moe["roofline_us"],
                       "collective_bytes": coll["attention"] + coll["moe"]})
    boundary = [{"entry": k, "estimated_us": rows[k]["estimated_us"],
                 "roofline_us": rows[k]["roofline_us"]} for k in BOUNDARY]
    step_us = (sum(x["layers"] * x["layer_us"] for x in layers)
               + sum(b["estimated_us"] for b in boundary))
    roof_us = (sum(x["layers"] * x["roofline_us"] for x in layers)
               + sum(b["roofline_us"] for b in boundary))
    return {"deployment": vars(dep).copy(), "layers": layers, "boundary": boundary,
            "collective_bytes_per_layer": coll,
            "collective_bytes_per_step": sum(x["layers"] for x in layers) * sum(coll.values()),
            "step_us": step_us, "roofline_us": roof_us, "ratio": step_us / roof_us,
            "tokens_per_s_per_dp_group": dep.tokens / (step_us * 1e-6)}


def print_step(step: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=160)
    d = step["deployment"]
    table = Table(title=f"One {d['preset'].upper()} decode step, T={d['tokens']} per DP group, "
                        f"TP{d['tp']} DP{d['dp']} EP{d['ep']} (cost-model estimate, slowest rank)")
    for col in ("mode", "layers", "attention us", "MoE us", "layers x us", "roofline us",
                "collectives MB/rank/layer"):
        table.add_column(col)
    for x in step["layers"]:
        table.add_row(x["mode"], str(x["layers"]), f"{x['attention_us']:,.1f}",
                      f"{x['moe_us']:,.1f}", f"{x['layers'] * x['layer_us']:,.1f}",
                      f"{x['layers'] * x['roofline_us']:,.1f}",
                      f"{x['collective_bytes'] / 1e6:.2f}")
    for b in step["boundary"]:
        table.add_row(b["entry"], "-", "-", "-", f"{b['estimated_us']:,.1f}",
                      f"{b['roofline_us']:,.1f}", "-")
    console.print(table)
    console.print(f"step {step['step_us']:,.1f} us estimated, roofline {step['roofline_us']:,.1f} "
                  f"us ({step['ratio']:.1f}x); {step['tokens_per_s_per_dp_group']:,.0f} tokens/s "
                  f"per DP group; collectives {step['collective_bytes_per_step'] / 1e6:,.1f} MB "
                  f"per rank per step (not timed)")
