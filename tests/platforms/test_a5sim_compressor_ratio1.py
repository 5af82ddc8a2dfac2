"""a5sim: v41.compressor_ratio1 through its harness entry.  Wrong kernels fail the
comparison, the reference kernel's cache bytes equal the golden's (also with norm weights
that drive the E4M3 scale to its 2^-9 floor and past 448), inert / unpublished / padding
rows write nothing, host chunking changes nothing, and bad input is rejected on the host
before anything is compiled or written."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import compressor_fixture as fx
from harness.entries import compressor_ratio1 as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch

CASE = Case(entry="compressor_ratio1", tokens=40, active_tokens=33, requests=3)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


def golden_bytes(inputs, case=CASE) -> dict[str, torch.Tensor]:
    return registry.get("compressor_ratio1").golden(case.config, case, clone_tensors(inputs))


def differing_bytes(actual, gold) -> int:
    return sum(int((actual[k] != gold[k]).sum()) for k in fx.CACHES)


@pytest.mark.parametrize("variant,expect", [
    ("index_from_rotated", {("index_key.dequantized", "cache_rel_l2")}),
    ("fp4_toward_zero", {("compressed_kv.dequantized", "cache_rel_l2"),
                         ("index_key.dequantized", "cache_rel_l2")}),
    ("negative_positions_publish", {("compressed_kv", "exact_bytes"),
                                    ("index_key", "exact_bytes")}),
])
def test_wrong_kernel_fails_the_comparison(a5sim, variant, expect):
    verdicts, _, _ = run_with(a5sim, CASE, entry_mod.kernel_sut(variant=variant))
    assert not all_passed(verdicts), f"variant {variant} passed the comparison"
    assert expect <= failing(verdicts), [v.line() for v in verdicts if not v.passed]


def test_cache_bytes_equal_the_golden(a5sim):
    """Inert rows (negative positions with live-looking slots), slot -1 tokens and padding
    rows with junk slots are all in the fixture."""
    inputs = registry.get("compressor_ratio1").build_inputs(CASE.config, CASE)
    n = CASE.active
    assert (inputs["position_ids"][:n] < 0).any() and (inputs["compressed_slots"][n:] >= 0).all()
    out = entry_mod.kernel_sut()(a5sim, CASE.config, CASE, clone_tensors(inputs)).outputs
    gold = golden_bytes(inputs)
    assert differing_bytes(gold, inputs) > 0  # the call publishes something
    assert differing_bytes(out, gold) == 0


def test_extreme_norm_weights_quantize_like_the_golden(a5sim):
    """Norm weights from 2^-16 to 2^12 by channel group: E4M3 scales at the 2^-9 floor,
    subnormal and saturated at 448 (payload clamped to 6), E8M0 codes over a wide range."""
    case = Case(entry="compressor_ratio1", tokens=16, seed=3)
    inputs = registry.get("compressor_ratio1").build_inputs(case.config, case)
    d, di = case.config.head_dim, case.config.index.head_dim
    exps = torch.arange(d // 16).repeat_interleave(16) * 28.0 / (d // 16 - 1) - 16.0
    inputs["norm"] = inputs["norm"] * torch.exp2(exps)
    inputs["index_norm"] = inputs["index_norm"] * torch.exp2(
        torch.arange(di // 16).repeat_interleave(16) * 24.0 - 12.0)
    out = entry_mod.kernel_sut()(a5sim, case.config, case, clone_tensors(inputs)).outputs
    gold = golden_bytes(inputs, case)
    live = fx.published_slots(inputs)
    scales = gold["compressed_kv_scale"].reshape(-1, d // 16)[live]
    assert int(scales.min()) == 1 and int(scales.max()) == 0x7E  # floor 2^-9 and 448
    assert differing_bytes(out, gold) == 0


def test_num_tokens_zero_writes_nothing(a5sim):
    case = Case(entry="compressor_ratio1", tokens=8, active_tokens=0, seed=2)
    inputs = registry.get("compressor_ratio1").build_inputs(case.config, case)
    inputs["compressed_slots"][:] = torch.arange(8, dtype=torch.int32)
    out = entry_mod.kernel_sut()(a5sim, case.config, case, clone_tensors(inputs)).outputs
    for name in fx.CACHES:
        assert torch.equal(out[name], inputs[name]), name


def test_host_chunks_publish_the_same_bytes(a5sim):
    """The a5sim SUT's chunked launches (16 tokens each; the last chunk is padding only and
    is skipped) continue one cache: same bytes as the golden, one summed cost record."""
    inputs = registry.get("compressor_ratio1").build_inputs(CASE.config, CASE)
    produced = entry_mod.kernel_sut(16)(a5sim, CASE.config, CASE, clone_tensors(inputs))
    assert differing_bytes(produced.outputs, golden_bytes(inputs)) == 0
    assert len(produced.costs) == 1 and produced.costs[0]["launches"] == 3
    assert produced.costs[0]["aicore_e2e_us"] > 0


def _past_cache(inputs):
    inputs["compressed_slots"][0] = inputs["compressed_kv"].shape[0] * 16


def _duplicate(inputs):
    inputs["compressed_slots"][2] = inputs["compressed_slots"][1]


def _gap(inputs):
    inputs["position_ids"][4] += 1


def _capacity(inputs):
    inputs["freqs_cos"] = inputs["freqs_cos"][:8]
    inputs["freqs_sin"] = inputs["freqs_sin"][:8]


@pytest.mark.parametrize("mutate,match", [
    (_past_cache, r"compressed_slots\[0\]: \d+ at or past the cache rows \d+"),
    (_duplicate, r"compressed_slots\[2\]: row \d+ is also published by token 1"),
    (_gap, r"position_ids\[4\]: \d+, expected \d+; positions must be consecutive"),
    (_capacity, r"position_ids\[0\]: compressed position \d+ is at or past the RoPE table "
                r"capacity 8"),
    (lambda i: i.update(compressed_slots=i["compressed_slots"].long()),
     r"compressed_slots: dtype torch.int64, the kernel takes torch.int32"),
    (lambda i: i.update(num_tokens=torch.tensor([34], dtype=torch.int32)),
     r"num_tokens: 34 != query_start_loc\[-1\] = 33"),
    (lambda i: i.update(num_tokens=torch.tensor([41], dtype=torch.int32)),
     r"num_tokens: 41, expected an int in \[0, T=40\]"),
    (lambda i: i.update(compressed_kv_scale=i["compressed_kv_scale"].view(torch.float8_e4m3fn)),
     r"compressed_kv_scale: dtype torch.float8_e4m3fn, the kernel takes torch.uint8"),
    (lambda i: i.update(wkv=i["wkv"].float()),
     r"weights.wkv: dtype torch.float32, expected torch.bfloat16"),
    (lambda i: i.update(index_key=i["index_key"][:, :, :, :8]),
     r"caches.index_key: shape \[\d+, 16, 1, 8\], expected \[\d+, 16, 1, 16\]"),
])
def test_host_rejects_bad_launch_before_launching(mutate, match):
    inputs = registry.get("compressor_ratio1").build_inputs(CASE.config, CASE)
    mutate(inputs)
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), CASE.config, CASE, inputs)
    for k in inputs:  # nothing written (bytes: float8 views compare as uint8)
        assert torch.equal(inputs[k].view(torch.uint8) if inputs[k].element_size() == 1
                           else inputs[k], before[k].view(torch.uint8)
                           if before[k].element_size() == 1 else before[k]), k
