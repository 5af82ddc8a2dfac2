"""a5sim: v41.compressor_ratio2 through its harness entry.  Wrong kernels (ring rows from
the chunk start, predecessor read after the ring writes, index key from the rotated
latent, E2M1 truncation) fail the comparison; the reference kernel publishes the
golden's bytes, keeps the ring within its bound, leaves disabled requests' blocks and
unwritten ring slots untouched and touches nothing at ``num_tokens = 0``; bad input is
rejected on the host before anything is compiled or written."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.case import Case
from harness.entries import compressor_fixture as fx
from harness.entries import compressor_ratio2 as entry_mod
from harness.entries._kernel import run_with
from harness.fixtures import clone_tensors
from harness.verdict import all_passed
from platform_stubs import NoLaunch

CASE = Case(entry="compressor_ratio2", tokens=40, active_tokens=33, requests=3)


def failing(verdicts) -> set[tuple[str, str]]:
    return {(v.output, v.check) for v in verdicts if not v.passed}


def build(case=CASE):
    return registry.get("compressor_ratio2").build_inputs(case.config, case)


def test_fixture_exercises_the_ring_rules():
    """A chunk longer than the ring that starts at an odd position (reads its predecessor
    from the ring), a disabled request with inert rows, padding rows with junk slots."""
    inputs = build()
    qsl, pos = inputs["query_start_loc"].tolist(), inputs["position_ids"]
    table = inputs["state_block_table"][:, 0].tolist()
    live = [r for r in range(CASE.requests) if table[r] >= 0]
    cap = CASE.config.cache.state_capacity
    assert any(qsl[r + 1] - qsl[r] > cap and int(pos[qsl[r]]) % 2 == 1 for r in live)
    dead = [r for r in range(CASE.requests) if table[r] < 0]
    assert dead and (pos[qsl[dead[0]]:qsl[dead[0] + 1]] < 0).any()
    assert (inputs["compressed_slots"][CASE.active:] >= 0).all()
    assert entry_mod.validate_launch(CASE.config, inputs) == fx.published_slots(inputs).numel()


@pytest.mark.parametrize("variant,expect", [
    ("first_rows_to_ring", {("state_cache", "state_rows")}),
    ("read_after_write", {("compressed_kv.dequantized", "cache_rel_l2")}),
    ("index_from_rotated", {("index_key.dequantized", "cache_rel_l2")}),
    ("fp4_toward_zero", {("compressed_kv.dequantized", "cache_rel_l2"),
                         ("index_key.dequantized", "cache_rel_l2")}),
])
def test_wrong_kernel_fails_the_comparison(a5sim, variant, expect):
    verdicts, _, _ = run_with(a5sim, CASE, entry_mod.kernel_sut(variant=variant))
    assert not all_passed(verdicts), f"variant {variant} passed the comparison"
    assert expect <= failing(verdicts), [v.line() for v in verdicts if not v.passed]


def test_reference_publishes_the_golden_bytes(a5sim):
    """Cache bytes equal the golden's; ring rows within the bound; a disabled request's
    block and every unwritten ring slot are byte-identical to the input."""
    inputs = build()
    out = entry_mod.kernel_sut()(a5sim, CASE.config, CASE, clone_tensors(inputs)).outputs
    gold = registry.get("compressor_ratio2").golden(CASE.config, CASE, clone_tensors(inputs))
    assert sum(int((out[k] != gold[k]).sum()) for k in fx.CACHES) == 0
    written = entry_mod.ring_slots(CASE.config, inputs)
    ring_in = inputs["state_cache"].reshape(-1, CASE.config.state_width)
    ring_out = out["state_cache"].reshape(-1, CASE.config.state_width)
    keep = torch.ones(ring_in.shape[0], dtype=torch.bool)
    keep[written] = False
    assert torch.equal(ring_out[keep], ring_in[keep]) and not torch.equal(ring_out, ring_in)
    assert all_passed(entry_mod.compare(CASE.config, CASE, inputs, gold, out))


def test_num_tokens_zero_touches_nothing(a5sim):
    case = Case(entry="compressor_ratio2", tokens=8, active_tokens=0, seed=2)
    inputs = build(case)
    inputs["compressed_slots"][:] = torch.arange(8, dtype=torch.int32)
    out = entry_mod.kernel_sut()(a5sim, case.config, case, clone_tensors(inputs)).outputs
    for name in entry_mod.OUTPUTS:
        assert torch.equal(out[name].view(torch.uint8), inputs[name].view(torch.uint8)), name


def _shared_block(inputs):
    inputs["state_block_table"][1, 0] = inputs["state_block_table"][0, 0]


def _past_blocks(inputs):
    inputs["state_block_table"][0, 0] = inputs["state_cache"].shape[0]


def _even_slot(inputs):
    inputs["compressed_slots"][1] = 200  # position 46: does not close a pair


def _disabled_slot(inputs):
    inputs["compressed_slots"][17] = 201  # request 2 is disabled


def _negative_in_live(inputs):
    inputs["position_ids"][12] = -1


@pytest.mark.parametrize("mutate,match", [
    (_shared_block, r"state_block_table\[1, 0\]: live requests must own distinct state blocks"),
    (_past_blocks, r"state_block_table\[0, 0\]: 5 outside \[-1, num_state_blocks=5\)"),
    (_even_slot, r"compressed_slots\[1\]: 200 >= 0 at position 46, which does not complete a "
                 r"ratio-2 group"),
    (_disabled_slot, r"compressed_slots\[17\]: 201 >= 0 but request 2's compressor is disabled"),
    (_negative_in_live, r"position_ids\[12\]: -1 inside enabled request 0's chunk"),
    (lambda i: i.update(state_cache=i["state_cache"][:, :2]),
     r"state_cache: shape \[5, 2, 128\], expected \[5, 4, 128\]"),
    (lambda i: i.update(state_cache=i["state_cache"].double()),
     r"state_cache: dtype torch.float64, the kernel takes torch.float32"),
    (lambda i: i.update(wgate=i["wgate"].bfloat16()),
     r"weights.wgate: dtype torch.bfloat16, expected torch.float32"),
])
def test_host_rejects_bad_launch_before_launching(mutate, match):
    inputs = build()
    mutate(inputs)
    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry_mod.kernel_sut()(NoLaunch(), CASE.config, CASE, inputs)
    for k in inputs:  # nothing written
        assert torch.equal(inputs[k].view(torch.uint8) if inputs[k].element_size() == 1
                           else inputs[k], before[k].view(torch.uint8)
                           if before[k].element_size() == 1 else before[k]), k


def test_host_chunks_equal_one_launch(a5sim):
    """Launches of 8 packed rows (requests split across launches, the ring carrying their
    state) publish the same bytes as the golden's single call; one summed cost record."""
    inputs = build()
    produced = entry_mod.kernel_sut(8)(a5sim, CASE.config, CASE, clone_tensors(inputs))
    gold = registry.get("compressor_ratio2").golden(CASE.config, CASE, clone_tensors(inputs))
    assert sum(int((produced.outputs[k] != gold[k]).sum()) for k in fx.CACHES) == 0
    assert all_passed(entry_mod.compare(CASE.config, CASE, inputs, gold, produced.outputs))
    assert len(produced.costs) == 1 and produced.costs[0]["launches"] == 5


