"""``python -m ci.queue [paths...]``: run every CI pytest node as its own fresh process.

1. entries: the given paths (files, folders or node ids), else every ``.py`` file holding a
   line ``# ci: a5``; ``--changed-since REV`` keeps those affected by the change;
2. nodes: each entry is collected with ``pytest --collect-only --collect-nodes`` into
   ``{nodeid, axes, cards}`` (``--sweep``: the entry's full ``--tp/--dp/--ep`` CLI matrix);
3. each node runs with its card count through ``task-submit`` or the local card pool;
4. results: ``results.tsv``, ``results.json`` and logs under ``--out``, a rich summary, exit 1
   on any failure, timeout, collection error, empty collection or a run with no pass.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from ci import collect, results, select, submit
from ci.pool import Job, run_all


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ci.queue", description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="*", help="entries to collect (default: files marked '# ci: a5')")
    p.add_argument("--root", default=".", help="project root: pytest cwd and rootdir (default .)")
    p.add_argument("--changed-since", metavar="REV",
                   help="only entries in the reverse-import closure of files changed since REV")
    p.add_argument("--sweep", action="store_true",
                   help="run each entry's full --tp/--dp/--ep matrix through its CLI "
                        "(harness registry entries by default: python -m harness run ENTRY)")
    p.add_argument("--sweep-args", default="-p a5", help="extra entry arguments in sweep mode")
    p.add_argument("--backend", choices=("auto", "task-submit", "local"), default="auto",
                   help="auto = task-submit when it is on PATH, else the local card pool")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cards", type=int, default=8, help="local pool size: ids 0..N-1 (default 8)")
    g.add_argument("--devices", help="local pool as explicit card ids, e.g. 0,1,4,5")
    p.add_argument("--jobs", type=int, help="max concurrent nodes (default: pool size / 8)")
    p.add_argument("--timeout", type=float, default=900.0, help="per-node seconds (default 900)")
    p.add_argument("--kill-grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL at a timeout (default 5)")
    p.add_argument("--submit-wait", type=float, default=3600.0,
                   help="task-submit --timeout: queue wait plus run, seconds (default 3600)")
    p.add_argument("--activate", help="task-submit: script to source before the node command")
    p.add_argument("--python", default=sys.executable, help="interpreter for the nodes")
    p.add_argument("--node-args", default="",
                   help="extra pytest arguments for every node, e.g. '--platform a5'")
    p.add_argument("--out", help="output folder (default out/ci/<timestamp>/ under the root)")
    p.add_argument("--list", action="store_true", help="print the nodes and commands; run nothing")
    return p.parse_args(argv)


def pick_entries(args, root: Path, console: Console) -> list[str] | None:
    """Entries to collect; None when --changed-since affects none of them (nothing to do)."""
    if args.sweep and not args.paths and (root / "harness" / "registry.py").is_file():
        from harness import registry
        entries = [name for name, e in registry.entries().items() if e.kernels]
    else:
        entries = list(args.paths) or collect.marked_entries(root)
    if not args.changed_since:
        return entries
    everything, hit, changed = select.affected(root, args.changed_since)
    console.print(f"changed since {args.changed_since}: {len(changed)} file(s)"
                  + (" -> selects everything" if everything else ""))
    if everything:
        return entries
    kept = [e for e in entries if e.split("::")[0] in hit
            or (root / e).is_dir() and any(h.startswith(e.rstrip("/") + "/") for h in hit)]
    return kept or None


def gather(entries: list[str], args, root: Path) -> tuple[list[dict], list[dict]]:
    """(nodes, failure rows for entries that could not be collected)."""
    extra = shlex.split(args.sweep_args)

    def one(entry: str):
        if not args.sweep:
            return collect.collect_entry(entry, root, args.python)
        choices, err = (collect.registry_matrix(entry) if collect.is_registry_entry(entry)
                        else collect.cli_matrix(entry, root, args.python))
        return ([], err) if err else (collect.sweep_nodes(entry, choices, extra), None)

    nodes, failed = [], []
    with ThreadPoolExecutor(max_workers=4) as ex:
        for entry, (found, err) in zip(entries, ex.map(one, entries)):
            nodes += found
            if err:
                failed.append(results.row(entry, 0, None, 0.0,
                                          {"status": "fail", "pass": 0, "fail": 0,
                                           "note": err}, None, None))
    return nodes, failed


def log_name(i: int, nodeid: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in nodeid)
    return f"{i:03d}-{safe[-120:]}.log"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 150)
    root = Path(args.root).resolve()
    out = Path(args.out).resolve() if args.out else root / "out" / "ci" / time.strftime(
        "%Y%m%d-%H%M%S")
    entries = pick_entries(args, root, console)
    if entries is None:
        console.print("[green]no CI entry is affected by the change; nothing to run[/]")
        return 0
    if not entries:
        console.print("[red]no CI entries: no paths given and no file holds '# ci: a5'[/]")
    nodes, rows = gather(entries, args, root) if entries else ([], [])
    cards = [int(x) for x in args.devices.split(",")] if args.devices else list(range(args.cards))
    backend = submit.choose(args.backend, root=root, python=args.python, cards=cards,
                            jobs=args.jobs, timeout=args.timeout, wait=args.submit_wait,
                            activate=args.activate)
    jobs, by_key = [], {}
    for i, node in enumerate(nodes):
        if args.node_args and node.get("kind") != "cli":
            node["args"] = shlex.split(args.node_args)
        job = Job(key=f"{i}", cards=int(node["cards"]),
                  argv=lambda ids, node=node: backend.argv(node, ids),
                  log=out / "logs" / log_name(i, node["nodeid"]),
                  timeout=backend.watchdog(args.timeout))
        jobs.append(job)
        by_key[job.key] = node
    console.print(f"{len(entries)} entr(ies), {len(nodes)} node(s), backend {backend.name}"
                  + (f" over cards {cards}" if backend.pool else ""))
    if args.list:
        for job in jobs:
            example = list(range(job.cards)) if backend.pool else None
            print(f"{job.cards} card(s): {shlex.join(job.argv(example))}", flush=True)
        return int(not jobs)

    def done(o) -> None:
        node = by_key[o.job.key]
        text = o.job.log.read_text(errors="replace") if o.job.log.exists() else ""
        verdict = results.classify(o.rc, text, o.timed_out, node.get("kind", "pytest"))
        if o.note:
            verdict["note"] = "; ".join(n for n in (verdict["note"], o.note) if n)
        if o.rc is None and not o.timed_out:   # never started (does not fit the pool)
            verdict = {**verdict, "status": "fail"}
        r = results.row(node["nodeid"], node["cards"], o.devices, o.seconds, verdict, o.rc,
                        o.job.log if o.job.log.exists() else None)
        rows.append(r)
        print(f"{r['status']:>7}  {r['seconds']:6.1f}s  [{r['devices']}]  {r['node']}", flush=True)

    run_all(jobs, pool=backend.pool, max_parallel=backend.jobs, cwd=root,
            env=collect.child_env(), grace=args.kill_grace, on_done=done)
    tsv, js = results.write(rows, out, {"root": str(root), "backend": backend.name,
                                        "entries": entries, "sweep": args.sweep})
    results.summary(rows, console)
    print(f"results: {tsv}  {js}", flush=True)
    return results.exit_status(rows)


def cli() -> None:
    """Console entry: SIGTERM (a cancelled CI job) unwinds so running nodes are killed."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())


if __name__ == "__main__":
    cli()
