"""Trace one output row of a decode attention case through its recorded v41 launches.

``python -m harness.trace_row DIR ENTRY --row R`` reads the launches a run of ``ENTRY``
(``decode_attn_<mode>`` or ``decode_<mode>``, one DP group, one epoch) saved with
``V41_RECORD_LAUNCHES=DIR`` (:mod:`harness.launch_record`; the case is the one the run wrote
into ``DIR/case.json``, case flags override it) and, per TP rank, compares each
stage's kernel output on row ``R`` with the golden piece run on THAT KERNEL'S OWN INPUT
(so a difference is charged to the stage that made it):

``x`` (the leaf input: the case's ``x``, or the golden ``x_norm`` of a composition),
``qr`` (``goldens.qkv.q_lora``), ``q`` (``q_proj_rope`` of the kernel's ``qr``), ``kv``
(``kv_proj_rope``), the window rows published (``publish_window_kv`` of the kernel's ``kv``),
the attention output (``sparse_attention`` over the keys the kernel's launch was handed)
and the FP32 partial (``o_proj_partial``).  For ``qr`` it also says which side of each
BF16 rounding tie of the row's Q-A projection the kernel and the golden took, against the
exact (FP64) projection: a one-ulp flip there moves the row's RMS and, through the MXFP8
quantizer before ``wq_b``, every query element of the row.

Last, the row-bound ratios of the kernel output (BF16 of the rank-order FP32 sum of the
recorded partials) against the golden output and against the golden run downstream of the
kernel's ``qr``.  The Top-K rows are the ones the kernel's attention launch was handed: the
selection itself is judged by the entry's Top-K checks, not here.  The tool reads records
and runs goldens; it launches no kernel.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch

from goldens.o_proj import o_proj_partial
from goldens.qkv import kv_proj_rope, q_lora, q_proj_rope, rms_norm_bf16
from goldens.quant import mxfp8_linear
from goldens.sparse_attention import concat_kv_parts, gather_compressed_kv, sparse_attention
from goldens.window_cache import gather_window_kv, publish_window_kv
from harness import launch_record
from harness.entries import qr_rounding
from harness.case import Case


@dataclass
class Stage:
    """One stage of one rank on the traced row: elements that differ from the golden piece
    on the kernel's own input, of how many, and their relative RMS and peak."""

    rank: int
    name: str
    differing: int
    elements: int
    rel_rms: float
    peak: float
    note: str = ""

    def line(self) -> str:
        text = (f"r{self.rank} {self.name:<10} {self.differing:>6}/{self.elements:<6} differ  "
                f"rel RMS {self.rel_rms:.3e}  peak {self.peak:.3e}")
        return text + (f"  {self.note}" if self.note else "")


def _stage(rank: int, name: str, actual: torch.Tensor, ref: torch.Tensor, note: str = "") -> Stage:
    a, r = actual.float().flatten(), ref.float().flatten()
    if a.shape != r.shape:
        raise ValueError(f"{name}: kernel row has {a.numel()} elements, golden {r.numel()}")
    d = a - r
    scale = float(r.pow(2).mean().sqrt())
    rms = float(d.pow(2).mean().sqrt())
    return Stage(rank, name, int((d != 0).sum()), d.numel(), rms / scale if scale else rms,
                 float(d.abs().max()) if d.numel() else 0.0, note)


def row_ratios(actual: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(RMS, peak) of ``actual - ref`` over the contract's per-row bounds
    ``1e-6 + 0.01*RMS(r)`` and ``1e-5 + 0.05*RMS(r)``: above 1 fails."""
    a, r = actual.float().flatten(), ref.float().flatten()
    rr = float(r.pow(2).mean().sqrt())
    d = a - r
    return float(d.pow(2).mean().sqrt()) / (1e-6 + 0.01 * rr), float(d.abs().max()) / (1e-5 + 0.05 * rr)


def qr_ties(x_row: torch.Tensor, qkv, kernel_qr: torch.Tensor, eps: float, top: int = 3) -> str:
    """Which roundings of the row's Q-A projection (``MX(x) @ wq_a^T`` to BF16, then RMSNorm
    to BF16: the ``q_lora`` boundaries) the kernel's and the golden's ``qr`` took, against
    the exact projection (FP64 group dots and sums, rounded once), and whether the entries'
    acceptance rule (:mod:`harness.entries.qr_rounding`) accepts the kernel's row."""
    exact, _ = qr_rounding.exact_projection(x_row, qkv.wq_a, qkv.wq_a_scale)
    _, _, nearest, tie = qr_rounding.bf16_bracket(exact)
    tie = tie / exact.abs().clamp_min(1e-300)
    exact_qr = rms_norm_bf16(nearest[None], qkv.q_norm, eps)[0]
    gold_qr = rms_norm_bf16(mxfp8_linear(x_row[None], qkv.wq_a, qkv.wq_a_scale), qkv.q_norm, eps)[0]
    near = [f"{int(j)} ({float(tie[j]):.1e})" for j in tie.argsort()[:top]]
    side = {True: "correctly rounded", False: "not correctly rounded"}
    accepted = qr_rounding.accept_row(x_row, qkv, eps, kernel_qr)
    return (f"kernel qr {side[torch.equal(kernel_qr, exact_qr)]}, golden qr {side[torch.equal(gold_qr, exact_qr)]}, "
            f"kernel qr {'accepted' if accepted else 'not accepted'} as a legitimate rounding "
            f"(exact projection's elements nearest a BF16 tie, relative distance: {', '.join(near)})")


