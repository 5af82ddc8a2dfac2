"""What a5sim's pass-verify calculator checks per launch, and how its verdict is read.

pypto 0.2.0's verifier interprets the kernel's tensor graph on the real inputs (that is
how a5sim computes outputs at all) and, when asked, re-interprets the graph after each
lowering pass and compares it with the tensor graph's values.  Two levels:

* ``tensor``  -- tensor graph only (``pass_verify_pass_filter=[]``).  Without a golden the
  verifier says ``NO_COMPARE``; a ``FAILED`` tensor-graph verdict still fails the launch.
* ``cost`` -- no interpreter at all: the kernel is compiled and only the cost model runs
  (:data:`ESTIMATE_LEVEL`).  Outputs are NOT computed and nothing is checked; the level
  exists for ``python -m harness.bench --estimate-only`` (FLASH-sized estimates the
  interpreter cannot afford) and is refused everywhere a verdict is made.
* ``lowered`` -- also every lowering pass the calculator interprets faithfully,
  :data:`LOWERED_PASSES` = ``Pass_00`` .. ``Pass_26`` (RemoveRedundantReshape ..
  InferDynShape); :data:`NOT_VERIFIED` lists the later passes and the comment above it why.

Verdicts are the verifier's log lines (``... Verify ... result PASS|FAILED|NO_COMPARE``,
the failing ones also carry ``ErrCode: FB4001``) and the calculator's execution errors
(``ErrCode: FB200F! VerifyPass failed for function F, pass P``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ENV_VERIFY = "V41_VERIFY"
VERIFY_LEVELS = ("tensor", "lowered")
DEFAULT_LEVEL = "tensor"
ESTIMATE_LEVEL = "cost"  # compile + cost model only; never a level a verdict is read at

# pypto 0.2.0's lowering pipeline in order; the index is the NN of ``Pass_NN_<name>``.
PIPELINE = (
    "RemoveRedundantReshape", "AutoCast", "InferMemoryConflict", "RemoveUndrivenView",
    "ExpandFunction", "MergeViewAssemble", "SplitReshape", "SplitRawTensor",
    "SplitLargeFanoutTensor", "DuplicateOp", "AssignMemoryType", "InferDiscontinuousInput",
    "RemoveRedundantOp", "InsertOpForViewAssemble", "SplitK", "GraphPartition",
    "NBufferMerge", "L1CopyInReuseMerge", "IntraSubgraphAdapter", "GenerateMoveOp",
    "CommonOperationEliminate", "AxisCombine", "PadLocalBuffer", "RemoveUnalignedReshape",
    "ReplaceTensor", "PreGraphProcess", "InferDynShape", "SubgraphToFunction",
    "InferParamIndex", "SrcDstBufferMerge", "AddAlloc", "OoOSchedule", "TuneTileOpSeqForVF",
    "RemoveAlloc", "CopyOutResolve", "InsertSync", "TuneSyncForVF", "MixSubgraphSplit",
    "GlobalMemoryReuse", "LoopaxesProc", "CodegenPreproc",
)
# ``lowered`` verifies Pass_00..Pass_26 (through InferDynShape).  Not verified:
# SubgraphToFunction (pypto skips it: no complete computation to interpret) and every pass
# after it, which the 0.2.0 calculator interprets per leaf function and gets wrong for
# kernels whose outputs the harness validates: an index built from an arange traced in
# one-element tiles (v41.gate's before it built its iota as one tile;
# tests/platforms/_late_pass_kernel.py) reads back wrong from InferParamIndex on,
# v41.sparse_attention fails InferParamIndex too, and v41.hc_mixes
# cannot be executed after TuneTileOpSeqForVF / RemoveAlloc (FB200F).  There a FAILED
# cannot tell a lowering bug from an interpreter gap.
LOWERED_PASSES = PIPELINE[:PIPELINE.index("SubgraphToFunction")]
NOT_VERIFIED = PIPELINE[len(LOWERED_PASSES):]
GOOD = ("PASS", "NO_COMPARE")

_VERDICT = re.compile(
    r"\[VERIFY\]:(?:ErrCode: (?P<code>FB\w+)! )?(?P<stage>\S+) Verify\b.*?"
    r"(?P<result>[A-Z][A-Z_]+)\s*$")
_PASS = re.compile(r"_Pass_(?P<num>\d+|xx)_(?P<name>[A-Za-z0-9]+)$")
_EXEC_ERROR = re.compile(
    r"\[VERIFY\]:ErrCode: (?P<code>FB\w+)! VerifyPass failed for function (?P<func>\S+), "
    r"pass (?P<name>\w+)(?: \(passIndex: (?P<num>\d+))?")


class VerifyLevelError(ValueError):
    """``V41_VERIFY`` (or a verify argument) is not one of :data:`VERIFY_LEVELS`."""


def check_level(level: str, source: str = ENV_VERIFY) -> str:
    """``level`` if it is one of :data:`VERIFY_LEVELS`, else VerifyLevelError naming ``source``."""
    if level not in VERIFY_LEVELS:
        raise VerifyLevelError(f"{source}: {level!r} is not one of {VERIFY_LEVELS}")
    return level


def level_from_env() -> str:
    """The verify level named by ``V41_VERIFY`` (default ``tensor``)."""
    return check_level(os.environ.get(ENV_VERIFY, "") or DEFAULT_LEVEL)


def verify_options(level: str, dump_dir: Path) -> dict:
    """Keyword arguments of ``pypto.set_verify_options`` for ``level`` (no tensor dumps)."""
    if level == ESTIMATE_LEVEL:
        return {"enable_pass_verify": False, "pass_verify_save_tensor": False,
                "pass_verify_pass_filter": [], "pass_verify_save_tensor_dir": str(dump_dir)}
    check_level(level, "verify level")
    return {"enable_pass_verify": True, "pass_verify_save_tensor": False,
            "pass_verify_pass_filter": list(LOWERED_PASSES) if level == "lowered" else [],
            "pass_verify_save_tensor_dir": str(dump_dir)}


@dataclass(frozen=True)
class Verdict:
    """One verifier line: ``stage`` is ``tensor_graph`` or ``<function>_Pass_NN_<name>``."""

    stage: str
    result: str

    @property
    def pass_name(self) -> str | None:
        m = _PASS.search(self.stage)
        return m.group("name") if m else None

    @property
    def ok(self) -> bool:
        return self.result in GOOD


def parse_verdicts(text: str) -> list[Verdict]:
    """Every verdict in a pypto log (execution errors become result ``EXEC_ERROR``)."""
    out = []
    for line in text.splitlines():
        m = _EXEC_ERROR.search(line)
        if m:
            num = f"{int(m.group('num')):02d}" if m.group("num") else "xx"
            out.append(Verdict(f"{m.group('func')}_Pass_{num}_{m.group('name')}", "EXEC_ERROR"))
            continue
        m = _VERDICT.search(line)
        if m:
            out.append(Verdict(m.group("stage"), m.group("result")))
    return out


def summarize(verdicts: list[Verdict], level: str) -> dict:
    """``{"level", "tensor_graph", "passes", "failed", "error"}``; ``error`` is None when the
    launch may pass, else a sentence naming the failing stage(s) (or the missing verdict)."""
    tensor = [v for v in verdicts if v.stage == "tensor_graph"]
    passes = sorted({v.pass_name for v in verdicts if v.pass_name})
    failed = [v for v in verdicts if not v.ok]
    error = None
    if level == ESTIMATE_LEVEL:
        pass  # the interpreter did not run: there is no verdict to read
    elif failed:
        first = failed[0]
        if first.result == "EXEC_ERROR":
            head = f"the calculator could not execute pass {first.pass_name}"
        elif first.pass_name:
            head = f"pass {first.pass_name} changed the values"
        else:
            head = f"{first.stage} result {first.result}"
        detail = "; ".join(dict.fromkeys(f"{v.stage}: {v.result}" for v in failed[:5]))
        error = f"verify ({level}): {head} ({detail})"
    elif not tensor:
        error = f"verify ({level}): the verifier wrote no tensor_graph verdict"
    elif level == "lowered" and not passes:
        error = "verify (lowered): the verifier wrote no pass verdict"
    return {"level": level, "tensor_graph": sorted({v.result for v in tensor}),
            "passes": passes, "failed": [f"{v.stage}: {v.result}" for v in failed][:20],
            "error": error}


class LogCursor:
    """The text appended to the files under a log directory since the cursor was made."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._sizes = {p: p.stat().st_size for p in self._files()}

    def _files(self) -> list[Path]:
        return [p for p in self.root.rglob("*.log") if p.is_file()] if self.root.exists() else []

    def read_new(self) -> str:
        chunks = []
        for p in sorted(self._files()):
            start = self._sizes.get(p, 0)
            with open(p, "rb") as fh:
                fh.seek(start)
                chunks.append(fh.read().decode("utf-8", errors="replace"))
        return "".join(chunks)
