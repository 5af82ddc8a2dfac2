"""harness.compare.cache: non-owned bytes, dequantized published rows, the state ring."""

import math

import pytest
import torch

from harness.compare.cache import (
    MXFP4_CACHE_MAX_REL_L2,
    MXFP8_CACHE_MAX_REL_L2,
    check_dequantized_rows,
    check_non_owned_bytes,
    check_state_ring,
)
from harness.verdict import all_passed

BLOCKS, PAGE = 3, 8  # a paged cache [blocks, PAGE, 1, width]; row number = physical slot


def _payload(dtype, width=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, (BLOCKS, PAGE, 1, width), generator=g, dtype=torch.uint8)
    return torch.randn(BLOCKS, PAGE, 1, width, generator=g).to(dtype)


def _flip_byte(t, block, pos, col):
    out = t.clone()
    out.view(torch.uint8)[block, pos, 0, col] ^= 0x01
    return out


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8, torch.float8_e8m0fnu, torch.bfloat16])
def test_one_changed_non_owned_byte_fails_with_first_index_and_count(dtype):
    before = _payload(dtype) if dtype != torch.float8_e8m0fnu else _payload(torch.uint8).view(dtype)
    owned = torch.tensor([1, 9, -1])  # slots 1 and 9 written; -1 = unpublished token
    after = _flip_byte(before, 0, 1, 0)  # inside owned slot 1: allowed
    assert all_passed(check_non_owned_bytes("kv_cache", after, before, owned=owned))
    after = _flip_byte(after, 2, 3, 5)  # slot 19, not owned
    [v] = check_non_owned_bytes("kv_cache", after, before, owned=owned)
    flat = (2 * PAGE + 3) * before.shape[-1] + 5 // before.element_size()  # byte 5 -> element
    assert not v.passed and v.check == "exact_bytes" and v.measured == 1 and v.bound == 0
    assert v.row == 19 and v.failing_rows == (19,) and v.n_checked == BLOCKS * PAGE - 2
    assert f"first changed flat index {flat}" in v.detail and "1 changed elements" in v.detail


def test_owned_mask_over_blocks_and_positions():
    before = _payload(torch.float8_e4m3fn)
    after = _flip_byte(before, 1, 2, 7)
    owned = torch.zeros(BLOCKS, PAGE, dtype=torch.bool)
    assert not check_non_owned_bytes("scale", after, before, owned=owned)[0].passed
    owned[1, 2] = True
    assert check_non_owned_bytes("scale", after, before, owned=owned)[0].passed


def test_whole_tensor_must_match_without_ownership_and_misuse_raises():
    before = _payload(torch.uint8)
    after = _flip_byte(before, 0, 0, 0)
    [v] = check_non_owned_bytes("index_cache", after, before)
    assert not v.passed and v.row == 0
    with pytest.raises(ValueError, match="index_cache: actual dtype"):
        check_non_owned_bytes("index_cache", before.view(torch.int8), before)
    with pytest.raises(ValueError, match="index_cache: actual shape"):
        check_non_owned_bytes("index_cache", before[:1], before)


def _published(rows=16, width=64, seed=3):
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("budget", "good", "bad"), [(MXFP8_CACHE_MAX_REL_L2, 0.008, 0.012),
                                                    (MXFP4_CACHE_MAX_REL_L2, 0.035, 0.045)])
def test_dequantized_rows_budget_mxfp8_and_mxfp4(budget, good, bad):
    ref = _published()
    assert all_passed(check_dequantized_rows("kv_cache", ref * (1 + good), ref, max_rel_l2=budget))
    vs = check_dequantized_rows("kv_cache", ref * (1 + bad), ref, max_rel_l2=budget)
    v = {v.check: v for v in vs}["cache_rel_l2"]
    assert not v.passed and v.bound == budget and v.measured == pytest.approx(bad, rel=1e-4)
    assert len(v.failing_rows) == 16


def test_dequantized_rows_one_bad_row_is_named_and_optional_row_bound_catches_it():
    ref = _published()
    actual = ref.clone()
    actual[11] *= 1.03
    v = {v.check: v for v in check_dequantized_rows("kv_cache", actual, ref, max_rel_l2=0.01,
                                                    max_row_rel_l2=0.02)}
    assert v["cache_rel_l2"].passed and v["cache_rel_l2"].row == 11
    assert not v["cache_row_rel_l2"].passed and v["cache_row_rel_l2"].failing_rows == (11,)
    actual[4, 0] = math.inf
    [finite, *_] = check_dequantized_rows("kv_cache", actual, ref, max_rel_l2=0.01)
    assert not finite.passed and finite.row == 4


def _ring(seed=5):
    return torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(seed))  # [blocks, capacity, 2*hd]


def test_state_ring_exact_and_tolerance():
    ref = _ring()
    slots = torch.tensor([2, 3, 9])  # block*4 + p%4
    actual = ref.clone()
    assert all_passed(check_state_ring("state_cache", actual, ref, slots))
    actual[2, 1, 5] = torch.nextafter(actual[2, 1, 5], torch.tensor(math.inf))  # slot 9, one ulp
    v = {v.check: v for v in check_state_ring("state_cache", actual, ref, slots)}
    assert not v["state_rows"].passed and v["state_rows"].row == 9 and v["state_rows"].bound == 0
    assert v["exact_bytes"].passed
    assert all_passed(check_state_ring("state_cache", actual, ref, slots, atol=1e-6, rtol=1e-6))


def test_state_ring_untouched_slot_change_fails_exact_bytes():
    ref = _ring()
    actual = ref.clone()
    actual[0, 0, 0] += 1.0  # slot 0 was not written by the call
    v = {v.check: v for v in check_state_ring("state_cache", actual, ref, [2, 3, 9], atol=10.0)}
    assert v["state_rows"].passed
    assert not v["exact_bytes"].passed and v["exact_bytes"].row == 0 and "flat index 0" in v["exact_bytes"].detail
