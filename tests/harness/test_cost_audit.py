"""``harness.cost_audit`` on a hand-made trace: the expected cycles are the A5 fast
simulator's formulas worked out by hand (pypto r0.2.0 PipeSimulatorFast.cpp), and the charge
function reproduces figures read from real pypto 0.2.0 traces."""

import json

import pytest

from harness import cost_audit


def _meta(pid, name):
    return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}


def _op(pid, ts, dur, text):
    return {"ph": "X", "pid": pid, "tid": 108, "ts": ts, "dur": dur, "name": text}


WIDE = "UB_[0,0][1024,16]-{a}-{b} 65536B"
NARROW = "UB_[0,0][1024,1]-{a}-{b} 4096B"


def _trace(tmp_path, machine=True):
    events = [
        _meta(40001, "AIV_1"), _meta(40002, "AIV_2"), _meta(30001, "AIC_1"),
        _meta(20001, "AICPU_0"),
        # a broadcast multiply charged from its [1024, 1] operand: 10 + 2*16 - 1 = 41
        _op(40001, 0, 41, "11 MUL 5 " + WIDE.format(a=5, b=1) + ",6 " + NARROW.format(a=6, b=2)
            + " TO 7 " + WIDE.format(a=7, b=3) + ", Task[1]-r"),
        # a gather from a 1-D GM table charged as one element: 11; its GM index is not a tile
        _op(40001, 41, 11, "12 GATHER 8 DDR_[0][384]-8-4 1536B,9 DDR_[0][16384]-9-5 65536B TO "
            "10 UB_[0][16384]-10-6 65536B, Task[1]-r"),
        # equal shapes: charged right, (0.76264*65536*2e-6 + 0.0221)*2000 + 1 -> 245
        _op(40001, 52, 245, "13 ADDS 7 " + WIDE.format(a=7, b=3) + " TO 11 "
            + WIDE.format(a=11, b=7) + " Task[1]-r"),
        # copies are not vector work; this one is logged past the machine-level end
        _op(40001, 1500, 1748, "14 COPY_IN 1 DDR_[0,0][40960,16]-1-1 655360B TO 2 "
            "UB_[0,0][1024,32]-2-2 32768B Task[1]-r"),
        _op(40002, 0, 521, "15 MUL 5 " + WIDE.format(a=5, b=1) + ",6 " + WIDE.format(a=6, b=2)
            + " TO 7 " + WIDE.format(a=7, b=3) + ", Task[2]-r"),
        # cube and AICPU events are not vector-core work
        _op(30001, 0, 5000, "16 A_MULACC_B 1 L0A_[0,0][16,64]-1-1 2048B TO 2 "
            "L0C_[0,0][16,256]-2-2 16384B Task[3]-r"),
        _op(20001, 0, 200, "Dispatch_Task_1"),
    ]
    if machine:  # the machine level's task spans set the launch's end
        events += [_meta(1000, "Top_Machine"), _op(1000, 0, 1200, "0-1-0-0-0 (a)")]
    path = tmp_path / cost_audit.TRACE_NAME
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_charge_reproduces_the_models_own_figures():
    # read from pypto 0.2.0 A5 traces of an FP4 tile decode: FP32 [1024, 16] tiles
    assert cost_audit.charge("MUL", 65536) == 521
    assert cost_audit.charge("ADDS", 65536) == 245
    assert cost_audit.charge("CAST", 65536) == 271
    assert cost_audit.charge("CAST", 16384) == 92  # uint8 [1024, 16] to FP32
    assert cost_audit.charge("GATHER", 4) == 11  # a 1-D operand, counted as one FP32


def test_audit_recomputes_from_the_largest_tile_operand(tmp_path):
    a = cost_audit.audit_trace(_trace(tmp_path))
    assert (a.end_cycles, a.trailing) == (1200, 1)
    assert set(a.ops) == {"MUL", "GATHER", "ADDS"}
    assert (a.ops["MUL"].count, a.ops["MUL"].charged, a.ops["MUL"].by_largest) == (
        2, 41 + 521, 521 + 521)
    assert (a.ops["GATHER"].charged, a.ops["GATHER"].by_largest) == (11, 521)
    assert (a.ops["ADDS"].charged, a.ops["ADDS"].by_largest) == (245, 245)
    # core 1: 41 + 11 + 245 charged, 521 + 521 + 245 recomputed; core 2: 521 both ways
    assert a.busiest_charged == 521
    assert a.busiest_by_largest == 1287
    assert (a.total_charged, a.total_by_largest, a.vector_cores) == (818, 1808, 2)
    assert [op for op, _ in a.rows()][:2] == ["GATHER", "MUL"]


def test_without_machine_events_the_end_is_the_last_event(tmp_path):
    a = cost_audit.audit_trace(_trace(tmp_path, machine=False))
    assert (a.end_cycles, a.trailing) == (5000, 0)


def test_cli_lists_each_trace_and_refuses_an_empty_directory(tmp_path, capsys):
    run = tmp_path / "run" / "launch-0001-probe-rank0" / "output"
    run.mkdir(parents=True)
    _trace(run)
    assert cost_audit.main([str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "launch-0001-probe-rank0" in out and "GATHER" in out
    assert "1 vector-core pipe events logged past the end" in out
    assert cost_audit.main([str(tmp_path / "nothing")]) == 1
    assert "no _simulate.pefetto.trace.json" in capsys.readouterr().out


@pytest.mark.parametrize("nbytes", [256, 4096, 65536])
def test_generic_ops_cost_two_cycles_per_256_bytes(nbytes):
    assert cost_audit.charge("FLOOR", nbytes) == 10 + 2 * (nbytes // 256) - 1
