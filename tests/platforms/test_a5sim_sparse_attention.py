"""a5sim: v41.sparse_attention (window + compressed caches) through its harness entry; wrong
kernels (sink ignored, sink in the numerator, -1 keys unmasked, wrong softmax scale,
compressed part ignored, compressed scales read as E8M0, nibble order swapped, FP32 row
arithmetic past 2^24 scale slots) fail the per-row bound; bad row ids never launch."""

from __future__ import annotations

import re

import pytest
import torch

from harness.case import Case
from harness.entries._kernel import run_with
from harness.entries.sparse_attention import chunk_tokens, chunked_launch, no_key_tokens
from platform_stubs import NoLaunch

ENTRY = "sparse_attention"
CASE = Case(entry=ENTRY, tokens=5)


def _entry():
    from harness import registry
    return registry.get(ENTRY)


@pytest.mark.parametrize("variant,expect", [
    # without the sink the fully masked token averages its masked rows: not zero
    ("no_sink", {"row_rms", "zero_rows"}),
    ("sink_numerator", {"row_rms", "row_peak"}),
    ("unmasked", {"row_rms", "row_peak"}),
    ("wrong_scale", {"row_rms", "row_peak"}),
    ("no_compressed", {"row_rms", "row_peak"}),
    ("compressed_e8m0", {"row_rms", "row_peak"}),
    ("nibble_swap", {"row_rms", "row_peak"}),
])
def test_wrong_kernel_fails_the_comparison(a5sim, variant, expect):
    verdicts, out, gold = run_with(a5sim, CASE, chunked_launch(variant))
    bad = {v.check for v in verdicts if not v.passed and v.output == "out"}
    assert expect <= bad, f"variant {variant}: {[v.line() for v in verdicts]}"


def test_reference_passes_and_masked_token_is_zero(a5sim):
    verdicts, out, gold = run_with(a5sim, CASE, chunked_launch())
    assert all(v.passed for v in verdicts), [v.line() for v in verdicts if not v.passed]
    assert torch.equal(out["out"][2], torch.zeros_like(out["out"][2]))  # no valid key


def test_window_only_build_equals_every_compressed_id_masked(a5sim):
    """SWA's build without the compressed part gives the bits of the full kernel over
    compressed ids that are all -1, whatever the compressed cache holds."""
    from harness.platforms import KernelSpec
    inputs = _entry().build_inputs(CASE.config, CASE)
    inputs["compressed_indices"][:] = -1
    axes = {"tokens": CASE.tokens, "tp": CASE.tp, "preset": CASE.preset,
            "keys": inputs["indices"].shape[1], "ckeys": inputs["compressed_indices"].shape[1],
            "blocks": inputs["window_kv"].shape[0], "cblocks": inputs["compressed_kv"].shape[0]}
    outs = []
    for extra in ({}, {"window_only": True}):
        program = a5sim.compile(KernelSpec("v41.sparse_attention", {}), CASE.config,
                                {**axes, **extra})
        args = {a.name: inputs[a.name].clone() for a in program.args}
        if extra:
            args["compressed_kv"].fill_(0x77)  # not read
        outs.append(a5sim.launch(program, 0, args).raise_for_error().outputs["out"])
    assert outs[0].abs().sum() > 0
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


def test_fixture_covers_both_parts_and_their_padding():
    inputs = _entry().build_inputs(CASE.config, CASE)
    w, c = inputs["indices"], inputs["compressed_indices"]
    assert no_key_tokens(inputs).tolist() == [False, False, True, False, False]
    assert (w[3] >= 0).any() and (c[3] < 0).all()  # window keys only
    assert (w[4] < 0).all() and (c[4] >= 0).any()  # compressed keys only
    for ids in (w, c):  # -1 padding inside otherwise valid tokens
        assert ((ids[[0, 1]] < 0).any(dim=1) & (ids[[0, 1]] >= 0).any(dim=1)).all()
    # the compressed part matters: without it the golden changes on tokens that have it
    gold = _entry().golden(CASE.config, CASE, inputs)["out"]
    inputs["compressed_indices"][:] = -1
    alone = _entry().golden(CASE.config, CASE, inputs)["out"]
    assert not torch.equal(gold[0], alone[0]) and torch.equal(gold[3], alone[3])


def test_flash_keys_are_128_window_plus_512_compressed():
    case = Case(entry=ENTRY, tokens=4, tp=4, preset="flash")
    inputs = _entry().build_inputs(case.config, case)
    assert inputs["indices"].shape == (4, 128) and inputs["compressed_indices"].shape == (4, 512)
    assert chunk_tokens(inputs) == 16  # T=192 runs as twelve launches


def _far_rows_inputs():
    """CASE inputs whose compressed rows sit past row 2^22 of a 2^22 + 256-row cache: their
    flat scale slots ``row * 4 + lane`` exceed 2^24, where FP32 holds only even integers."""
    inputs = _entry().build_inputs(CASE.config, CASE)
    far = 2 ** 22 + 1  # odd first row: odd lanes land on odd slots
    bs, cblocks = CASE.config.cache.block_size, (2 ** 22 + 256) // 16
    for name in ("compressed_kv", "compressed_kv_scale"):
        small = inputs[name]
        big = torch.zeros((cblocks, *small.shape[1:]), dtype=torch.uint8)
        big.view(cblocks * bs, -1)[far:far + small.shape[0] * bs] = small.view(-1, small.shape[-1])
        inputs[name] = big
    ids = inputs["compressed_indices"]
    inputs["compressed_indices"] = torch.where(ids >= 0, ids + far, ids)
    assert int(inputs["compressed_indices"].max()) * 4 > 2 ** 24
    return inputs


