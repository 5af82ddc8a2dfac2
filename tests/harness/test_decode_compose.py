"""The ``decode_<mode>`` mHC compositions: registered with the contract's split, and their
comparison catches each defect of the composition's own outputs by name (the golden's
outputs stand in for a SUT, so these run without a kernel)."""

from __future__ import annotations

import pytest
import torch

from harness.entries import decode_compose
from harness.fixtures import STREAM_SENTINEL, clone_tensors
from harness.verdict import all_passed

MODES = ("swa", "c2a_full", "c2a_reuse", "c1a_full", "c1a_reindex", "c1a_reuse")


def test_six_compositions_with_tp1_and_the_reserved_tp4_case_in_both_wirings():
    assert set(decode_compose.ENTRIES) == {f"decode_{m}" for m in MODES}
    for name, entry in decode_compose.ENTRIES.items():
        assert set(entry.kernels) == {"a5sim", "a5"} and entry.alternate is None
        combos = {(c.tp, c.dp, c.wiring) for c in entry.matrix}
        assert combos == {(1, 1, "replicated"), (1, 1, "sharded"), (4, 1, "replicated"), (4, 1, "sharded")}
        reserved = {(c.tokens, c.active, c.requests, c.epochs, c.wiring) for c in entry.matrix if c.tp == 4}
        assert reserved == {(33, 31, 6, 2, "replicated"), (33, 31, 6, 2, "sharded")}, name
        assert any(c.kind == "first" for c in entry.matrix)  # the one-hot first-site pre-mix
        assert [(c.tp, c.tokens, c.preset) for c in entry.slow_cases] == [(4, 192, "flash")]


@pytest.fixture(scope="module")
def golden_run():
    entry = decode_compose.ENTRIES["decode_c1a_reuse"]
    case = entry.matrix[2].with_(tp=1, epochs=1)  # 33 rows, 31 active
    inputs = entry.build_inputs(case.config, case)
    gold = entry.golden(case.config, case, clone_tensors(inputs))
    return entry, case, inputs, gold


def _failing(entry, case, inputs, gold, actual):
    return {(v.output, v.check) for v in entry.compare(case.config, case, inputs, gold, actual) if not v.passed}


def test_the_golden_as_sut_passes(golden_run):
    entry, case, inputs, gold = golden_run
    actual = clone_tensors(gold)
    assert all_passed(entry.compare(case.config, case, inputs, gold, actual))
    assert bool((actual["attention_output"][0, case.active:] == inputs["attention_output"][0, case.active:]).all())


@pytest.mark.parametrize("defect,expected", [
    (lambda a: a["x_hc_out"][0, 4, 1].mul_(1.5), ("g0.x_hc_out", "row_rms")),
    (lambda a: a["pre_out"][0, 2].add_(0.5), ("g0.pre_out", "row_rms")),
    (lambda a: a["attention_output"][0, 32].fill_(0.0), ("g0.attention_output", "exact_bytes")),
    (lambda a: a["attention_output"][0, 3, 7].mul_(2.0), ("g0.attention_output", "exact_bytes")),
])
def test_each_composition_defect_is_caught_by_name(golden_run, defect, expected):
    entry, case, inputs, gold = golden_run
    actual = clone_tensors(gold)
    defect(actual)
    assert expected in _failing(entry, case, inputs, gold, actual)


def test_a_written_stream_value_of_13_is_not_a_missing_write(golden_run):
    """13.0 (the reference's sentinel) is a common residual-stream value at FLASH: a written
    element holding it beside a reference one BF16 ulp away is the row bound's to judge, not
    an unwritten element; one left at the stream buffer's own sentinel still is."""
    entry, case, inputs, gold = golden_run
    assert float(torch.tensor(STREAM_SENTINEL).to(torch.bfloat16)) != STREAM_SENTINEL
    assert bool((inputs["x_hc_out"] == STREAM_SENTINEL).all())
    actual = clone_tensors(gold)
    assert float(actual["x_hc_out"][0, 4, 1, 7]) != 13.0
    actual["x_hc_out"][0, 4, 1, 7] = 13.0
    assert ("g0.x_hc_out", "sentinel") not in _failing(entry, case, inputs, gold, actual)
    actual = clone_tensors(gold)
    actual["x_hc_out"][0, 4, 1, 7] = inputs["x_hc_out"][0, 4, 1, 7]
    assert ("g0.x_hc_out", "sentinel") in _failing(entry, case, inputs, gold, actual)