@pytest.mark.parametrize("m", [8, 16, 32, 48, 64, 96, 128, 176, 256])
@pytest.mark.parametrize("hidden", [256, 512, 5120])
def test_projection_k_tiles_keep_the_k_pieces_and_fit_l1(m, hidden):
    """The projection's L1 K tiles: a pair pypto accepts (one whole K, or the larger a
    multiple of the smaller), both in L1 beside each other, and the interpreter's K piece
    ``gcd`` still K_STEP (same bits as ``[K_STEP, K_STEP]``), with no more copy-ins."""
    import math

    from v41.compressor_common import K_STEP
    from v41.compressor_ratio2 import PROJ_N, projection_k_tiles
    from v41.cube_tiles import L1_BYTES

    _, k_a, k_b = projection_k_tiles(m, hidden)
    assert hidden % k_a == 0 and k_b % K_STEP == 0
    assert max(k_a, k_b) >= hidden or max(k_a, k_b) % min(k_a, k_b) == 0
    assert math.gcd(k_a, k_b) == K_STEP
    assert (m * k_a + k_b * PROJ_N) * 4 <= L1_BYTES
    copies = -(-hidden // k_a) + -(-hidden // k_b)
    assert copies <= 2 * (hidden // K_STEP)
    if hidden == 5120 and m == 8:
        assert (k_a, k_b) == (5120, 256)  # x's whole row tile: 21 copy-ins, not 25
