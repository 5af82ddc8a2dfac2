"""a5sim: v41.lm_head through its harness entry (one launch per TP rank, picks combined on
the host) equals the golden at TINY (logits by the per-row and FP32-accumulation bounds,
picks exactly, ties to the lowest vocab index inside a tile, across tiles and across ranks),
deliberately wrong kernels and a wrong rank combine fail the comparison, and bad input is
refused on the host before anything is compiled or launched."""

from __future__ import annotations

import pytest
import torch

from goldens.boundary import greedy_sample
from harness import registry
from harness.case import Case
from harness.entries import lm_head as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch
from v41.lm_head import dims, vocab_tile

ENTRY = "lm_head"
TIES4 = Case(entry=ENTRY, tokens=9, tp=4, kind="ties")
PADDED2 = Case(entry=ENTRY, tokens=40, active_tokens=17, tp=2)  # padding rows on two ranks
PLAIN = Case(entry=ENTRY, tokens=21)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


@pytest.fixture(scope="module")
def ties4(numerics):
    return run_with(numerics, TIES4, entry_mod.kernel_sut())


def _tie_rows(case):
    return [t for t in range(case.tokens) if t % 3 != 0]


def test_ties_across_tiles_and_ranks_go_to_the_lowest_index(ties4):
    verdicts, out, gold = ties4
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    rows = _tie_rows(TIES4)
    # the copied row is the maximum of every tie row, at 70 and 75 (rank 0, one tile),
    # 300 (rank 2) and 501 (rank 3), with exactly equal kernel logits there
    for t in rows:
        assert len({float(out["logits"][t, p]) for p in entry_mod.TIE_POSITIONS}) == 1
    assert gold["ids"][rows].tolist() == [70] * len(rows)
    assert out["ids"][rows].tolist() == [70] * len(rows)
    assert out["rank_best_index"][0, rows].tolist() == [70] * len(rows)
    assert out["rank_best_index"][2, rows].tolist() == [300] * len(rows)
    assert out["rank_best_index"][3, rows].tolist() == [501] * len(rows)
    assert torch.equal(out["ids"], greedy_sample(gold["logits"]))


def test_rank_combine_breaks_ties_toward_the_lowest_rank():
    values = torch.tensor([[1.0, 2.0, 5.0], [3.0, 2.0, 5.0], [3.0, 1.0, 6.0]])
    indices = torch.tensor([[0, 1, 2], [10, 11, 12], [20, 21, 22]], dtype=torch.int32)
    best, idx = entry_mod.combine_rank_picks(values, indices)
    assert best.tolist() == [3.0, 2.0, 6.0] and idx.tolist() == [10, 1, 22]
    with pytest.raises(ValueError, match=r"values/indices: must both be \[tp >= 1, R\]"):
        entry_mod.combine_rank_picks(values, indices[:, :2])
    with pytest.raises(ValueError, match="values: contains NaN"):
        entry_mod.combine_rank_picks(values.index_fill(1, torch.tensor([0]), float("nan")),
                                     indices)


def _highest_rank_on_ties(values, indices):
    best, idx = values[0].clone(), indices[0].clone()
    for r in range(1, values.shape[0]):
        take = values[r] >= best
        best, idx = torch.where(take, values[r], best), torch.where(take, indices[r], idx)
    return best, idx


def test_wrong_rank_combine_fails_the_comparison(ties4):
    """The kernels' own outputs of the TP4 ties case, combined with the highest rank winning
    ties: the combined pick fails, the per-rank picks still pass."""
    _, out, gold = ties4
    inputs = registry.get(ENTRY).build_inputs(TIES4.config, TIES4)
    wrong = dict(out)
    wrong["best_value"], wrong["ids"] = _highest_rank_on_ties(out["rank_best_value"],
                                                              out["rank_best_index"])
    assert wrong["ids"][_tie_rows(TIES4)].tolist() == [501] * len(_tie_rows(TIES4))
    verdicts = entry_mod.compare(TIES4.config, TIES4, inputs, gold, wrong)
    assert failing(verdicts) == {("ids", "pick_self"), ("ids", "pick_golden")}


@pytest.mark.parametrize("case", [
    PLAIN, PADDED2, Case(entry=ENTRY, tokens=8, active_tokens=0, tp=2),
    Case(entry=ENTRY, tokens=240, active_tokens=200),  # a second, partial row tile
])
def test_equals_the_golden(numerics, case):
    verdicts, out, gold = run_with(numerics, case, entry_mod.kernel_sut())
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    n = case.active
    # the kernel's picks equal the golden's on every row, near-tied ones included (the
    # 200-row fixture has one: the comparison would have accepted either id there)
    assert torch.equal(out["ids"], gold["ids"])
    assert torch.equal(out["rank_best_index"], gold["rank_best_index"])
    assert bool((out["logits"][n:] == 0).all())


