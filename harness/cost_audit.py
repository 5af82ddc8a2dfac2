"""``python -m harness.cost_audit DIR``: how pypto 0.2.0's A5 cost model charged the vector
ops of kept launches, and what the same formulas give when an op is charged by its LARGEST
vector-buffer operand.

The A5 estimate comes from pypto's fast pipe simulator (r0.2.0,
``framework/src/cost_model/simulation/arch/PipeSimulatorFast.cpp`` and
``arch/A5/PostSimulatorA5.h``).  It charges one tile op as follows:

* size = the SMALLEST operand's element count over its last two axes (a 1-D operand counts
  as one element), times the byte width of the first input's dtype;
* ops in the A5 latency table (:data:`A5_TABLE`): ``(r0 * bytes * ratio * 1e-6 + r1) *
  2000 + 1`` cycles, ``ratio`` 1 for FP32 DIV/EXP/LN/SQRT and INT32 MUL/MULS, else 2;
  COPY_IN adds 1,400 cycles of GM read latency, COPY_OUT 300 of write latency;
* every other op (MUL, MULS, FLOOR, GATHER, reductions, ...): ``10 + 2 * floor(bytes / 256)
  - 1`` cycles.

The smallest-operand rule is right for element-wise ops on equal shapes.  It undercharges
every op whose operands differ in size: a gather is charged by its table or its index vector
(a 16,384-element gather from a 384-entry 1-D table: 11 cycles), a broadcast by its narrow
operand, a row reduction by its ``[rows, 1]`` result.  The kernels' table decoders
(:mod:`v41.mx_fp4_decode`, :mod:`v41.kv_decode`, :mod:`v41.mx_linear`) are made of such
gathers, so their estimates rest on that charge.

This module reads a launch's trace (``_simulate.pefetto.trace.json``, kept with
``V41_RUN_DIR=DIR V41_KEEP_RUN_DIR=1``) and recomputes each vector op's charge from its
largest operand that lives in the vector buffer (``UB_``; global-memory operands such as a
whole cache or table are not tile work), never below what was charged.  The result is a
bound to read beside the estimate, not an estimate: the recomputed vector work of the
busiest vector core is a floor under that core's time had the ops been charged so, and the
launch cannot end before it.

The launch's end is the machine level's (the ``Top_Machine`` task events).  A function's
later instances run for the latency recorded at its first (``CoreMachine``: a function with
``hasRecordInfo`` becomes a fixed-latency task) while their tile ops are still logged on the
core's pipes; where the logged ops take longer than that record they trail past the end,
and :attr:`Audit.trailing` counts them.  The op sums cover every logged op either way.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# (r0, r1) of PostSimulatorA5's latency table, vector-pipe entries (cube and copies excluded)
A5_TABLE = {"ADD": (1.4902, 0.01992), "SUB": (8.0, 0.0312), "DIV": (3.82854, 0.02462),
            "ADDS": (0.76264, 0.0221), "EXPAND": (0.58, 0.014), "CAST": (0.91250, 0.015687)}
RATIO_ONE = {"DIV", "EXP", "LN", "SQRT"}  # FP32 ops charged at parallel ratio 1
NOT_VECTOR_WORK = {"COPY_IN", "COPY_OUT", "RESHAPE", "VIEW", "RESHAPE_COPY_IN",
                   "RESHAPE_COPY_OUT", "ASSEMBLE", "CALL"}
TRACE_NAME = "_simulate.pefetto.trace.json"

_OP = re.compile(r"\d+ ([A-Z][A-Z_0-9]*) (.*)")
_UB_BYTES = re.compile(r"UB_\[[^\]]*\]\[[^\]]*\](?:-\d+-\d+)? (\d+)B")


def charge(op: str, nbytes: int) -> int:
    """Cycles the A5 fast simulator charges vector op ``op`` over ``nbytes`` bytes (its
    formulas, with the parallel ratio of an FP32 op)."""
    if op in A5_TABLE:
        r0, r1 = A5_TABLE[op]
        ratio = 1 if op in RATIO_ONE else 2
        return int((r0 * nbytes * ratio * 1e-6 + r1) * 2000) + 1
    return 10 + 2 * (nbytes // 256 if nbytes >= 256 else 1) - 1


@dataclass
class OpAudit:
    count: int = 0
    charged: int = 0
    by_largest: int = 0


@dataclass
class Audit:
    """One trace: the launch's end cycle, per op kind the charged and recomputed cycles, and
    the vector-pipe cycles both ways summed over the vector cores and on the busiest one."""
    end_cycles: int = 0
    ops: dict[str, OpAudit] = field(default_factory=dict)
    busiest_charged: int = 0
    busiest_by_largest: int = 0
    vector_cores: int = 0
    trailing: int = 0  # vector-core pipe events logged past the machine-level end

    @property
    def total_charged(self) -> int:
        return sum(o.charged for o in self.ops.values())

    @property
    def total_by_largest(self) -> int:
        return sum(o.by_largest for o in self.ops.values())

    def rows(self) -> list[tuple[str, OpAudit]]:
        """Op kinds, the largest recomputed excess first."""
        return sorted(self.ops.items(), key=lambda kv: kv[1].charged - kv[1].by_largest)


def audit_trace(path: Path) -> Audit:
    """Read one ``_simulate.pefetto.trace.json``; vector-core ops only (``AIV_*`` cores)."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    vector_cores = {e["pid"] for e in events if e.get("ph") == "M"
                    and e.get("name") == "process_name"
                    and str(e["args"].get("name", "")).startswith("AIV")}
    machine = {e["pid"] for e in events if e.get("ph") == "M"
               and e.get("name") == "process_name" and e["args"].get("name") == "Top_Machine"}
    spans = [e for e in events if e.get("ph") == "X"]
    ends = [int(e["ts"] + e["dur"]) for e in spans if e["pid"] in machine] or \
        [int(e["ts"] + e["dur"]) for e in spans]
    out = Audit(end_cycles=max(ends, default=0))
    ops: dict[str, OpAudit] = defaultdict(OpAudit)
    charged, recomputed = Counter(), Counter()
    for e in spans:
        if e["pid"] not in vector_cores:
            continue
        if e["ts"] >= out.end_cycles:
            out.trailing += 1
        m = _OP.match(e["name"])
        if not m or m.group(1) in NOT_VECTOR_WORK:
            continue
        op, dur = m.group(1), int(e["dur"])
        tiles = [int(b) for b in _UB_BYTES.findall(m.group(2))]
        again = max(dur, charge(op, max(tiles))) if tiles else dur
        a = ops[op]
        a.count += 1
        a.charged += dur
        a.by_largest += again
        charged[e["pid"]] += dur
        recomputed[e["pid"]] += again
    out.ops = dict(ops)
    out.vector_cores = len(vector_cores)
    if charged:
        out.busiest_charged = max(charged.values())
        out.busiest_by_largest = max(recomputed.values())
    return out


