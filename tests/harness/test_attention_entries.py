"""The attention-mode entries fail through the harness when the SUT is wrong.

Each test registers a temporary copy of an entry whose alternate path is broken in one
way (a wrong output row, a non-zero padding row, a write to a non-owned cache byte, a
duplicate Top-K entry, ...) and asserts the case fails with exactly the verdict that
names it.  Also: the fixture is a deterministic flat dict with nonidentity tables, a
saved case replays, and an accepted non-nominal Top-K selection is judged against an
output recomputed for that selection.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import registry
from harness.compare import TopKResult
from harness.entries import attention
from harness.fixtures import SENTINEL
from harness.replay import replay_folder
from harness.runner import run_case
from harness.verdict import Verdict


def _case(entry: str, **axes):
    return registry.get(entry).matrix[0].with_(**axes)


def run_broken(monkeypatch, entry: str, mutate, **axes):
    """Run ``entry``'s first matrix case (with ``axes``) against its alternate path followed
    by ``mutate(config, case, inputs, outputs)``."""
    base = registry.get(entry)

    def sut(platform, config, case, inputs):
        produced = base.alternate(platform, config, case, inputs)
        mutate(config, case, inputs, produced.outputs)
        return produced

    name = f"{entry}_broken"  # keeps the phase prefix the fixture reads
    with registry.registered(dataclasses.replace(base, name=name, alternate=sut)):
        return run_case(_case(entry, **axes).with_(entry=name))


def failed(result) -> set[tuple[str, str]]:
    assert result.status == "fail", result.failure_text()
    return {(v.output, v.check) for v in result.verdicts if not v.passed}


def test_every_entry_is_registered_with_its_matrix():
    modes = ("swa", "c2a_full", "c2a_reuse", "c1a_full", "c1a_reindex", "c1a_reuse")
    assert set(attention.ENTRIES) == ({f"golden_alt_prefill_attn_{m}" for m in modes} | {f"decode_attn_{m}" for m in modes}
                                      | {f"prefill_attn_{m}" for m in modes}
                                      | {f"golden_alt_decode_attn_{m}" for m in modes})
    for name, entry in attention.ENTRIES.items():
        combos = {(c.tp, c.dp, c.wiring) for c in entry.matrix}
        reserved = [c for c in entry.matrix if c.active < c.tokens]
        if name.startswith("decode_attn_"):  # the kernel leaf: (2,2) in both wirings, TP4 reserved
            assert reserved and set(entry.kernels) == {"a5sim", "a5"} and entry.alternate is None
            assert {(2, 2, "replicated"), (2, 2, "sharded"), (4, 1, "replicated")} == combos
            assert (4, 33, 31, 6, 2) in {(c.tp, c.tokens, c.active, c.requests, c.epochs) for c in reserved}, name
            assert [(c.tp, c.tokens, c.preset) for c in entry.slow_cases] == [(4, 192, "flash")]
            continue
        if name.startswith("prefill_attn_"):  # the prefill kernel leaf: replicated output
            assert set(entry.kernels) == {"a5sim", "a5"} and entry.support.wirings == ("replicated",)
            assert combos == {(2, 2, "replicated")}
            assert any(c.tp == 4 and c.active < c.tokens for c in entry.slow_cases)
            continue
        assert reserved and all(c.tp == 4 for c in reserved), name
        if "decode" in name:
            assert not entry.kernels and entry.alternate is not None
            assert {(1, 1, "replicated"), (1, 1, "sharded"), (4, 1, "replicated"),
                    (4, 1, "sharded")} <= combos and any(c[:2] == (2, 2) for c in combos)
            assert [(c.tp, c.tokens, c.preset) for c in entry.slow_cases] == [(4, 192, "flash")]
        else:
            assert {(1, 1, "replicated"), (4, 1, "replicated")} <= combos
            assert entry.support.wirings == ("replicated",)
        assert set(entry.support.kinds) == {c.kind for c in entry.matrix}, name


def test_fixture_is_deterministic_flat_and_nonidentity():
    case = _case("golden_alt_decode_attn_c1a_reindex", dp=2, tp=2)
    config = case.config
    entry = registry.get("golden_alt_decode_attn_c1a_reindex")
    a, b = entry.build_inputs(config, case), entry.build_inputs(config, case)
    assert a.keys() == b.keys() and all(isinstance(t, torch.Tensor) for t in a.values())
    assert all(torch.equal(a[k].view(torch.uint8) if a[k].element_size() == 1 else a[k],
                           b[k].view(torch.uint8) if b[k].element_size() == 1 else b[k]) for k in a)
    for g in (0, 1):
        table = a[f"g{g}.meta.window_block_table"]
        live = table[table >= 0]
        assert not torch.equal(live, torch.arange(live.numel(), dtype=live.dtype))
        assert bool(a[f"g{g}.scratch.published"][6])  # the candidate source ran first
        assert bool(a[f"g{g}.cache.candidate_mask.L6"].any())
    assert bool((a["out"] == SENTINEL).all())
    assert not torch.equal(a["g0.x"], a["g1.x"])  # independent DP groups


def test_a_wrong_output_row_fails_the_row_bound(monkeypatch):
    def mutate(config, case, inputs, out):
        out["out"][0, 2] *= 1.5
    bad = failed(run_broken(monkeypatch, "golden_alt_decode_attn_c1a_full", mutate))
    assert ("g0.out", "row_rms") in bad and ("g0.out", "row_peak") in bad
    assert all(o == "g0.out" for o, _ in bad)


def test_a_wrong_row_of_the_second_dp_group_fails_the_c2a_budget(monkeypatch):
    def mutate(config, case, inputs, out):
        out["out"][1, 1] *= 1.1
    result = run_broken(monkeypatch, "golden_alt_prefill_attn_c2a_full", mutate, tp=1, dp=2)
    assert failed(result) == {("g1.out", "row_rel_l2"), ("g1.out", "rel_l2"), ("g1.out", "cosine")}
    row = next(v for v in result.verdicts if v.check == "row_rel_l2" and not v.passed)
    assert row.failing_rows == (1,)


def test_swa_and_c2a_use_the_attention_budget_and_c1a_the_strict_row_bound():
    # reference-facts 6.3 / 6.4: decode_attn_swa and decode_attn_c2a_full compare with the
    # Attention budget; the strict per-row RMS/peak bound is C1A's
    budgets = {s.mode: s.budget for s in attention.MODES}
    assert budgets == {attention.Mode.SWA: "attention", attention.Mode.C2A_FULL: "attention",
                       attention.Mode.C2A_REUSE: "attention", attention.Mode.C1A_FULL: "row",
                       attention.Mode.C1A_REINDEX: "row", attention.Mode.C1A_REUSE: "row"}


def test_a_swa_row_3_percent_off_fails_the_attention_budget_on_that_row(monkeypatch):
    def mutate(config, case, inputs, out):
        out["out"][0, 3] *= 1.03
    result = run_broken(monkeypatch, "golden_alt_decode_attn_swa", mutate)
    assert ("g0.out", "row_rel_l2") in failed(result)
    row = next(v for v in result.verdicts if v.check == "row_rel_l2" and not v.passed)
    assert row.failing_rows == (3,)


def test_a_non_zero_padding_row_fails(monkeypatch):
    def mutate(config, case, inputs, out):
        out["out"][0, 32, 5] = 1.0
    result = run_broken(monkeypatch, "golden_alt_decode_attn_swa", mutate, tp=4, tokens=33, active_tokens=31,
                        requests=6, wiring="sharded")
    assert failed(result) == {("g0.out", "zero_rows")}
    assert next(v for v in result.verdicts if not v.passed).row == 32


def test_a_missing_write_leaves_the_sentinel(monkeypatch):
    def mutate(config, case, inputs, out):
        out["out"][0, 3] = SENTINEL
    assert ("g0.out", "sentinel") in failed(run_broken(monkeypatch, "golden_alt_prefill_attn_swa", mutate))


@pytest.mark.parametrize("entry,key", [("golden_alt_decode_attn_c2a_reuse", "g0.cache.compressed_kv.L2"),
                                       ("golden_alt_decode_attn_c1a_reindex", "g0.cache.topk_rows.L6"),
                                       ("golden_alt_decode_attn_swa", "g0.cache.window_kv.L1")])
def test_a_write_to_a_non_owned_cache_fails(monkeypatch, entry, key):
    def mutate(config, case, inputs, out):
        out[key].view(torch.uint8).view(-1)[7] ^= 0x10
    assert failed(run_broken(monkeypatch, entry, mutate)) == {(key, "exact_bytes")}


def test_a_write_outside_the_published_slots_of_an_owned_cache_fails(monkeypatch):
    key = "g0.cache.window_kv_scale.L0"

    def mutate(config, case, inputs, out):
        table = inputs["g0.meta.window_block_table"]
        spare = min(set(range(out[key].shape[0])) - set(table[table >= 0].tolist()))
        out[key][spare, 0] += 1  # a row of a block nobody addresses
    result = run_broken(monkeypatch, "golden_alt_decode_attn_swa", mutate)
    assert failed(result) == {(key, "exact_bytes")}


def test_a_corrupted_state_ring_slot_fails(monkeypatch):
    key = "g0.cache.state_cache.L2"

    def mutate(config, case, inputs, out):
        out[key] += 0.5  # every slot: written ones exceed the bound, the rest change bytes
    bad = failed(run_broken(monkeypatch, "golden_alt_decode_attn_c2a_full", mutate))
    assert {(key, "state_row_rel_l2"), (key, "exact_bytes")} <= bad


def test_a_duplicate_topk_entry_fails_acceptance(monkeypatch):
    def mutate(config, case, inputs, out):
        out["topk"][0, 0, 1] = out["topk"][0, 0, 0]
        out["g0.cache.topk_rows.L6"].copy_(out["topk"][0])
    result = run_broken(monkeypatch, "golden_alt_decode_attn_c1a_full", mutate)
    assert ("g0.topk", "topk_unique") in failed(result)
    unique = next(v for v in result.verdicts if v.check == "topk_unique")
    assert unique.failing_rows == (0,)


def test_reuse_must_attend_to_the_source_rows(monkeypatch):
    def mutate(config, case, inputs, out):
        out["topk"][0] = out["topk"][0].roll(1, dims=0)
    assert ("g0.topk", "exact_bytes") in failed(run_broken(monkeypatch, "golden_alt_decode_attn_c1a_reuse", mutate))


def test_replicas_must_be_byte_identical(monkeypatch):
    def mutate(config, case, inputs, out):
        out["out_ranks"][0, 3, 1, 0] += 1
    result = run_broken(monkeypatch, "golden_alt_decode_attn_swa", mutate, tp=4)
    assert failed(result) == {("g0.out_ranks", "replica_bytes")}


def test_rank_outputs_must_come_back(monkeypatch):
    def drop(config, case, inputs, out):
        del out["out_ranks"], out["topk_ranks"]
    result = run_broken(monkeypatch, "golden_alt_decode_attn_c1a_full", drop, tp=4)
    assert {c for _, c in failed(result)} == {"present"}


def test_identical_garbage_in_every_rank_fails(monkeypatch):
    def garbage(config, case, inputs, out):
        out["out_ranks"].fill_(7.0)
    result = run_broken(monkeypatch, "golden_alt_decode_attn_swa", garbage, tp=4)
    assert failed(result) == {("g0.out_ranks[0]", "exact_bytes")}


def test_sharded_slab_tail_must_come_back(monkeypatch):
    def drop(config, case, inputs, out):
        del out["out_slab_tail"]
    result = run_broken(monkeypatch, "golden_alt_decode_attn_swa", drop, tp=4, wiring="sharded")
    assert failed(result) == {("out_slab_tail", "present")}


def test_a_missing_cache_output_is_a_failure(monkeypatch):
    def mutate(config, case, inputs, out):
        del out["g0.cache.window_kv.L6"]
    assert failed(run_broken(monkeypatch, "golden_alt_prefill_attn_c1a_reindex", mutate)) == {("g0.cache.window_kv.L6", "present")}


def _swap_one(out, token: int):
    """Replace the first selected row of ``token`` by a row it did not select."""
    rows = out["topk"][0, token]
    chosen = set(rows.tolist())
    rows[0] = next(r for r in range(10_000) if r not in chosen)


def test_an_accepted_other_selection_is_judged_against_its_own_reference(monkeypatch):
    """With acceptance forced, a SUT attending to another selection passes only when its
    output is the output of that selection (recomputed from the reference caches)."""
    accepted = TopKResult((Verdict("g0.topk", "topk_forced", True, None, 0.0, 0.0, 0.0, "forced"),),
                          True, (0,))
    monkeypatch.setattr(attention, "check_topk", lambda *a, **k: accepted)
    base = registry.get("golden_alt_decode_attn_c1a_full")

    def consistent(config, case, inputs, out):
        from harness.entries.attention_paths import output_reference
        _swap_one(out, 0)
        out["g0.cache.topk_rows.L6"].copy_(out["topk"][0])
        inputs = base.build_inputs(config, case)
        gold = base.golden(config, case, inputs)
        out["out"][0] = output_reference(config, case, inputs, gold, 0, config.representative_layer(
            attention.Mode.C1A_FULL), out["topk"][0])

    def nominal_output(config, case, inputs, out):
        _swap_one(out, 0)
        out["g0.cache.topk_rows.L6"].copy_(out["topk"][0])

    assert run_broken(monkeypatch, "golden_alt_decode_attn_c1a_full", consistent).status == "pass"
    bad = failed(run_broken(monkeypatch, "golden_alt_decode_attn_c1a_full", nominal_output))
    assert ("g0.out", "row_rms") in bad


def _latents_with_row_changed(config, case, inputs, layer, row: int):
    """Every rank's golden Q-A latent with ``row`` changed (one element doubled), as a
    kernel SUT returns them (``qr_ranks`` ``[dp, tp, T, q_lora]``)."""
    from goldens.qkv import q_lora
    from harness.entries.attention_fixture import weights_from
    qr = q_lora(inputs["g0.x"], weights_from(config, layer, inputs).attn.qkv, config)
    qr[row, 3] *= 2
    return qr.expand(case.dp, case.tp, *qr.shape).clone()


def test_an_accepted_qr_is_judged_against_its_own_reference(monkeypatch):
    """A SUT row whose Q-A latent is accepted (forced here) is judged against the output
    recomputed on that latent; the real rule does not accept a doubled element, so the
    same output fails the row bound against the nominal reference."""
    entry = "golden_alt_decode_attn_c1a_reuse"
    base = registry.get(entry)

    def consistent(config, case, inputs, out):
        from harness.entries.attention_paths import output_reference
        layer = config.representative_layer(attention.Mode.C1A_REUSE)
        inputs = base.build_inputs(config, case)
        gold = base.golden(config, case, inputs)
        out["qr_ranks"] = _latents_with_row_changed(config, case, inputs, layer, 1)
        out["out"][0] = output_reference(config, case, inputs, gold, 0, layer, None, list(out["qr_ranks"][0]))

    forced = {}
    real = attention.qr_rounding.accept_row
    monkeypatch.setattr(attention.qr_rounding, "accept_row", lambda *a: forced.get("accept", real(*a)))
    forced["accept"] = True
    result = run_broken(monkeypatch, entry, consistent)
    assert result.status == "pass", result.failure_text()
    note = next(v.note for v in result.verdicts if v.output == "g0.out" and v.check == "row_rms")
    assert "rows [1] recomputed on the SUT's qr" in note
    forced.clear()
    bad = failed(run_broken(monkeypatch, entry, consistent))
    assert ("g0.out", "row_rms") in bad


def test_a_saved_case_replays(tmp_path):
    case = _case("golden_alt_decode_attn_c1a_reindex", tp=2, wiring="sharded")
    result = run_case(case, save_root=str(tmp_path))
    assert result.status == "pass", result.failure_text()
    replayed = replay_folder(result.data_dir, expect_wiring="sharded", rerun=True)
    assert replayed.status == "pass", replayed.reason
