"""Merge per-entry ``python -m harness.bench --json`` outputs into one estimate baseline.

A FLASH scan of every kernel entry takes hours in one process and some entries need most of
the machine's memory, so it is run entry by entry (each run a fresh process, its JSON rows
saved to a file); this joins those rows into the baseline ``--save-baseline`` would have
written from one run of the same selection, so ``--check FILE`` (with or without entry
names) judges later runs against it::

    python -m harness.bench --preset flash --estimate-only --json rmsnorm > rows/rmsnorm.jsonl
    ...
    python -m harness.bench_merge --preset flash -o harness/baselines/bench_flash.json rows/*.jsonl

Refused, naming the case and writing nothing: a line that is not a bench row, a row of
another preset, a case id given twice, a row without a passing estimate, rows of different
simulated topologies or of an entry the registry does not know, and -- unless
``--partial`` -- any case of the selection (``harness.bench.bench_cases``) no file holds.
Nothing here imports pypto.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import bench_baseline as bb
from harness.bench import bench_cases

ROW_KEYS = ("entry", "case", "preset", "tokens", "tp", "status", "estimated_us",
            "total_cycles", "topology")


class MergeError(ValueError):
    """Rows that cannot make one baseline (the message names the file, line or case)."""


def read_rows(paths: list[str]) -> list[dict]:
    """Every bench JSON row in ``paths`` (lines that are not JSON objects, such as stray
    log lines, are refused, not skipped)."""
    rows = []
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as err:
            raise MergeError(f"{path}: cannot read: {err.strerror or err}") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise MergeError(f"{path}:{n}: not a JSON bench row: {line[:60]!r}") from None
            missing = [k for k in ROW_KEYS if not isinstance(row, dict) or k not in row]
            if missing:
                raise MergeError(f"{path}:{n}: not a bench row (no {missing[0]!r})")
            rows.append(row)
    return rows


def check_rows(rows: list[dict], preset: str, partial: bool) -> None:
    """Raise MergeError unless ``rows`` are one complete, consistent selection of ``preset``
    (every case of ``bench_cases([], preset, None)`` exactly once; with ``partial`` a subset)."""
    if not rows:
        raise MergeError("no bench rows given")
    wanted = {c.case_id for c in bench_cases([], preset, None)}
    seen: set[str] = set()
    topo0 = {k: rows[0]["topology"].get(k) for k in bb.TOPOLOGY_KEYS}
    for row in rows:
        case = row["case"]
        if row["preset"] != preset:
            raise MergeError(f"{case}: preset {row['preset']!r}, the baseline is {preset!r}")
        if case not in wanted:
            raise MergeError(f"{case}: not a case of the {preset} selection")
        if case in seen:
            raise MergeError(f"{case}: given twice")
        seen.add(case)
        topo = {k: row["topology"].get(k) for k in bb.TOPOLOGY_KEYS}
        if topo != topo0:
            raise MergeError(f"{case}: simulated topology {topo}, the first row's is {topo0}")
    lacking = sorted(wanted - seen)
    if lacking and not partial:
        raise MergeError(f"{len(lacking)} case(s) of the {preset} selection have no row: "
                         f"{', '.join(lacking)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench_merge",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", help="files of `harness.bench --json` output")
    ap.add_argument("--preset", choices=("tiny", "flash"), required=True)
    ap.add_argument("-o", "--output", required=True, help="the baseline file to write")
    ap.add_argument("--partial", action="store_true",
                    help="allow cases of the selection to be missing (listed, not refused)")
    args = ap.parse_args(argv)
    problem = bb.check_save_path(args.output)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        rows = read_rows(args.rows)
        check_rows(rows, args.preset, args.partial)
    except MergeError as err:
        print(f"bench_merge: {err}", file=sys.stderr)
        return 2
    refused = bb.save_baseline(args.output, rows, bb.selection(args.preset, None, False),
                               bb.pypto_version())
    if refused:
        print(refused, file=sys.stderr)
        return 2
    print(f"baseline: {args.output} ({len(rows)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