def _cat(recs: list[dict], side: str, key: str) -> torch.Tensor:
    return torch.cat([r[side][key] for r in recs])


def _as(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == like.dtype else t.view(like.dtype)


def trace_rank(config, case, inputs, layer: int, x_ref: torch.Tensor, rank: int, row: int, where) -> dict:
    """Stages of ``rank`` on ``row`` (see the module doc) and the rank's partial row, both
    the kernel's and the golden's downstream of the kernel's ``qr``."""
    from harness.entries import attention_paths as paths
    recs = launch_record.load(where, rank)
    missing = [m for m in ("v41.rope_rows", "v41.qkv_proj_rope", "v41.window_publish",
                           "v41.sparse_attention", "v41.o_proj") if m not in recs]
    if missing:
        raise ValueError(f"{where}: rank {rank} has no record of {', '.join(missing)}")
    w, _, batch, caches, _ = paths.group_state(config, case, inputs, 0, layer)
    wl, hd = w.attn.shard(config, case.tp, rank), config.head_dim
    proj = recs["v41.qkv_proj_rope"]
    x, rc, rs = (_cat(proj, "args", k) for k in ("x", "rope_cos", "rope_sin"))
    q, kv, qr = (_cat(proj, "outs", k) for k in ("q", "kv", "qr"))
    n = x.shape[0]
    if not 0 <= row < n:
        raise ValueError(f"row: {row} is not an active row of the record (0..{n - 1})")
    stages = [_stage(rank, "x", x[row], x_ref[row])]
    stages.append(_stage(rank, "qr", qr[row], q_lora(x[row:row + 1], wl.qkv, config)[0],
                         qr_ties(x[row], wl.qkv, qr[row], config.rms_norm_eps)))
    q_gold = q_proj_rope(qr[row:row + 1], wl.qkv.wq_b, wl.qkv.wq_b_scale, rc[row:row + 1], rs[row:row + 1], config)
    stages.append(_stage(rank, "q", q[row], q_gold))
    stages.append(_stage(rank, "kv", kv[row], kv_proj_rope(x[row:row + 1], w.attn.qkv, rc[row:row + 1],
                                                             rs[row:row + 1], config)))
    pub = recs["v41.window_publish"][0]
    wc = caches.windows[layer]
    payload, scales = _as(pub["args"]["window_kv"], wc.payload).clone(), _as(pub["args"]["window_kv_scale"], wc.scales).clone()
    slots = pub["args"]["window_slots"]
    publish_window_kv(payload, scales, _as(pub["args"]["kv"], kv).reshape(n, -1), slots)
    slot = int(slots[row])
    if slot >= 0:
        kp = _as(pub["outs"]["window_kv"], wc.payload).reshape(-1, hd)[slot].view(torch.uint8)
        stages.append(_stage(rank, "window", kp.float(), payload.reshape(-1, hd)[slot].view(torch.uint8).float(),
                             f"slot {slot}: payload bytes"))
    att = recs["v41.sparse_attention"]
    shared = att[0]["args"]
    sc = caches.sources.get(config.layer_config(layer).kv_source)
    qa, idx, cidx = (_cat(att, "args", k) for k in ("q", "indices", "compressed_indices"))
    out = _cat(att, "outs", "out")
    win_payload, win_scales = _as(shared["window_kv"], wc.payload), _as(shared["window_kv_scale"], wc.scales)

    def attend(q_row: torch.Tensor) -> torch.Tensor:
        parts = [gather_window_kv(win_payload, win_scales, idx[row:row + 1])]
        if bool((cidx[row] >= 0).any()):
            cs = shared["compressed_kv_scale"]
            parts.append(gather_compressed_kv(shared["compressed_kv"], _as(cs, sc.compressed_kv_scale), cidx[row:row + 1]))
        keys, valid = concat_kv_parts(*parts)
        return sparse_attention(q_row.reshape(1, -1, hd), keys, valid, shared["attn_sink"])

    stages.append(_stage(rank, "attention", out[row], attend(qa[row])))
    op = recs["v41.o_proj"]
    attn_out, orc, ors = (_cat(op, "args", k) for k in ("attn_out", "rope_cos", "rope_sin"))
    part = _cat(op, "outs", "partial")

    def project(o_row: torch.Tensor) -> torch.Tensor:
        return o_proj_partial(o_row.reshape(1, -1, hd), orc[row:row + 1], ors[row:row + 1], wl.o, config)[0]

    stages.append(_stage(rank, "o_proj", part[row], project(attn_out[row])))
    downstream = project(attend(q_gold).reshape(-1))
    return {"stages": stages, "partial": part[row], "downstream": downstream}


def trace(where, case: Case, row: int) -> dict:
    """Every rank's stages on ``row`` and the output row-bound ratios (see the module doc)."""
    from harness import registry
    from harness.entries import decode_compose
    from harness.entries.attention_paths import small_shape_threads
    from harness.fixtures import clone_tensors
    mode = case.entry.removeprefix("decode_attn_").removeprefix("decode_")
    if not case.entry.startswith("decode_") or mode not in {s.mode.value for s in decode_compose.attention.MODES}:
        raise ValueError(f"entry: {case.entry} is not a decode attention leaf or composition")
    entry = registry.get(case.entry)
    if case.dp != 1 or case.epochs != 1:
        raise ValueError(f"dp, epochs: the trace reads one DP group and one epoch (got dp={case.dp}, "
                         f"epochs={case.epochs})")
    config = case.config
    layer = config.representative_layer(next(s.mode for s in decode_compose.attention.MODES
                                             if s.mode.value == mode))
    with small_shape_threads(config):
        inputs = entry.build_inputs(config, case)
        gold = entry.golden(config, case, clone_tensors(inputs))
        composed = "g0.x_norm" in gold
        x_ref = gold["g0.x_norm"] if composed else inputs["g0.x"]
        leaf_inputs = {**inputs, "g0.x": x_ref}
        ranks = launch_record.ranks(where)
        if ranks != list(range(case.tp)):
            raise ValueError(f"{where}: records of ranks {ranks}, the case has tp={case.tp}")
        per_rank = [trace_rank(config, case, leaf_inputs, layer, x_ref, r, row, where) for r in ranks]
    kernel_out = torch.zeros_like(per_rank[0]["partial"])
    downstream = torch.zeros_like(kernel_out)
    for res in per_rank:  # rank order, FP32, one cast: the transports' arithmetic
        kernel_out += res["partial"]
        downstream += res["downstream"]
    kernel_out, downstream = kernel_out.to(torch.bfloat16), downstream.to(torch.bfloat16)
    return {"stages": [s for res in per_rank for s in res["stages"]],
            "vs_golden": row_ratios(kernel_out, gold["out"][0][row]),
            "vs_golden_on_kernel_qr": row_ratios(kernel_out, downstream)}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness.trace_row", description=__doc__.split("\n")[0])
    ap.add_argument("records", help="the V41_RECORD_LAUNCHES directory of the run")
    ap.add_argument("entry", help="decode_attn_<mode> or decode_<mode>")
    ap.add_argument("--row", type=int, required=True, help="the output row to trace")
    for flag in ("tp", "tokens", "requests", "seed"):
        ap.add_argument(f"--{flag}", type=int, default=None)
    ap.add_argument("--active-tokens", dest="active_tokens", type=int, default=None)
    ap.add_argument("--case", dest="kind", default=None)
    ap.add_argument("--wiring", default=None, choices=("replicated", "sharded"))
    ap.add_argument("--preset", default=None, choices=("tiny", "flash"))
    ap.add_argument("--json", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    import harness.entries  # noqa: F401 - registers the entries
    args = build_parser().parse_args(argv)
    given = {k: getattr(args, k) for k in ("tp", "tokens", "requests", "seed", "active_tokens", "kind",
                                           "wiring", "preset") if getattr(args, k) is not None}
    held = launch_record.recorded_case(args.records) or {"entry": args.entry}
    if held["entry"] != args.entry:
        print(f"error: entry: {args.records} holds the records of {held['entry']}, not {args.entry}", file=sys.stderr)
        return 2
    held = {k: tuple(v) if isinstance(v, list) else v for k, v in held.items()}
    try:
        result = trace(args.records, Case(**held).with_(**given), args.row)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"stages": [s.__dict__ for s in result["stages"]],
                          "vs_golden": result["vs_golden"],
                          "vs_golden_on_kernel_qr": result["vs_golden_on_kernel_qr"]}, indent=1))
        return 0
    for s in result["stages"]:
        print(s.line())
    for key, label in (("vs_golden", "kernel out vs golden"),
                       ("vs_golden_on_kernel_qr", "kernel out vs golden downstream of the kernel's qr")):
        rms, peak = result[key]
        print(f"row {args.row}: {label}: {rms:.3f}x the row RMS bound, {peak:.3f}x the peak bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
