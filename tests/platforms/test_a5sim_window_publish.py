"""a5sim: v41.window_publish through its harness entry.  Wrong kernels fail the comparison,
the reference kernel's codes equal the golden's bit for bit, negative slots write nothing,
host chunking changes nothing, and bad input is rejected on the host before any launch."""

from __future__ import annotations

import pytest
import torch

from goldens.window_cache import publish_window_kv
from harness import registry
from harness.case import Case
from harness.entries import window_publish as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch

CASE = Case(entry="window_publish", tokens=40, active_tokens=33, requests=3)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


def golden_bytes(inputs) -> dict[str, torch.Tensor]:
    return registry.get("window_publish").golden(CASE.config, CASE, clone_tensors(inputs))


def differing_bytes(actual, gold) -> int:
    return sum(int((actual[k] != gold[k]).sum()) for k in entry_mod.CACHES)


@pytest.mark.parametrize("variant,expect", [
    ("negative_to_row0", {("window_kv", "exact_bytes"), ("window_kv_scale", "exact_bytes")}),
    ("truncate", {("window_kv.dequantized", "cache_rel_l2")}),
    ("scale_off_by_one", {("window_kv.dequantized", "cache_rel_l2")}),
])
def test_wrong_kernel_fails_the_comparison(a5sim, variant, expect):
    verdicts, _, _ = run_with(a5sim, CASE, entry_mod.kernel_sut(variant=variant))
    assert not all_passed(verdicts), f"variant {variant} passed the comparison"
    assert expect <= failing(verdicts), [v.line() for v in verdicts if not v.passed]


def test_codes_equal_the_golden_bit_for_bit(a5sim):
    """The fixture's hard rows (ties, 448, -0.0, E8M0 clamp, BF16 subnormals) included."""
    verdicts, out, gold = run_with(a5sim, CASE, entry_mod.kernel_sut())
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    assert differing_bytes(out, gold) == 0


@pytest.mark.parametrize("wave,rows", [(2, 7), (16, 3)])
def test_several_row_tiles_in_one_launch_equal_the_golden(a5sim, wave, rows):
    """Row tiles shrunk so the 40-token case runs several tiles of one branch: ``wave=2``
    takes the last branch (six 7-row tiles, the last one partial), ``wave=16`` a middle one
    (fourteen 3-row tiles)."""
    tiles = (1, 2, 3, 4, 5, 7)
    assert [t for t in tiles if CASE.tokens <= wave * t][:1] in ([rows], [])
    verdicts, out, gold = run_with(a5sim, CASE, entry_mod.kernel_sut(row_tiles=tiles,
                                                                     wave=wave))
    assert all_passed(verdicts), [v.line() for v in verdicts if not v.passed]
    assert differing_bytes(out, gold) == 0