def test_a_missing_stream_output_is_a_failure(golden_run):
    entry, case, inputs, gold = golden_run
    actual = clone_tensors(gold)
    del actual["x_hc_out"]
    assert ("x_hc_out", "present") in _failing(entry, case, inputs, gold, actual)


def test_hc_post_is_replayed_on_the_suts_own_attention_output(golden_run):
    """An attention output inside its budget but different from the golden's: the streams
    are judged against hc_post of THAT output, not charged the difference twice."""
    entry, case, inputs, gold = golden_run
    actual = clone_tensors(gold)
    nudge = (actual["out"][0, :case.active].float() * (1 + 2.0 ** -7)).to(torch.bfloat16)
    actual["out"][0, :case.active] = nudge
    actual["attention_output"][0, :case.active] = nudge
    from goldens.mhc import hc_post
    actual["x_hc_out"][0] = hc_post(actual["out"][0], inputs["g0.x_hc"], gold["g0.mix_post"], gold["g0.mix_comb"],
                                    case.config)
    bad = _failing(entry, case, inputs, gold, actual)
    assert not {b for b in bad if b[0] == "g0.x_hc_out"}


# ---- prefill_<mode>: the sequence-parallel site (inactive rows exact zero) ---------------------

def test_six_prefill_sp_compositions_are_sharded_with_reserved_capacity():
    assert set(decode_compose.PREFILL_ENTRIES) == {f"prefill_{m}" for m in MODES}
    for name, entry in decode_compose.PREFILL_ENTRIES.items():
        assert set(entry.kernels) == {"a5sim", "a5"} and entry.support.wirings == ("sharded",)
        assert all(c.wiring == "sharded" and c.active < c.tokens for c in entry.matrix), name
        assert any(c.kind == "first" and c.tp > 1 for c in entry.matrix), name


@pytest.fixture(scope="module")
def sp_golden_run():
    entry = decode_compose.PREFILL_ENTRIES["prefill_c1a_reindex"]
    case = entry.matrix[0]  # TP2, 13 rows, 11 active
    inputs = entry.build_inputs(case.config, case)
    gold = entry.golden(case.config, case, clone_tensors(inputs))
    return entry, case, inputs, gold


def test_the_sp_golden_zeroes_every_inactive_row_and_passes_as_sut(sp_golden_run):
    entry, case, inputs, gold = sp_golden_run
    n = case.active
    for name in ("x_hc_out", "pre_out", "attention_output"):
        assert bool((gold[name][:, n:] == 0).all()), name
        assert bool((gold[name][:, :n] != 0).any()), name
    assert all_passed(entry.compare(case.config, case, inputs, gold, _sp_actual(case, gold)))


def _sp_actual(case, gold):
    """The golden as a sharded SUT's result: plus the slab tail past T (zero, none here)."""
    actual = clone_tensors(gold)
    tail = -(-case.tokens // case.tp) * case.tp - case.tokens
    actual["out_slab_tail"] = torch.zeros(case.dp, tail, case.config.hidden_size)
    return actual


@pytest.mark.parametrize("defect,expected", [
    # each rank's shard is named on its own: 13 rows in slabs of 7, row n = 11 is rank 1's
    (lambda a, n: a["x_hc_out"][0, n, 2, 5].fill_(1.0), ("g0.r1.x_hc_out", "zero_rows")),
    (lambda a, n: a["pre_out"][0, n + 1, 0].fill_(0.25), ("g0.r1.pre_out", "zero_rows")),
    (lambda a, n: a["attention_output"][0, n, 3].fill_(1.0), ("g0.attention_output", "exact_bytes")),
    (lambda a, n: a["x_hc_out"][0, 1, 0].mul_(1.5), ("g0.r0.x_hc_out", "row_rms")),
    (lambda a, n: a["x_hc_out"][0, 8, 0].mul_(1.5), ("g0.r1.x_hc_out", "row_rms")),
])
def test_each_sp_defect_is_caught_by_name(sp_golden_run, defect, expected):
    entry, case, inputs, gold = sp_golden_run
    actual = _sp_actual(case, gold)
    defect(actual, case.active)
    assert expected in _failing(entry, case, inputs, gold, actual)
