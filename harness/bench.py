"""``python -m harness.bench``: estimated A5 time per kernel and shape, next to a roofline.

Each kernel case runs through the harness (so only a validated kernel is timed); the
cost model's AICore end-to-end estimate is deterministic, unlike wall time on these
shared machines.  The simulated machine (core counts, the clock cycles are converted at)
comes from :mod:`harness.platforms.topology`, and every table and JSON row carries it.

Roofline = ``max(memory, compute)`` with
- memory = the bytes the entry's ``work`` declares (gathered rows per gather, tables only
  for the rows read, outputs for the rows written) / HBM bandwidth;
- compute = ``max(cube, vector)``: cube = sum over cube dtypes of FLOPs / that dtype's
  peak (BF16, FP8, FP32 share the cube), vector = FP32 elementwise FLOPs / vector peak.
HBM bandwidth and peaks are the platform file's (``Ascend950PR_9579.ini``): HBM = cube
cores x ``ddr_rate`` x ``cube_freq``; a cube dtype's peak = cube cores x m*k*n of its
``[DtypeMKN]`` fractal x 2 x ``cube_freq``; vector FP32 = vector cores x
``vector_reg_width``/4 lanes x ``vec_freq``.  ``bound`` names the larger term.

``--json`` prints one JSON object per case (one per line) instead of the table.
``--estimate-only`` runs each case's launches through the cost model alone (a5sim's
``cost`` level: compiled, not interpreted): the estimate is the same figure a validated run
reports (``tests/platforms/test_a5sim_estimate_only.py`` checks rmsnorm, window_publish and
sparse_attention at TINY; the decode leaves and compositions were compared case by case),
at a fraction of the interpreter's time and memory, so FLASH shapes the interpreter cannot
afford still get a figure.  Its rows say ``status: estimate`` and ``verify_level: cost``:
nothing was computed or compared in that run.  Its fixtures give the routed experts as
constant placeholders of the right shapes (:func:`harness.fixtures.weight_placeholders`;
384 FLASH experts would take ~45 min to quantize and 5.8 GB per copy): the estimate reads
shapes and integer metadata only (``tests/platforms/test_a5sim_estimate_only.py`` checks
the TINY ``moe`` and ``routed_experts`` figures are the same with real weights).
``--plot FILE`` (.png or .svg, needs matplotlib) also draws these rows as a roofline chart
(:mod:`harness.plots.roofline`).

``--order-audit`` keeps each case's task graphs in a temporary directory and audits them
(:mod:`harness.order_audit`: every reader of a tensor written in an earlier loop iteration
or piece waits for every writer), then deletes them; the row's ``order`` says ``ordered``
or names the first unordered launch, and an unordered case fails the run: an estimate
whose readers start before their writers end is not a figure to judge.

``--forward [--tokens T --tp --dp --ep]`` estimates one decode step of the whole model instead
(:mod:`harness.forward_bench`: each distinct piece once, times its count in the schedule).

Each row also carries the slowest rank's ``compile_s`` (pypto's compile, timed in the
worker, summed over the rank's launches), ``compile_cpu_s`` (the same compile in the worker
process's CPU seconds, all threads: on a loaded machine the figure to compare) and
``tasks`` (the cost model's task count):
``--tokens 4 --tokens 48 --tokens 192`` shows how both grow with the token count.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass, replace

from harness import registry
from harness.case import Case
from harness.platforms import topology
from harness.registry import Work

PLATFORM = "a5sim"


@dataclass(frozen=True)
class Roofline:
    """Lower bound of one case in microseconds and which resource sets it."""

    memory_us: float
    compute_us: float

    @property
    def us(self) -> float:
        return max(self.memory_us, self.compute_us)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_us >= self.compute_us else "compute"


def roofline(work: Work, plat: topology.PlatformFile) -> Roofline:
    """The roofline of ``work`` on the platform file's machine; raises ValueError naming a
    FLOP dtype that is unknown or that the platform's cube does not support."""
    peaks = plat.peaks
    for dtype in work.flops:
        if dtype not in topology.COMPUTE_DTYPES:
            raise ValueError(f"work.flops: dtype {dtype!r} is not one of "
                             f"{topology.COMPUTE_DTYPES}")
        if dtype not in peaks:
            raise ValueError(f"work.flops: {plat.soc} has no {dtype!r} peak in {plat.path}")
    cube = sum(n / peaks[d] for d, n in work.flops.items() if d in topology.CUBE_DTYPES)
    vector = work.flops.get(topology.VECTOR_FP32, 0) / peaks[topology.VECTOR_FP32]
    return Roofline(work.bytes / plat.hbm_bytes_per_s * 1e6, max(cube, vector) * 1e6)