def traces(root: Path) -> list[Path]:
    """Every cost-model trace under ``root`` (a file is taken as it is), in path order."""
    root = Path(root)
    return [root] if root.is_file() else sorted(root.rglob(TRACE_NAME))


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table
    p = argparse.ArgumentParser(prog="python -m harness.cost_audit", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("paths", nargs="+", type=Path,
                   help="kept run directories (V41_RUN_DIR with V41_KEEP_RUN_DIR=1) or traces")
    p.add_argument("--top", type=int, default=6, help="op kinds listed per trace")
    args = p.parse_args(argv)
    console = Console()
    found = [t for root in args.paths for t in traces(root)]
    if not found:
        console.print(f"no {TRACE_NAME} under {', '.join(map(str, args.paths))}")
        return 1
    for path in found:
        a = audit_trace(path)
        launch = next((q.name for q in path.parents if q.name.startswith("launch-")), path.name)
        table = Table(title=f"{launch}: ends at {a.end_cycles:,} cycles; vector pipes "
                            f"{a.total_charged:,} charged, {a.total_by_largest:,} by largest "
                            f"operand over {a.vector_cores} cores; busiest core "
                            f"{a.busiest_charged:,} -> {a.busiest_by_largest:,}")
        for col in ("op", "count", "charged", "by largest operand"):
            table.add_column(col, justify="left" if col == "op" else "right")
        for op, o in a.rows()[:args.top]:
            table.add_row(op, f"{o.count:,}", f"{o.charged:,}", f"{o.by_largest:,}")
        console.print(table)
        if a.trailing:
            console.print(f"  {a.trailing:,} vector-core pipe events logged past the end: "
                          "later instances ran at their function's recorded latency")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
