"""a5sim: ``V41_RECORD_LAUNCHES`` records a decode leaf's launches and ``harness.trace_row``
charges an output row's difference to the stage that made it.  One real TINY run of
``decode_attn_c1a_reuse`` (TP2, 8 rows, 7 active) is recorded and traced as produced (every
stage within FP32 reassociation of its golden piece, the row inside its bound); then a
defect is written into one recorded stage at a time and the trace names that stage, and
only it, on the right rank."""

from __future__ import annotations

import shutil

import pytest
import torch

from harness import launch_record, trace_row
from harness.case import Case
from harness.runner import run_case

CASE = Case(entry="decode_attn_c1a_reuse", tp=2, tokens=8, active_tokens=7, requests=3, seed=3,
            epochs=1, wiring="replicated")
ROW = 4
LOOSE = 1e-3  # relative RMS of an FP32-reassociation difference is ~1e-7; a defect is ~1


@pytest.fixture(scope="module")
def recorded(numerics, tmp_path_factory):
    where = tmp_path_factory.mktemp("records")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(launch_record.ENV, str(where))
        result = run_case(CASE, platform=numerics)
    assert result.status == "pass", result.failure_text()
    return where


def _stages(where) -> dict:
    res = trace_row.trace(where, CASE, ROW)
    return {(s.rank, s.name): s for s in res["stages"]}, res


def _edit(src, tmp_path, rank: int, module: str, side: str, key: str, fn):
    """A copy of the records with ``fn`` applied to row ``ROW`` of the first launch's
    ``side[key]`` of ``module`` on ``rank`` (the row is inside that launch: one launch per
    module at this size)."""
    where = tmp_path / "edited"
    shutil.copytree(src, where)
    [path] = [p for p in where.iterdir() if p.name.endswith(f"_{module}_r{rank}.pt")]
    rec = torch.load(path, weights_only=False)
    fn(rec[side][key][ROW])
    torch.save(rec, path)
    return where


def test_recorded_run_traces_within_rounding_and_the_row_inside_its_bound(recorded):
    assert launch_record.recorded_case(recorded)["entry"] == CASE.entry
    assert launch_record.ranks(recorded) == [0, 1]
    stages, res = _stages(recorded)
    names = ("x", "qr", "q", "kv", "window", "attention", "o_proj")
    assert set(stages) == {(r, n) for r in (0, 1) for n in names}
    for s in stages.values():
        assert s.rel_rms <= LOOSE, s.line()
    assert "kernel qr" in stages[(0, "qr")].note
    assert max(res["vs_golden"]) <= 1.0
    assert max(res["vs_golden_on_kernel_qr"]) <= 1.0


def test_a_defect_in_one_stage_is_charged_to_that_stage_on_that_rank(recorded, tmp_path):
    def bump(t):
        t.view(-1)[0] += 1.0

    where = _edit(recorded, tmp_path, 1, "v41.o_proj", "outs", "partial", bump)
    stages, res = _stages(where)
    moved = {k for k, s in stages.items() if s.rel_rms > LOOSE}
    assert moved == {(1, "o_proj")}
    assert res["vs_golden"][1] > 1.0 and res["vs_golden_on_kernel_qr"][1] > 1.0

    shutil.rmtree(where)
    where = _edit(recorded, tmp_path, 0, "v41.sparse_attention", "outs", "out", bump)
    moved = {k for k, s in _stages(where)[0].items() if s.rel_rms > LOOSE}
    assert moved == {(0, "attention")}  # rank 0's o_proj record still holds the true input


def test_a_second_case_is_refused_in_a_used_directory_and_recording_is_off_by_default(recorded, monkeypatch):
    monkeypatch.setenv(launch_record.ENV, str(recorded))
    with pytest.raises(ValueError, match="already holds the records of case"):
        launch_record.note_case(CASE.with_(seed=4))
    monkeypatch.delenv(launch_record.ENV)
    assert launch_record.directory() is None
    with pytest.raises(ValueError, match="dp, epochs"):
        trace_row.trace(recorded, CASE.with_(epochs=2), ROW)