def case_work(entry, case: Case) -> Work:
    """The declared work of ``case`` (its fixture built as the run builds it)."""
    if entry.work is None:
        raise ValueError(f"entry {entry.name!r}: declares no work (bytes, FLOPs)")
    return entry.work(case.config, case, entry.build_inputs(case.config, case))


def check_names(names: list[str]) -> str | None:
    """None if every name is a registered entry with an a5sim kernel, else the message:
    'not registered' with close matches, or 'no kernel yet'."""
    known = registry.entries()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
            kernels = ", ".join(n for n, e in known.items() if PLATFORM in e.kernels)
            hint = f"did you mean {', '.join(close)}?" if close else f"kernel entries: {kernels}"
            return f"bench: entry {name!r} is not registered; {hint}"
        if PLATFORM not in known[name].kernels:
            return (f"bench: entry {name!r} has no kernel yet (no {PLATFORM} kernel; its "
                    f"golden-alt path is not timed)")
    return None


def bench_cases(names: list[str], preset: str | None, tokens: list[int] | None) -> list[Case]:
    cases = []
    for name, entry in registry.entries().items():
        if (names and name not in names) or PLATFORM not in entry.kernels:
            continue
        pool = list(entry.matrix) + list(entry.slow_cases)
        if preset:
            pool = [c for c in pool if c.preset == preset] or [replace(pool[0], preset=preset)]
        if tokens:
            # the first case's other axes, with requests refitted to the new token count
            pool = [replace(pool[0], tokens=t, active_tokens=None,
                            requests=min(pool[0].requests, t)) for t in tokens]
        seen = set()
        for c in pool:
            key = (c.preset, c.tokens, c.tp, c.dp, c.ep, c.wiring)
            if key not in seen:
                seen.add(key)
                cases.append(c)
    return cases


def bench_row(case: Case, result, work: Work, plat: topology.PlatformFile, topo: dict) -> dict:
    """One case's JSON record: ratio = estimated / roofline, bound = the larger term."""
    roof = roofline(work, plat)
    est = result.estimated_a5_us()
    cycles = max((c.get("total_cycles") or 0 for c in result.costs), default=None)
    compile_s = [c["compile_s"] for c in result.costs if c.get("compile_s") is not None]
    compile_cpu = [c["compile_cpu_s"] for c in result.costs
                   if c.get("compile_cpu_s") is not None]
    tasks = [c["tasks"] for c in result.costs if c.get("tasks") is not None]
    return {"entry": case.entry, "case": case.case_id, "preset": case.preset,
            "tokens": case.tokens, "tp": case.tp, "status": result.status,
            "estimated_us": est, "total_cycles": cycles or None,
            "roofline_us": roof.us, "memory_us": roof.memory_us, "compute_us": roof.compute_us,
            "ratio": est / roof.us if est is not None and roof.us > 0 else None,
            "bytes": work.bytes, "flops": dict(work.flops), "bound": roof.bound,
            "verify_level": getattr(result, "verify_level", None),
            "wall_s": round(result.seconds, 2), "topology": topo,
            # the slowest rank's: pypto compile seconds and cost-model tasks
            "compile_s": round(max(compile_s), 2) if compile_s else None,
            "compile_cpu_s": round(max(compile_cpu), 2) if compile_cpu else None,
            "tasks": max(tasks) if tasks else None,
            "reason": short_reason(result.reason)}


