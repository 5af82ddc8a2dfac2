"""``python -m harness run <entry> [flags]`` and ``python -m harness run --all``.

Flags follow the reference entry CLIs where they apply: ``-p/--platform``, ``-d/--device``,
``--tp --dp --ep --tokens --active-tokens --dp-tokens N,N,.. --requests --case --seed
--epochs --wiring --preset --save-data [DIR] --plot``.  ``run ENTRY`` runs that entry's default matrix and
``--all`` every entry's (axis flags filter it; for one entry, explicit values no matrix
case has build the case from its first matrix case).  Writes a JSON summary (default
``out/summary.json``).  Exit status 2 for a refused invocation (before any work); 1 on any
failure or error, when nothing passed, or when a kernel case skipped (its platform
unavailable) without ``--allow-skip``; 0 otherwise.  ``list [--json]`` lists the entries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from harness import registry
from harness.case import Case, CaseError, validate_axis_values

AXIS_FLAGS = ("tp", "dp", "ep", "tokens", "active_tokens", "dp_tokens", "requests", "epochs", "seed",
              "preset")


def dp_tokens_arg(text: str) -> tuple[int, ...]:
    """``--dp-tokens 7,1``: one group-global valid count per DP group (``Case.dp_tokens``;
    their number and range are checked against dp and tokens with the case)."""
    try:
        counts = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints "
                                         f"(one count per DP group, e.g. 7,1)") from None
    return counts


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness", description="V4.1 validation harness")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one entry's default matrix, or every entry's (--all)")
    run.add_argument("entry", nargs="?", help="entry name (see `python -m harness list`)")
    run.add_argument("--all", action="store_true", help="every entry's default matrix")
    run.add_argument("-p", "--platform", default="a5sim", choices=("a5sim", "a5"))
    run.add_argument("-d", "--device", default=None, help="comma-separated card ids (a5)")
    for flag in ("tp", "dp", "ep", "tokens", "requests", "epochs", "seed"):
        run.add_argument(f"--{flag}", type=int, default=None)
    run.add_argument("--active-tokens", dest="active_tokens", type=int, default=None)
    run.add_argument("--dp-tokens", dest="dp_tokens", type=dp_tokens_arg, default=None,
                     help="per-DP-group valid counts, e.g. 7,1 (one per DP group)")
    run.add_argument("--case", dest="kind", default=None, help="case kind (mixed, prefix, ...)")
    run.add_argument("--wiring", default="both", choices=("both", "replicated", "sharded"))
    run.add_argument("--preset", default=None, choices=("tiny", "flash"))
    run.add_argument("--save-data", nargs="?", const="out/data", default=None)
    run.add_argument("--plot", action="store_true",
                     help="with --save-data: error plots of every failing case, written to "
                          "<saved case>/plots/ (needs matplotlib)")
    run.add_argument("--summary", default="out/summary.json", help="JSON summary path")
    run.add_argument("--allow-skip", action="store_true",
                     help="exit 0 even if kernel cases skipped (platform unavailable)")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="print every check of every case, not only failing ones")
    run.add_argument("--verify", default=None, choices=("tensor", "lowered"),
                     help="a5sim pass verification: tensor graph only (default) or also "
                          "every lowering pass (sets V41_VERIFY)")
    ls = sub.add_parser("list", help="list registered entries")
    ls.add_argument("--json", action="store_true",
                    help="name, sut, phase and case ids of each entry as JSON")
    return ap


def _explicit(args) -> dict:
    out = {k: getattr(args, k) for k in AXIS_FLAGS if getattr(args, k) is not None}
    if args.kind is not None:
        out["kind"] = args.kind
    return out


def select_cases(args) -> list[Case]:
    """The cases a ``run`` invocation asks for: the default matrix of the entry (or of
    every entry with ``--all``) filtered by the axis flags; for one entry whose matrix has
    no match, the case built from its first matrix case with the explicit values."""
    if args.all and args.entry:
        raise CaseError(f"--all runs every entry's matrix; give the entry name "
                        f"({args.entry}) or --all, not both")
    if not args.all and not args.entry:
        raise CaseError("entry: give an entry name or --all")
    explicit = _explicit(args)
    validate_axis_values(tp=args.tp, dp=args.dp, ep=args.ep)
    wirings = None if args.wiring == "both" else (args.wiring,)
    chosen = registry.entries().values() if args.all else [registry.get(args.entry)]
    cases = [c for e in chosen for c in e.matrix
             if all(getattr(c, k) == v for k, v in explicit.items())
             and (wirings is None or c.wiring in wirings)]
    if not cases and not args.all:
        [entry] = chosen
        base = entry.matrix[0] if entry.matrix else Case(entry=entry.name)
        if "active_tokens" not in explicit and ("tokens" in explicit or "dp_tokens" in explicit):
            explicit["active_tokens"] = None
        if "dp_tokens" not in explicit and ("tokens" in explicit or "dp" in explicit):
            explicit["dp_tokens"] = None
        base = replace(base, **explicit)
        cases = [replace(base, wiring=w) for w in entry.support.wirings
                 if wirings is None or w in wirings]
    cases = [replace(c, platform=args.platform) for c in cases]
    if not cases:
        raise CaseError("no case matches the given entry and axis flags")
    return cases


def cmd_run(args) -> int:
    from harness.report import print_run, progress, write_summary
    from harness.runner import run_case
    if args.plot:
        from harness.plots import PlotError, require_matplotlib
        try:
            if args.save_data is None:
                raise PlotError("--plot: draws from the saved case; give --save-data [DIR] too")
            require_matplotlib()
        except PlotError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.verify is not None:
        os.environ["V41_VERIFY"] = args.verify  # read by each a5sim platform object
    try:
        cases = select_cases(args)
    except (CaseError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    devices = tuple(int(d) for d in args.device.split(",")) if args.device else None
    cards = len(devices) if devices else None
    results = []
    with progress() as bar:
        task = bar.add_task("cases", total=len(cases))
        for case in cases:
            bar.update(task, description=case.case_id)
            try:
                results.append(run_case(case, save_root=args.save_data, cards_available=cards,
                                        devices=devices))
            except CaseError as err:
                print(f"error: {case.case_id}: {err}", file=sys.stderr)
                return 2
            bar.advance(task)
    print_run(results, verbose=args.verbose)
    if args.plot:
        print_plots(results)
    path = write_summary(results, args.summary)
    print(f"summary: {path}")
    return exit_status(results, args.allow_skip)


def print_plots(results) -> None:
    """Draw the error plots of every failing saved case next to it and list them."""
    from harness.plots import PlotError
    from harness.plots.errors import plot_saved_case
    for r in results:
        if r.status != "fail" or r.data_dir is None:
            continue
        try:
            drawn = plot_saved_case(r.data_dir)
        except PlotError as err:
            print(f"{r.case.case_id}: no plot: {err}")
            continue
        for line in [f"plot: {p}" for p in drawn.paths] + drawn.notes:
            print(f"{r.case.case_id}: {line}")


def exit_status(results, allow_skip: bool = False) -> int:
    """1 when a case failed or errored, when none passed, or when a kernel case skipped
    (unless ``allow_skip``), each said on stderr; 0 otherwise."""
    rc = 0 if all(r.status in ("pass", "skip") for r in results) else 1
    skipped = [r for r in results if r.status == "skip" and r.sut_kind == "kernel"]
    if skipped and not allow_skip:
        print(f"error: {len(skipped)} kernel case(s) skipped, so their kernels were not "
              f"validated (--allow-skip accepts this):", file=sys.stderr)
        for r in skipped:
            print(f"  {r.case.case_id}: {r.reason}", file=sys.stderr)
        rc = 1
    if not any(r.status == "pass" for r in results):
        print("error: no case passed: nothing was validated", file=sys.stderr)
        rc = 1
    return rc


def entry_sut_kind(entry, platform: str = "a5sim") -> str:
    """What ``entry`` offers on ``platform``: ``kernel``, ``golden-alt``, ``both`` (a kernel,
    which is what runs, and a golden-alt path) or ``none``."""
    from harness.registry import ALTERNATE_PLATFORMS
    from harness.runner import sut_kind
    if platform in entry.kernels and entry.alternate is not None \
            and platform in ALTERNATE_PLATFORMS:
        return "both"
    return sut_kind(entry.sut_for(platform)[0])


def cmd_list(as_json: bool = False) -> int:
    entries = registry.entries()
    if as_json:
        print(json.dumps([{"name": name, "sut": entry_sut_kind(e), "phase": e.support.phase,
                           "cases": [c.case_id for c in e.matrix],
                           "slow_cases": [c.case_id for c in e.slow_cases],
                           "description": e.description} for name, e in entries.items()],
                         indent=1))
        return 0
    for name, e in entries.items():
        print(f"{name:20s} {entry_sut_kind(e):10s} {e.support.phase:7s} {len(e.matrix):3d} cases  "
              f"{e.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        return cmd_list(args.json)
    return cmd_run(args)