@pytest.mark.parametrize("variant,case,expect", [
    ("higher_index_ties", Case(entry=ENTRY, tokens=6, tp=2, kind="ties"),
     {(f"rank_best_index[{r}]", c) for r in (0, 1) for c in ("pick_self", "pick_golden")}
     | {("ids", "pick_self"), ("ids", "pick_golden")}),
    # BF16 logits stay inside the contract's per-row bound (2^-9 relative per element):
    # only the FP32-accumulation bound sees them
    ("bf16_logits", PLAIN, {("logits", "fp32_accumulation")}),
    ("local_index", Case(entry=ENTRY, tokens=21, tp=2),
     {("rank_best_index[1]", "pick_self"), ("rank_best_index[1]", "pick_golden"),
      ("ids", "pick_self"), ("ids", "pick_golden")}),
    ("skip_padding", Case(entry=ENTRY, tokens=40, active_tokens=17),
     {("logits", "zero_rows"), ("rank_best_index[0]", "pick_self"),
      ("rank_best_index[0]", "pick_golden"), ("ids", "pick_self"), ("ids", "pick_golden")}),
])
def test_wrong_kernel_fails_the_comparison(numerics, variant, case, expect):
    verdicts, _, _ = run_with(numerics, case, entry_mod.kernel_sut(variant=variant))
    assert failing(verdicts) == expect, [v.line() for v in verdicts if not v.passed]


def test_near_ties_accept_either_id_and_far_apart_rows_do_not():
    gold = torch.tensor([[1.0, 1.0 + 1e-6, 0.0], [2.0, 1.0, 0.0], [3.0, 3.0, 0.0]])
    bound = torch.full((3, 3), 1e-6, dtype=torch.float64)
    ok = entry_mod._pick_golden("ids", gold, bound, torch.tensor([0, 0, 0]), 0)[0]
    assert ok.passed and "1 near-tied rows" in ok.note  # row 0: either of ids 0 and 1
    bad = entry_mod._pick_golden("ids", gold, bound, torch.tensor([1, 1, 1]), 0)[0]
    assert not bad.passed and bad.failing_rows == (1, 2)  # far apart; exact tie -> lowest


def _inputs(case=PADDED2):
    return registry.get(ENTRY).build_inputs(case.config, case)


@pytest.mark.parametrize("field,value,match", [
    ("num_rows", torch.tensor([41], dtype=torch.int32), r"num_rows: 41 outside \[0, T=40\]"),
    ("num_rows", torch.tensor([-1], dtype=torch.int32), r"num_rows: -1 outside \[0, T=40\]"),
    ("num_rows", torch.tensor([3], dtype=torch.int64), r"num_rows: must be INT32 \[1\]"),
    ("hidden", "fp32", r"hidden: must be bfloat16 \[R >= 1, 256\]"),
    ("head", "bf16", r"head: must be float32 \[512, 256\]"),
    ("head", "nan", r"head: contains NaN or Inf"),
    ("hidden", "inf", r"hidden: contains NaN or Inf"),
])
def test_host_refuses_bad_input_before_launching(field, value, match):
    inputs = _inputs()
    if value == "fp32":
        inputs["hidden"] = inputs["hidden"].float()
    elif value == "bf16":
        inputs["head"] = inputs["head"].to(torch.bfloat16)
    elif value == "nan":
        inputs["head"][3, 4] = float("nan")
    elif value == "inf":
        inputs["hidden"][0, 0] = float("inf")
    else:
        inputs[field] = value
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), PADDED2.config, PADDED2, inputs)
    assert all(torch.equal(inputs[k].view(torch.uint8), before[k].view(torch.uint8))
               for k in inputs)  # bytes: a NaN equals itself


def test_the_long_case_spans_two_row_tiles():
    from v41.lm_head import ROW_TILE
    assert ROW_TILE < 200 < 2 * ROW_TILE


def test_vocab_tiles_and_rank_bounds():
    from goldens.config import FLASH, TINY
    assert [vocab_tile(FLASH.vocab_size // tp) for tp in (1, 2, 4)] == [256, 128, 64]
    assert dims(TINY, {"tokens": 3, "tp": 4, "rank": 3})["vocab_local"] == 128
    with pytest.raises(ValueError, match=r"case\['rank'\]: 4 outside \[0, tp=4\)"):
        dims(TINY, {"tokens": 3, "tp": 4, "rank": 4})
    with pytest.raises(ValueError, match="vocab_local: 100 is not a multiple of 8"):
        vocab_tile(100)


def test_default_matrix_covers_tp_kinds_and_padding():
    matrix = registry.get(ENTRY).matrix
    assert {c.tp for c in matrix} == {1, 2, 4}
    assert {c.kind for c in matrix} == {"mixed", "ties"}
    assert any(c.active < c.tokens for c in matrix)