def short_reason(reason: str) -> str | None:
    """The line of a failure ``reason`` a reader acts on: the last ``...Error: ...`` line
    of a traceback (else the first line), plus its ``(log: ...)`` pointer if any."""
    lines = [ln.strip() for ln in (reason or "").splitlines() if ln.strip()]
    if not lines:
        return None
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", ln)]
    short = errors[-1] if errors else lines[0]
    after = lines[lines.index(short) + 1:lines.index(short) + 2] if errors else []
    if after and not re.match(r"^(lib|File |\(log:|Traceback|During )", after[0]):
        short = f"{short} {after[0]}"  # e.g. pypto's "Run pass failed., func ..."
    logs = [ln for ln in lines if ln.startswith("(log:")]
    return f"{short} {logs[-1]}" if logs else short


def _compile_cell(row: dict) -> str:
    """``wall (cpu)`` compile seconds, ``-`` where not measured."""
    if row.get("compile_s") is None:
        return "-"
    cpu = row.get("compile_cpu_s")
    return f"{row['compile_s']:.1f}" + (f" ({cpu:.1f})" if cpu is not None else "")


def _topology_record() -> dict:
    d = topology.describe()
    return {k: d[k] for k in ("cube_cores", "vector_cores", "clock_mhz", "mismatches")}