@pytest.mark.slow  # a 150 MB compressed cache: ~4 min and ~9 GB in the interpreter
def test_row_arithmetic_is_integer_past_2_pow_24_scale_slots(a5sim):
    from harness.fixtures import clone_tensors
    entry, cfg = _entry(), CASE.config
    inputs = _far_rows_inputs()
    gold = entry.golden(cfg, CASE, clone_tensors(inputs))
    small = entry.golden(cfg, CASE, entry.build_inputs(cfg, CASE))
    assert torch.equal(gold["out"], small["out"])  # the same rows, far away
    checks = {}
    for variant in ("reference", "fp32_row_index"):
        out = chunked_launch(variant)(a5sim, cfg, CASE, clone_tensors(inputs)).outputs
        checks[variant] = {v.check for v in entry.compare(cfg, CASE, inputs, gold, out)
                           if not v.passed}
    assert checks["reference"] == set(), checks
    assert {"row_rms"} <= checks["fp32_row_index"], checks


def test_slow_cases_are_a_flash_decode_rank_and_a_prefill_size():
    from harness.case import validate_case
    entry = _entry()
    slow = {(c.preset, c.tp, c.tokens) for c in entry.slow_cases}
    assert ("flash", 4, 192) in slow and any(t > 192 for _, _, t in slow)
    for c in entry.slow_cases:
        validate_case(c, entry.support)


class _Recorder:
    """A platform that compiles and launches nothing: records the case of each compile and
    answers with the golden-free zeros of the chunk's out."""

    def __init__(self):
        self.cases = []

    def compile(self, spec, config, case):
        from harness.platforms.base import resolve_abi
        self.cases.append(dict(case))

        class _P:
            args = resolve_abi(spec, config, case)
        return _P()

    def launch(self, program, rank, tensors):
        out = torch.full_like(tensors["out"], float(len(self.cases)))

        class _R:
            outputs = {"out": out}

            def raise_for_error(self):
                pass

            def cost_record(self):
                return {"rank": 0, "aicore_e2e_us": 1.5, "total_cycles": 10}
        return _R()


def test_large_token_counts_are_split_into_launches_of_the_same_caches(monkeypatch):
    import harness.entries.sparse_attention as sa
    monkeypatch.setattr(sa, "LAUNCH_KEY_ELEMENTS", 2 * 32 * 64)  # two TINY tokens per launch
    inputs = _entry().build_inputs(CASE.config, CASE)
    rec = _Recorder()
    produced = sa.chunked_launch()(rec, CASE.config, CASE, inputs)
    out = produced.outputs["out"]
    # one rank, three launches in a row: their estimated times add
    assert produced.costs == [{"rank": 0, "aicore_e2e_us": 4.5, "total_cycles": 30, "launches": 3}]
    assert [c["tokens"] for c in rec.cases] == [2, 2, 1]
    assert {(c["blocks"], c["cblocks"], c["keys"], c["ckeys"]) for c in rec.cases} == {(4, 4, 16, 16)}
    assert [float(out[t, 0, 0]) for t in range(5)] == [1, 1, 2, 2, 3]  # each chunk in place


@pytest.mark.parametrize("field,bound,mutate", [
    ("indices[1, 0]", "[-1, 64) window_kv rows",
     lambda inp: inp["indices"].__setitem__((1, 0), 10 ** 6)),
    ("indices[0, 3]", "[-1, 64) window_kv rows",
     lambda inp: inp["indices"].__setitem__((0, 3), -2)),
    ("compressed_indices[3, 1]", "[-1, 64) compressed_kv rows",
     lambda inp: inp["compressed_indices"].__setitem__((3, 1), 64)),
    ("compressed_indices[0, 0]", "[-1, 64) compressed_kv rows",
     lambda inp: inp["compressed_indices"].__setitem__((0, 0), -7)),
    ("attn_sink[1]", "not finite", lambda inp: inp["attn_sink"].__setitem__(1, float("inf"))),
])
def test_bad_input_is_refused_on_the_host_before_launch(field, bound, mutate):
    entry = _entry()
    inputs = entry.build_inputs(CASE.config, CASE)
    mutate(inputs)
    with pytest.raises(ValueError, match=re.escape(field) + ".*" + re.escape(bound)):
        entry.kernels["a5sim"](NoLaunch(), CASE.config, CASE, inputs)


def test_a_token_without_keys_must_be_exactly_zero():
    entry = _entry()
    inputs = entry.build_inputs(CASE.config, CASE)
    gold = entry.golden(CASE.config, CASE, inputs)
    actual = {"out": gold["out"].clone()}
    masked = int(no_key_tokens(inputs).nonzero()[0, 0])
    actual["out"][masked] = 5e-7
    bad = {(v.output, v.check) for v in entry.compare(CASE.config, CASE, inputs, gold, actual)
           if not v.passed}
    assert ("out", "zero_rows") in bad
