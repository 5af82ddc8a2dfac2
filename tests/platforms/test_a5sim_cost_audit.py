"""``harness.cost_audit`` on a real A5 cost-model trace (the FP4 decode probe): where every
operand is the same tile, the audit's charge equals the model's; the table gathers are charged
far below their output tile."""

import json
import re

import pytest
import torch

from harness import cost_audit
from harness.case import Case
from harness.platforms import KernelSpec, verify
from harness.platforms.a5sim import A5SimPlatform

CONFIG = Case(entry="rmsnorm", preset="tiny").config


@pytest.fixture
def kept_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("V41_KEEP_RUN_DIR", "1")
    platform = A5SimPlatform(run_root=tmp_path, verify=verify.ESTIMATE_LEVEL)
    ok, why = platform.available()
    if not ok:
        pytest.skip(why)
    n, k = 64, 1024
    args = {"packed": torch.zeros((1, n, k // 2), dtype=torch.uint8),
            "scales": torch.full((1, n, k // 32), 127, dtype=torch.uint8),
            "lo": torch.zeros((n, k // 2), dtype=torch.bfloat16),
            "hi": torch.zeros((n, k // 2), dtype=torch.bfloat16)}
    spec = KernelSpec("v41.decode_probe", {}, builder="build_fp4", abi="abi_fp4")
    try:
        program = platform.compile(spec, CONFIG, {"n": n, "k": k})
        platform.launch(program, 0, args).raise_for_error()
    finally:
        platform.close()
    found = cost_audit.traces(tmp_path)
    assert len(found) == 1
    return found[0]


def _two_d_equal_tile_ops(path):
    """``(op, bytes, charged)`` of the vector ops whose operands are all 2-D UB tiles of one
    size (where the smallest-operand rule is exact)."""
    events = json.loads(path.read_text())["traceEvents"]
    found = []
    for e in events:
        m = re.match(r"\d+ ([A-Z][A-Z_0-9]*) (.*)", e.get("name", ""))
        if e.get("ph") != "X" or not m or m.group(1) in cost_audit.NOT_VECTOR_WORK:
            continue
        operands = re.findall(r"(\w+)_\[[^\]]*\]\[([^\]]*)\](?:-\d+-\d+)? (\d+)B", m.group(2))
        if (operands and all(kind == "UB" and dims.count(",") == 1 for kind, dims, _ in operands)
                and len({b for _, _, b in operands}) == 1):
            found.append((m.group(1), int(operands[0][2]), int(e["dur"])))
    return found


def test_equal_tiles_are_charged_as_the_model_does_and_gathers_far_below(kept_trace):
    equal = _two_d_equal_tile_ops(kept_trace)
    assert {"MUL", "ADDS", "CAST"} <= {op for op, _, _ in equal}
    assert [(op, b, d) for op, b, d in equal if cost_audit.charge(op, b) != d] == []
    a = cost_audit.audit_trace(kept_trace)
    g = a.ops["GATHER"]
    assert g.charged <= 21 * g.count  # charged by a 1-D table operand: one element
    assert g.by_largest > 10 * g.charged
    assert a.busiest_by_largest > a.busiest_charged