def _print_table(rows: list[dict], plat: topology.PlatformFile, topo_line: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Estimated A5 time (cost model) vs roofline", caption=topo_line)
    for col in ("entry", "preset", "tokens", "tp", "est. A5 us", "total cycles", "roofline us",
                "est/roofline", "bound", "MB moved", "GFLOP (dtype)", "verify", "compile s (cpu)",
                "tasks", "wall s", "verdict"):
        table.add_column(col)
    for r in rows:
        flops = ", ".join(f"{n / 1e9:.3g} {d}" for d, n in r["flops"].items() if n) or "0"
        table.add_row(r["entry"], r["preset"], str(r["tokens"]), str(r["tp"]),
                      f"{r['estimated_us']:.2f}" if r["estimated_us"] is not None else "-",
                      str(r["total_cycles"] or "-"), f"{r['roofline_us']:.3f}",
                      f"{r['ratio']:.1f}x" if r["ratio"] is not None else "-", r["bound"],
                      f"{r['bytes'] / 1e6:.3f}", flops, str(r["verify_level"] or "-"),
                      _compile_cell(r),
                      str(r.get("tasks") or "-"), f"{r['wall_s']:.1f}", r["status"])
    con = Console()
    con = con if con.is_terminal else Console(width=220)
    con.print(table)
    peaks = ", ".join(f"{d} {p / 1e12:.1f}" for d, p in plat.peaks.items())
    con.print(f"Roofline figures ({plat.soc} platform file): HBM {plat.hbm_bytes_per_s / 1e12:.2f} "
              f"TB/s, peaks TFLOP/s: {peaks}.  Estimates are the cost model's AICore "
              f"end-to-end time, deterministic run to run.", highlight=False)
    if any(r["verify_level"] == "cost" for r in rows):
        con.print("verify 'cost': estimate-only rows (cost model alone); their outputs were "
                  "not computed or compared in this run.", highlight=False)


def _fixture_mode(estimate_only: bool):
    """Estimate-only runs build fixtures with placeholder expert weights (see
    :func:`harness.fixtures.weight_placeholders`); validated runs build the real ones."""
    import contextlib

    from harness.fixtures import weight_placeholders
    return weight_placeholders() if estimate_only else contextlib.nullcontext()


def _run(case: Case, estimate_only: bool):
    """The case's result: validated (``run_case``), or on an estimate-only a5sim platform."""
    from harness.runner import run_case

    if not estimate_only:
        return run_case(case)
    from harness.platforms.a5sim import A5SimPlatform
    from harness.platforms.verify import ESTIMATE_LEVEL

    platform = A5SimPlatform(verify=ESTIMATE_LEVEL)
    try:
        return run_case(case, platform=platform)
    finally:
        platform.close()


def _audited_run(case: Case, estimate_only: bool):
    """:func:`_run` with the case's launches kept in a temporary directory, their task
    graphs audited (:func:`harness.order_audit.verdict`) and the directory deleted:
    ``(result, verdict)``."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from harness.order_audit import verdict
    from harness.platforms.pypto_env import ENV_KEEP, ENV_RUN_DIR

    root = tempfile.mkdtemp(prefix="v41-order-")
    saved = {k: os.environ.get(k) for k in (ENV_RUN_DIR, ENV_KEEP)}
    os.environ.update({ENV_RUN_DIR: root, ENV_KEEP: "1"})
    try:
        result = _run(case, estimate_only)
        return result, verdict(Path(root))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("entries", nargs="*", help="entry names (default: every kernel entry)")
    ap.add_argument("--preset", choices=("tiny", "flash"), default=None)
    ap.add_argument("--tokens", type=int, action="append", default=None)
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object per case instead of the table")
    ap.add_argument("--estimate-only", action="store_true",
                    help="cost model only (no interpreter, outputs not computed or compared): "
                         "estimates for shapes too large to interpret")
    ap.add_argument("--plot", metavar="FILE", default=None,
                    help="also draw the roofline chart of these rows into FILE (.png or .svg)")
    ap.add_argument("--gate", action="store_true",
                    help="the first TINY case of each named entry; without names the CI set "
                         "(every building block, one decode composition per attention family)")
    ap.add_argument("--forward", action="store_true",
                    help="one decode step of the whole model at --tp/--dp/--ep and --tokens "
                         "rows per DP group (cost model; harness.forward_bench)")
    ap.add_argument("--rows", metavar="FILE", action="append", default=None,
                    help="with --forward: take a piece whose case id is in these `--json` "
                         "outputs from them instead of estimating it again")
    for axis, default in (("tp", 4), ("dp", 2), ("ep", 8)):
        ap.add_argument(f"--{axis}", type=int, default=None,
                        help=f"with --forward (default {default})")
    ap.add_argument("--order-audit", action="store_true",
                    help="keep each case's task graphs and audit them (harness.order_audit): "
                         "a case whose readers do not wait for every writer fails")
    base = ap.add_mutually_exclusive_group()
    base.add_argument("--save-baseline", metavar="FILE", default=None,
                      help="write these cases' estimates to FILE (JSON baseline)")
    base.add_argument("--check", metavar="FILE", default=None,
                      help="fail (exit 1) when a case's estimate is > 5 %% above FILE's")
    args = ap.parse_args(argv)
    if args.forward or args.rows or any(v is not None for v in (args.tp, args.dp, args.ep)):
        return _forward(args)
    from harness import bench_baseline as bb
    flag_problem = (bb.refuse_gate_flags(args.gate, args.preset, args.tokens)
                    or (args.save_baseline and bb.check_save_path(args.save_baseline)))
    if flag_problem:
        print(flag_problem, file=sys.stderr)
        return 2
    try:
        baseline = bb.load_baseline(args.check) if args.check else None
    except bb.BaselineError as err:
        print(f"bench: {err}", file=sys.stderr)
        return 2
    if args.plot is not None:
        from harness.plots import PlotError, check_image_path, require_matplotlib
        try:
            check_image_path(args.plot)
            require_matplotlib()
        except PlotError as err:
            print(f"bench: {err}", file=sys.stderr)
            return 2
    bad_tokens = [t for t in args.tokens or () if t < 1]
    if bad_tokens:
        print(f"bench: --tokens {bad_tokens[0]} must be >= 1", file=sys.stderr)
        return 2
    problem = check_names(args.entries)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    cases = (bb.gate_cases(args.entries) if args.gate
             else bench_cases(args.entries, args.preset, args.tokens))
    if not cases:
        print("bench: no kernel entry matches", file=sys.stderr)
        return 2
    plat = topology.read_platform()
    topo = _topology_record()
    sel = bb.selection(args.preset, args.tokens, args.gate)
    mismatch = baseline and bb.comparable(baseline, sel, topo, bb.pypto_version())
    if mismatch:
        print(mismatch, file=sys.stderr)
        return 1
    rows, bad = [], 0
    for case in cases:
        entry = registry.get(case.entry)
        try:
            with _fixture_mode(args.estimate_only):
                work = case_work(entry, case)
        except (ValueError, RuntimeError) as err:  # e.g. a --tokens its fixture cannot build
            print(f"{case.case_id}: not run: {type(err).__name__}: {err}", file=sys.stderr)
            bad += 1
            continue
        roofline(work, plat)  # a bad declaration fails before the run
        order = None
        with _fixture_mode(args.estimate_only):
            if args.order_audit:
                r, order = _audited_run(case, args.estimate_only)
            else:
                r = _run(case, args.estimate_only)
        bad += r.status != ("estimate" if args.estimate_only else "pass")
        bad += order not in (None, "ordered")
        rows.append(dict(bench_row(case, r, work, plat, topo), order=order))
        if args.json:
            print(json.dumps(rows[-1]), flush=True)
    if not args.json:
        _print_table(rows, plat, topology.summary())
        for row in rows:
            if row["reason"]:
                print(f"{row['case']}: {row['status']}: {row['reason']}")
            if row["order"] not in (None, "ordered"):
                print(f"{row['case']}: order: {row['order']}")
    if args.plot is not None:
        from harness.plots.roofline import write_roofline
        path, data = write_roofline(rows, args.plot, plat.hbm_bytes_per_s, plat.peaks)
        left = f"; not on it: {', '.join(data['left_off'])}" if data["left_off"] else ""
        print(f"roofline chart: {path} ({len(data['points'])} cases{left})",
              file=sys.stderr if args.json else sys.stdout)
    if args.save_baseline:
        refused = bb.save_baseline(args.save_baseline, rows, sel, bb.pypto_version())
        print(refused or f"baseline: {args.save_baseline} ({len(rows)} cases)", file=sys.stderr)
        bad += refused is not None
    if baseline:
        from rich.console import Console
        lines = bb.check_rows(baseline, rows, args.entries)
        bb.report(lines, args.check, Console(stderr=args.json, width=200))
        bad += bb.failed(lines)
    return 1 if bad else 0


def _forward(args) -> int:
    """``--forward``: every distinct piece of one decode step estimated once, then summed by
    :mod:`harness.forward_bench`; one progress line per piece on stderr."""
    from harness import forward_bench as fb

    if not args.forward:
        return _refuse("bench: --tp/--dp/--ep and --rows are options of --forward")
    clash = [flag for flag, on in (("entry names", args.entries), ("--gate", args.gate),
                                   ("--plot", args.plot), ("--save-baseline", args.save_baseline),
                                   ("--check", args.check)) if on]
    if clash:
        return _refuse(f"bench: --forward takes no {clash[0]}")
    if args.tokens and len(args.tokens) > 1:
        return _refuse("bench: --forward takes one --tokens (rows per DP group)")
    given = {"tokens": args.tokens[0] if args.tokens else None,
             "tp": args.tp, "dp": args.dp, "ep": args.ep}  # 0 is refused, not defaulted
    dep = fb.Deployment(preset=args.preset or "flash",
                        **{k: v for k, v in given.items() if v is not None})
    problem = fb.check(dep)
    if problem:
        return _refuse(f"bench: {problem}")
    plat, topo, rows = topology.read_platform(), _topology_record(), {}
    try:
        saved = fb.saved_pieces(args.rows or [], topo)
    except ValueError as err:
        return _refuse(f"bench: --rows: {err}")
    for key, case in fb.step_cases(dep).items():
        if case.case_id in saved:
            rows[key] = saved[case.case_id]
            print(f"{key}: {case.case_id}: {rows[key]['estimated_us']} us (from --rows)",
                  file=sys.stderr, flush=True)
            continue
        entry = registry.get(case.entry)
        with _fixture_mode(True):
            work = case_work(entry, case)
            r = _run(case, True)
        rows[key] = bench_row(case, r, work, plat, topo)
        print(f"{key}: {case.case_id}: {rows[key]['status']} {rows[key]['estimated_us']} us "
              f"(wall {rows[key]['wall_s']} s){'' if r.status == 'estimate' else f'; {r.reason}'}",
              file=sys.stderr, flush=True)
    try:
        step = fb.summarize(dep, rows)
    except ValueError as err:
        return _refuse(f"bench: --forward: {err}", code=1)
    step["pieces"] = rows
    if args.json:
        print(json.dumps(step))
    else:
        fb.print_step(step)
    return 0


def _refuse(message: str, code: int = 2) -> int:
    print(message, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
