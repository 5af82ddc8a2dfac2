"""``python -m harness.order_audit DIR``: loop iterations whose writes a later loop reads with
no dependency edge, in the task graphs of kept launches.

pypto 0.2.0's runtime writes each launch's task graph to ``dyn_topo.txt`` (one line per task:
its stitched submission ``seqNo``, ``taskId`` whose high bits above bit 20 number the root
function, i.e. one loop iteration, the root function's ``rootHash``, and the ids of its
successors).  Iterations of one ``pypto.loop`` share a ``rootHash``.  The runtime tracks a
written tensor in cells of its static dims (``device_slot_context.cpp``,
``UpdateSlotsForStitch``; ``dev_encode.cpp``, ``InitPartialUpdateCellMatch``): along a
dynamic axis (``tokens``) every write lands in one cell, so a task of a later loop that
reads rows written by every iteration of an earlier loop gets an edge from the LAST
iteration's writer only (``hc_mixes`` with its Sinkhorn in a loop of its own, ``o_proj``
past one row tile, ``qkv_proj_rope``'s quantize loops at FLASH T=48), and the cost model
starts it before the other iterations' writers end.  The CPU interpreter runs in program
order, so the outputs do not show it; on a card the read would race the write.

The audit flags, per launch, the loops whose edges to later root functions (numbered after
the loop's last iteration and not one of its nested functions, which are numbered right
after their iteration) all leave from the LAST iteration, and every such later function
that an earlier iteration cannot reach through any chain of edges.  Where several
iterations feed later functions, each its own (``compressor_ratio2``'s ring reads into a
static ``[requests, width]`` tensor: a pooling tile gets the edge of its request's read),
rows are tracked and nothing is flagged.  A later function fed by the last iteration for
another reason looks the same, so a flag is a place to read the kernel, not a proof of a
race.  Launches keep their files with ``V41_RUN_DIR=DIR V41_KEEP_RUN_DIR=1``.
Different stitched submissions run one after the other and are taken as ordered.

The same cell rule holds inside one root function: the encoder (``dev_encode.cpp``,
``EncodeAnalysisOpUseOutCasts``) links every writer of an outcast that covers the whole
tensor (offset 0, full shape) to a hub that readers wait for, but records writes of part
of it in the cell table, last writer per cell.  A row tile written in several pieces
(``o_proj``'s 8-row MX pieces of ``lat_mx``: at FLASH T=192 the ``wo_b`` products wait for
2 of its 48 piece writers, and the cost model starts them before 4 writers end) has every
piece but the last per column cell unordered.  :func:`stranded_writers` reads
``program.json`` for each root function's outcast writers and flags a tensor that later
functions read while some of its writers reach no later function at all.  Nothing here
imports pypto.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

Function = tuple[int, int]  # (seqNo, root function index)


@dataclass(frozen=True)
class Finding:
    """A later root function fed by some iterations of a loop but unreachable from others."""
    loop: str  # the loop's name from program.json, else its rootHash
    iterations: tuple[Function, ...]
    reader: Function
    unordered: tuple[Function, ...]  # iterations with no path to ``reader``



def parse_topo(text: str) -> tuple[dict[Function, str], dict[Function, set[Function]]]:
    """(root hash of each root function, successor functions of each root function) from a
    ``dyn_topo.txt``; edges inside one function are dropped."""
    roots: dict[Function, str] = {}
    succ: dict[Function, set[Function]] = defaultdict(set)
    lines = text.splitlines()
    if not lines or not lines[0].startswith("seqNo,taskId"):
        raise ValueError("dyn_topo: the first line is not the 'seqNo,taskId,...' header")
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        f = line.split(",")
        if len(f) < 10:
            raise ValueError(f"dyn_topo line {n}: {len(f)} fields, expected at least 10")
        seq, task = int(f[0]), int(f[1])
        fn = (seq, task >> 20)
        roots[fn] = f[3]
        for s in f[10:]:
            if s and (int(s) >> 20) != fn[1]:
                succ[fn].add((seq, int(s) >> 20))
    return roots, succ


def findings(roots: dict[Function, str], succ: dict[Function, set[Function]],
             names: dict[str, str] | None = None) -> list[Finding]:
    """Every (loop, reader) pair with an iteration that cannot reach the reader."""
    reach: dict[Function, set[Function]] = {}

    def reachable(fn: Function) -> set[Function]:
        if fn not in reach:
            seen: set[Function] = set()
            stack = [fn]
            while stack:
                for nxt in succ.get(stack.pop(), ()):
                    if nxt not in seen:
                        seen.add(nxt)
                        stack.append(nxt)
            reach[fn] = seen
        return reach[fn]

    loops: dict[tuple[int, str], list[Function]] = defaultdict(list)
    for fn in sorted(roots):
        loops[(fn[0], roots[fn])].append(fn)
    out = []
    for (_, h), its in loops.items():
        if len(its) < 2:
            continue
        # an iteration's own nested functions are numbered right after it: those of the
        # earlier iterations name the root hashes that are children, not later readers
        nested = {roots.get(r) for a, b in zip(its, its[1:]) for r in succ.get(a, ())
                  if a < r < b}
        later = {fn: {r for r in succ.get(fn, ()) if r > its[-1] and roots.get(r) not in nested}
                 for fn in its}
        if [fn for fn in its if later[fn]] != [its[-1]]:
            continue  # several iterations feed later functions: tracked by rows, or none
        for reader in sorted(later[its[-1]]):
            miss = tuple(fn for fn in its if reader not in reachable(fn))
            if miss:
                out.append(Finding((names or {}).get(h, h), tuple(its), reader, miss))
    return out


@dataclass(frozen=True)
class Stranded:
    """Writers of a root function's outcast that no later function waits for, while later
    functions read the tensor (edges from its other writers)."""
    function: Function
    name: str  # the root function's name from program.json
    tensor: int  # the outcast's tensor magic
    writers: int
    stranded: int
    readers: tuple[Function, ...]


def _tasks(text: str) -> dict[tuple[int, int], tuple[str, int, list[tuple[int, int]]]]:
    """(seqNo, taskId) -> (root hash, opmagic, successor tasks) from a ``dyn_topo.txt``."""
    parse_topo(text)  # validates the format
    out = {}
    for line in text.splitlines()[1:]:
        if line.strip():
            f = line.split(",")
            seq = int(f[0])
            out[(seq, int(f[1]))] = (f[3], int(f[4]), [(seq, int(x)) for x in f[10:] if x])
    return out


def stranded_writers(text: str, program: dict) -> list[Stranded]:
    """Per root function and outcast tensor with at least two writer tasks: a finding when
    some writers reach later functions and others reach none (``program.json``'s root
    functions, matched by hash, name each outcast's writer operations by opmagic)."""
    tasks = _tasks(text)
    specs = {str(f.get("hash")): f for f in program.get("functions", [])
             if isinstance(f, dict) and "topo" in f}

    def fn(t):
        return (t[0], t[1] >> 20)

    memo: dict = {}

    def later(t) -> frozenset:
        """Later functions a task reaches directly or through its own function's tasks."""
        if t not in memo:
            memo[t] = frozenset()
            acc = set()
            for s in tasks[t][2]:
                if s in tasks:
                    acc |= {fn(s)} if fn(s) != fn(t) else later(s)
            memo[t] = frozenset(acc)
        return memo[t]

    by_fn: dict[Function, list] = defaultdict(list)
    for t in sorted(tasks):
        by_fn[fn(t)].append(t)
    out = []
    for f, ts in sorted(by_fn.items()):
        spec = specs.get(tasks[ts[0]][0])
        if spec is None:
            continue
        for oc in spec.get("outcasts", []):
            magic = oc[0] if isinstance(oc, list) else oc
            ops = {o.get("opmagic") for o in spec.get("operations", [])
                   if magic in o.get("ooperands", [])}
            writers = [t for t in ts if tasks[t][1] in ops]
            readers = set().union(*(later(t) for t in writers)) if writers else set()
            stranded = [t for t in writers if not later(t)]
            if len(writers) >= 2 and readers and stranded:
                out.append(Stranded(f, str(spec.get("func_magicname", "")), magic,
                                    len(writers), len(stranded), tuple(sorted(readers))))
    return out


def stranded_lines(found: list[Stranded]) -> list[str]:
    """One line per stranded outcast."""
    return [f"function {s.function[1]} ({s.name}) tensor {s.tensor}: {s.stranded} of "
            f"{s.writers} writers reach none of the {len(s.readers)} later functions that "
            f"read it ({_ids(s.readers)})" for s in found]


def _ids(fns, most: int = 8) -> str:
    return ", ".join(str(f[1]) for f in fns[:most]) + (" ..." if len(fns) > most else "")


def summary_lines(found: list[Finding]) -> list[str]:
    """One line per (loop, unordered iterations): the functions those iterations do not reach."""
    groups: dict[tuple, list[Function]] = defaultdict(list)
    for f in found:
        groups[(f.loop, f.iterations, f.unordered)].append(f.reader)
    return [f"loop {loop} (iterations {_ids(its)}): iterations {_ids(miss)} reach none of "
            f"{len(readers)} functions the loop feeds ({_ids(readers)})"
            for (loop, its, miss), readers in groups.items()]


def loop_names(program_json: Path) -> dict[str, str]:
    """rootHash -> the root function's name (``TENSOR_<LOOP>_...``) from ``program.json``."""
    prog = _program(program_json)
    return {str(f.get("hash")): str(f.get("func_magicname", ""))
            for f in prog.get("functions", []) if isinstance(f, dict)}


def _program(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def audit_dir(root: Path) -> dict[str, list[Finding]]:
    """Loop findings per launch (its directory name) for every ``dyn_topo.txt`` under
    ``root``."""
    out: dict[str, list[Finding]] = {}
    for topo in sorted(root.rglob("dyn_topo.txt")):
        roots, succ = parse_topo(topo.read_text())
        out[_launch(topo)] = findings(roots, succ, loop_names(topo.parent / "program.json"))
    return out


def strand_dir(root: Path) -> dict[str, list[Stranded]]:
    """Stranded writers per launch for every ``dyn_topo.txt`` (with its ``program.json``)
    under ``root``."""
    return {_launch(topo): stranded_writers(topo.read_text(),
                                            _program(topo.parent / "program.json"))
            for topo in sorted(root.rglob("dyn_topo.txt"))}


def verdict(root: Path) -> str:
    """``ordered`` when every launch kept under ``root`` has neither a loop finding nor a
    stranded writer; otherwise ``unordered (<flagged> of <launches> launches): <first
    flagged launch>: <its first finding>``; ``no task graph`` when no ``dyn_topo.txt`` was
    kept."""
    strands = strand_dir(root)
    flagged = []
    launches = audit_dir(root)
    for launch, found in launches.items():
        lines = summary_lines(found) + stranded_lines(strands.get(launch, []))
        if lines:
            flagged.append(f"{launch}: {lines[0]}")
    if not launches:
        return "no task graph"
    if not flagged:
        return "ordered"
    return f"unordered ({len(flagged)} of {len(launches)} launches): {flagged[0]}"


def _launch(topo: Path) -> str:
    launch = next((p.name for p in topo.parents if p.name.startswith("launch-")),
                  str(topo.parent))
    return f"{launch} ({topo.parent.name})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.order_audit",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", help="kept run directories (V41_RUN_DIR)")
    args = ap.parse_args(argv)
    flagged = total = 0
    for d in args.dirs:
        p = Path(d)
        if not p.is_dir():
            print(f"order_audit: {d}: not a directory", file=sys.stderr)
            return 2
        strands = strand_dir(p)
        for launch, found in audit_dir(p).items():
            total += 1
            stranded = strands.get(launch, [])
            if found or stranded:
                flagged += 1
                print(f"FLAG {launch}: {len(found)} unordered (loop, reader) pairs, "
                      f"{len(stranded)} outcasts with stranded writers")
                for line in (summary_lines(found)[:6] + stranded_lines(stranded)[:6]):
                    print(f"  {line}")
            else:
                print(f"ok   {launch}")
    if total == 0:
        print("order_audit: no dyn_topo.txt found (keep launches with V41_KEEP_RUN_DIR=1)",
              file=sys.stderr)
        return 2
    print(f"{total} launches, {flagged} flagged")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