def _bf16_over_every_exponent(rows: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """BF16 ``[rows, d]`` with random signs and mantissas; each group of 32 has a random top
    exponent field (0..254) and elements up to 24 binades below it (field 0: subnormals)."""
    top = torch.randint(0, 255, (rows, d // 32, 1), generator=gen)
    field = (top - torch.randint(0, 25, (rows, d // 32, 32), generator=gen)).clamp(min=0)
    mant = torch.randint(0, 128, field.shape, generator=gen)
    sign = torch.randint(0, 2, field.shape, generator=gen)
    bits = (sign << 15) | (field << 7) | mant
    return bits.reshape(rows, d).to(torch.int32).to(torch.int16).view(torch.bfloat16)


def test_bf16_of_every_exponent_quantizes_like_the_golden(a5sim):
    """Groups over the whole BF16 range (subnormals, zeros of both signs, 3e38): nearly
    every E8M0 code and every non-NaN E4M3 code occurs, and all equal the golden's."""
    case = Case(entry="window_publish", tokens=192)
    inputs = registry.get("window_publish").build_inputs(case.config, case)
    gen = torch.Generator().manual_seed(5)
    inputs["kv"] = _bf16_over_every_exponent(*inputs["kv"].shape, gen)
    rows = inputs["window_kv"].shape[0] * inputs["window_kv"].shape[1]
    inputs["window_slots"] = torch.randperm(rows, generator=gen)[:case.tokens].to(torch.int32)
    out = entry_mod.kernel_sut()(a5sim, case.config, case, clone_tensors(inputs)).outputs
    gold = clone_tensors(inputs)
    publish_window_kv(gold["window_kv"].view(torch.float8_e4m3fn), gold["window_kv_scale"],
                      gold["kv"], gold["window_slots"])
    live = inputs["window_slots"].long()
    codes = gold["window_kv"].reshape(rows, -1)[live].unique()
    scales = gold["window_kv_scale"].reshape(rows, -1)[live].unique()
    assert codes.numel() == 254 and scales.numel() >= 150 and int(scales.min()) == 0
    assert differing_bytes(out, gold) == 0


def test_negative_slots_write_nothing(a5sim):
    inputs = registry.get("window_publish").build_inputs(CASE.config, CASE)
    inputs["window_slots"][:] = -1
    inputs["window_slots"][::3] = -100
    out = entry_mod.kernel_sut()(a5sim, CASE.config, CASE, clone_tensors(inputs)).outputs
    for name in entry_mod.CACHES:
        assert torch.equal(out[name], inputs[name]), name


def test_host_chunks_publish_the_same_bytes(a5sim):
    """The a5sim SUT's chunked launches (here 16 tokens each) continue one cache: same bytes
    as the golden, one summed cost record."""
    inputs = registry.get("window_publish").build_inputs(CASE.config, CASE)
    produced = entry_mod.kernel_sut(16)(a5sim, CASE.config, CASE, clone_tensors(inputs))
    assert differing_bytes(produced.outputs, golden_bytes(inputs)) == 0
    assert len(produced.costs) == 1 and produced.costs[0]["launches"] == 3
    assert produced.costs[0]["aicore_e2e_us"] > 0


def _past_cache(inputs):
    inputs["window_slots"][4] = inputs["window_kv"].shape[0] * inputs["window_kv"].shape[1]


def _duplicate(inputs):
    inputs["window_slots"][9] = inputs["window_slots"][2]


@pytest.mark.parametrize("mutate,match", [
    (_past_cache, r"window_slots\[4\]: 176 is past the cache \(176 rows = 11 blocks x 16\)"),
    (_duplicate, r"window_slots\[2\] and window_slots\[9\]: both publish to slot \d+"),
    (lambda i: i.update(window_slots=i["window_slots"].long()),
     r"window_slots: must be 1-D torch.int32, got 1-D torch.int64"),
    (lambda i: i.update(window_slots=i["window_slots"][:-1]),
     r"window_slots: shape must be \[40\] \(one per kv row\), got \[39\]"),
    (lambda i: i.update(kv=i["kv"].float()),
     r"kv: must be 2-D torch.bfloat16, got 2-D torch.float32"),
    (lambda i: i.update(kv=i["kv"][:, :32]), r"kv: shape must be \[T, 64\]"),
    (lambda i: i.update(window_kv=i["window_kv"].view(torch.float8_e4m3fn)),
     r"window_kv: must be 4-D torch.uint8, got 4-D torch.float8_e4m3fn"),
    (lambda i: i.update(window_kv_scale=i["window_kv_scale"][:, :, :, :1]),
     r"window_kv_scale: shape must be \[11, 16, 1, 2\]"),
])
def test_host_rejects_bad_launch_before_launching(mutate, match):
    inputs = registry.get("window_publish").build_inputs(CASE.config, CASE)
    mutate(inputs)
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), CASE.config, CASE, inputs)
    assert all(torch.equal(inputs[k], before[k]) for k in inputs)  # nothing written


def test_fixture_holds_negative_and_paged_slots():
    inputs = registry.get("window_publish").build_inputs(CASE.config, CASE)
    slots = inputs["window_slots"]
    assert (slots[:CASE.active] == -1).sum() >= 4 and (slots[CASE.active:] < 0).all()
    assert (slots[CASE.active:] == -7).any()
    assert entry_mod.validate_launch(inputs) == int((slots >= 0).sum())
    bs = CASE.config.cache.block_size
    pages = torch.unique_consecutive(slots[slots >= 0].long() // bs)
    assert not torch.equal(pages, torch.arange(pages.numel()))  # a nonidentity block table
