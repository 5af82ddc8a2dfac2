"""``python -m harness run <entry> [flags]`` and ``python -m harness run --all``.

Flags follow the reference entry CLIs where they apply: ``-p/--platform``, ``-d/--device``,
``--tp --dp --ep --tokens --active-tokens --requests --case --seed --epochs --wiring
--preset --save-data [DIR]``.  ``--all`` runs every entry's default matrix (axis flags then
filter it).  Writes a JSON summary (default ``out/summary.json``); exit status 1 on any
failure or error, 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from harness import registry
from harness.case import Case, CaseError

AXIS_FLAGS = ("tp", "dp", "ep", "tokens", "active_tokens", "requests", "epochs", "seed", "preset")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness", description="V4.1 validation harness")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one entry's case, or --all default matrices")
    run.add_argument("entry", nargs="?", help="entry name (see `python -m harness list`)")
    run.add_argument("--all", action="store_true", help="every entry's default matrix")
    run.add_argument("-p", "--platform", default="a5sim", choices=("a5sim", "a5"))
    run.add_argument("-d", "--device", default=None, help="comma-separated card ids (a5)")
    for flag in ("tp", "dp", "ep", "tokens", "requests", "epochs", "seed"):
        run.add_argument(f"--{flag}", type=int, default=None)
    run.add_argument("--active-tokens", dest="active_tokens", type=int, default=None)
    run.add_argument("--case", dest="kind", default=None, help="case kind (mixed, prefix, ...)")
    run.add_argument("--wiring", default="both", choices=("both", "replicated", "sharded"))
    run.add_argument("--preset", default=None, choices=("tiny", "flash"))
    run.add_argument("--save-data", nargs="?", const="out/data", default=None)
    run.add_argument("--summary", default="out/summary.json", help="JSON summary path")
    sub.add_parser("list", help="list registered entries")
    return ap


def _explicit(args) -> dict:
    out = {k: getattr(args, k) for k in AXIS_FLAGS if getattr(args, k) is not None}
    if args.kind is not None:
        out["kind"] = args.kind
    return out


def select_cases(args) -> list[Case]:
    """The cases a ``run`` invocation asks for."""
    explicit = _explicit(args)
    wirings = None if args.wiring == "both" else (args.wiring,)
    if args.all:
        cases = [c for e in registry.entries().values() for c in e.matrix]
        cases = [c for c in cases if all(getattr(c, k) == v for k, v in explicit.items())]
    else:
        if not args.entry:
            raise CaseError("entry: give an entry name or --all")
        entry = registry.get(args.entry)
        base = entry.matrix[0] if entry.matrix else Case(entry=entry.name)
        if "active_tokens" not in explicit and "tokens" in explicit:
            explicit["active_tokens"] = None
        base = replace(base, **explicit)
        cases = [replace(base, wiring=w) for w in entry.support.wirings]
    cases = [replace(c, platform=args.platform) for c in cases]
    if wirings is not None:
        cases = [c for c in cases if c.wiring in wirings]
    if not cases:
        raise CaseError("no case matches the given entry and axis flags")
    return cases


def cmd_run(args) -> int:
    from harness.report import print_run, progress, write_summary
    from harness.runner import run_case
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
    print_run(results)
    path = write_summary(results, args.summary)
    print(f"summary: {path}")
    if not any(r.status == "pass" for r in results):
        print("error: no case passed: nothing was validated", file=sys.stderr)
        return 1
    return 0 if all(r.status in ("pass", "skip") for r in results) else 1


def cmd_list() -> int:
    for name, e in registry.entries().items():
        print(f"{name:32s} {len(e.matrix):3d} cases  {e.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        return cmd_list()
    return cmd_run(args)
