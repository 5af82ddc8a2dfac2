"""``python -m ci.queue [paths...]``: run every CI pytest node as its own fresh process.

1. entries: the given paths (files, folders or node ids), else every ``.py`` file holding a
   line ``# ci: a5``; ``--changed-since REV`` keeps those affected by the change;
2. nodes: each entry is collected with ``pytest --collect-only --collect-nodes`` into
   ``{nodeid, axes, cards}`` (``--sweep``: the entry's full ``--tp/--dp/--ep`` CLI matrix);
3. each node runs with its card count through ``task-submit``, Slurm (``--backend slurm``,
   ``ci.slurm``) or the local card pool;
4. results: ``results.tsv``, ``results.json`` and logs under ``--out``, a rich summary, exit 1
   on any failure, timeout, collection error, empty collection or a run with no pass.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shlex
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from ci import collect, results, select, slurm, submit
from ci.pool import Job, run_all, signals_held


def _bounded(kind, what: str, zero_ok: bool = False):
    """argparse type: a finite ``kind`` value > 0 (>= 0 with ``zero_ok``); argparse names the
    flag in its error (exit 2)."""
    def check(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return check


POSITIVE_INT = _bounded(int, "an integer >= 1")
POSITIVE_SECONDS = _bounded(float, "seconds > 0")
GRACE_SECONDS = _bounded(float, "seconds >= 0", zero_ok=True)


def _card_ids(text: str) -> list[int]:
    """argparse type of ``--devices``: distinct non-negative card ids, comma separated."""
    parts = text.replace(" ", "").split(",")
    if not all(x.isdigit() for x in parts) or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(
            f"expected distinct card ids >= 0 separated by commas, got {text!r}")
    return [int(x) for x in parts]


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
    p.add_argument("--backend", choices=("auto", "task-submit", "local", "slurm"),
                   default="auto", help="auto = task-submit when it is on PATH, else the local "
                                        "card pool; slurm = one sbatch job per node")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cards", type=POSITIVE_INT,
                   help="local pool size: ids 0..N-1 (default 8; inside a task-submit job: "
                        "the job's cards)")
    g.add_argument("--devices", type=_card_ids,
                   help="local pool as explicit card ids, e.g. 0,1,4,5")
    p.add_argument("--jobs", type=POSITIVE_INT,
                   help="max concurrent nodes (default: pool size / 8)")
    p.add_argument("--timeout", type=POSITIVE_SECONDS, default=900.0,
                   help="per-node seconds (default 900; task-submit rounds up to whole seconds)")
    p.add_argument("--kill-grace", type=GRACE_SECONDS, default=5.0,
                   help="seconds between SIGTERM and SIGKILL at a timeout or a cancel (default 5)")
    p.add_argument("--submit-wait", type=POSITIVE_SECONDS, default=3600.0,
                   help="task-submit --timeout: queue wait plus run; slurm: longest wait in "
                        "the queue before the job is cancelled; seconds (default 3600)")
    p.add_argument("--activate", help="task-submit, slurm: script to source before the node "
                                      "command")
    p.add_argument("--partition", help="slurm: partition (sbatch --partition)")
    p.add_argument("--account", help="slurm: account (sbatch --account)")
    p.add_argument("--gres-name", help="slurm: GRES name of the cards (default npu)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the nodes")
    p.add_argument("--node-args", default="",
                   help="extra pytest arguments for every node, e.g. '--platform a5'")
    p.add_argument("--out", help="output folder (default out/ci/<timestamp>/ under the root)")
    p.add_argument("--list", action="store_true", help="print the nodes and commands; run nothing")
    args = p.parse_args(argv)
    slurm.check_flags(p, args)
    return args


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
    cards = args.devices or (list(range(args.cards)) if args.cards else None)
    backend = (slurm.SlurmBackend(root, spool=out / "slurm", python=args.python,
                                  gres=args.gres_name, partition=args.partition,
                                  account=args.account, timeout=args.timeout,
                                  wait=args.submit_wait, activate=args.activate, jobs=args.jobs)
               if args.backend == "slurm" else
               submit.choose(args.backend, root=root, python=args.python, cards=cards,
                             jobs=args.jobs, timeout=args.timeout, wait=args.submit_wait,
                             activate=args.activate))
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
                  + (f" over cards {backend.pool.ids}" if backend.pool else ""))
    if args.list:
        for job in jobs:
            example = list(range(job.cards)) if backend.pool else None
            print(f"{job.cards} card(s): {shlex.join(job.argv(example))}", flush=True)
        return int(not jobs)

    def done(o) -> None:
        node = by_key[o.job.key]
        text = o.job.log.read_text(errors="replace") if o.job.log.exists() else ""
        seen = backend.interpret(o, text)   # cards, queue wait and run time, why it stopped
        verdict = results.classify(o.rc, text, seen["timed_out"], node.get("kind", "pytest"))
        if seen["reason"]:
            verdict["note"] = seen["reason"]
        verdict["note"] = "; ".join(n for n in (verdict["note"], seen["extra"], o.note) if n)
        if o.cancelled:
            verdict = {**verdict, "status": "cancelled",
                       "note": f"{seen['cancel']} (runner cancelled)"}
        elif o.rc is None and not seen["timed_out"]:   # never started (does not fit the pool)
            verdict = {**verdict, "status": "fail"}
        r = results.row(node["nodeid"], node["cards"], seen["devices"], seen["seconds"], verdict,
                        o.rc, o.job.log if o.job.log.exists() else None, seen["queued"])
        rows.append(r)
        print(f"{r['status']:>9}  {r['queued']:6.1f}s queued  {r['seconds']:6.1f}s  "
              f"[{r['devices']}]  {r['node']}", flush=True)

    try:
        run_all(jobs, pool=backend.pool, max_parallel=backend.jobs, cwd=root,
                env=collect.child_env(), grace=args.kill_grace, on_done=done)
        stopped = None
    except (KeyboardInterrupt, SystemExit) as e:   # cancelled: nodes are already stopped
        stopped = e
    with signals_held() if stopped else contextlib.nullcontext():   # let results be written
        tsv, js = results.write(rows, out, {"root": str(root), "backend": backend.name,
                                            "entries": entries, "sweep": args.sweep,
                                            "cancelled": stopped is not None})
        results.summary(rows, console, title="CI queue (cancelled)" if stopped else "CI queue")
        print(f"results: {tsv}  {js}", flush=True)
    if stopped is not None:
        raise stopped
    return results.exit_status(rows)


def cli() -> None:
    """Console entry: SIGINT/SIGTERM (a cancelled CI job) unwind so that running nodes are
    stopped (task-submit clients withdraw their queued tasks) and the results are written."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    sys.exit(main())


if __name__ == "__main__":
    cli()
