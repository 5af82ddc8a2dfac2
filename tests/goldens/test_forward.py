"""goldens.forward: the full golden model at TINY on a synthetic checkpoint.

* a prompt longer than the sliding window, then decode steps that cross the window-cache and
  the ratio-2 compressed-cache block boundaries, with caches carried: every sampled token
  equals the token a fresh prefill of the whole growing sequence samples, and every fed
  position's final hidden row equals that prefill's row BIT FOR BIT (the goldens are
  batch-invariant, tests/goldens/test_batch_invariance.py; the forward calls them on the
  whole batch);
* two requests of different lengths batched (prefill packed, decode one row each, scattered
  pages) sample the same tokens as each request alone, hidden rows bit-identical;
* every forward visits the layers in order with their schedule modes, all six modes;
* non-finite values never appear, and an injected NaN is reported with its layer and site;
* ``python -m goldens.run_model`` writes, then reuses, a synthetic checkpoint and prints the
  prompt, the generated ids and timings.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from goldens.config import TINY, Mode
from goldens.checkpoint import write_synthetic_checkpoint
from goldens.forward import (CheckpointWeights, GoldenModel, PagedCaches, generate,
                             prefill_only)
from goldens import run_model

CFG = TINY
BS = CFG.cache.block_size
SEED = 11



@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_ckpt")
    write_synthetic_checkpoint(root, CFG, SEED)
    return root


@pytest.fixture(scope="module")
def model(ckpt_dir):
    return GoldenModel.from_checkpoint(ckpt_dir, CFG, rope_capacity=256)


def row_margin(actual: torch.Tensor, ref: torch.Tensor) -> float:
    """Worst ratio over rows of ``RMS(a-r) / (1e-6 + 0.01 RMS(r))`` and ``max|a-r| /
    (1e-5 + 0.05 RMS(r))``; the contract bound holds iff this is <= 1."""
    a, r = actual.double(), ref.double()
    assert a.shape == r.shape
    assert bool(torch.isfinite(a).all()) and bool(torch.isfinite(r).all())
    rms_r = r.pow(2).mean(-1).sqrt()
    d = a - r
    m1 = d.pow(2).mean(-1).sqrt() / (1e-6 + 0.01 * rms_r)
    m2 = d.abs().amax(-1) / (1e-5 + 0.05 * rms_r)
    return float(torch.maximum(m1, m2).max())


def prompt_ids(n: int, salt: int) -> list[int]:
    return [(37 * i + 11 * salt + 5) % CFG.vocab_size for i in range(n)]


# ---- carried caches == re-prefill -----------------------------------------------------------

PROMPT_LEN, NEW = 26, 9  # fed positions 0..33


def test_prefill_then_decode_equals_reprefill_of_the_growing_sequence(model):
    fed = PROMPT_LEN + NEW - 1
    # the scenario crosses what it claims to cross
    assert PROMPT_LEN > CFG.sliding_window
    assert PROMPT_LEN <= 2 * BS < fed  # window page 2 is entered by a decode step
    assert PROMPT_LEN // 2 <= BS < fed // 2  # ratio-2 compressed page 1 by a decode step
    assert PROMPT_LEN // 1 > BS  # the ratio-1 compressed page boundary inside the prompt
    prompt = prompt_ids(PROMPT_LEN, 1)
    res = generate(model, prompt, NEW, page_seed=3, keep_hidden=True, return_result=True)
    gen = res.generated[0]
    assert len(gen) == NEW and all(0 <= t < CFG.vocab_size for t in gen)
    assert [s.kind for s in res.steps] == ["prefill"] + ["decode"] * (NEW - 1)
    assert all(s.rows == [1] for s in res.steps[1:])
    carried = res.hidden_rows(0)  # [fed, D], positions 0..fed-1
    assert carried.shape == (fed, CFG.hidden_size)

    worst = 0.0
    for k in range(NEW):
        seq = prompt + gen[:k]
        out, batch = prefill_only(model, seq, page_seed=100 + k)
        assert int(out.next_ids[0]) == gen[k], f"step {k}: re-prefill samples a different id"
        assert bool(torch.isfinite(out.logits).all())
        worst = max(worst, row_margin(carried[:len(seq)], out.hidden[:batch.active]))
        assert torch.equal(carried[:len(seq)], out.hidden[:batch.active]), \
            f"step {k}: carried-cache hidden rows differ from the re-prefill's"
    print(f"\ncarried-cache decode vs re-prefill: worst row-bound margin {worst:.3g} "
          f"(0 = bit-identical, required)")
    assert worst == 0.0


# ---- batching ---------------------------------------------------------------------------------

def test_batched_requests_equal_each_request_alone(model):
    prompts = [prompt_ids(11, 2), prompt_ids(23, 3)]
    new = 4
    both = generate(model, prompts, new, page_seed=7, keep_hidden=True, return_result=True)
    assert both.steps[0].rows == [11, 23]
    assert all(s.rows == [1, 1] for s in both.steps[1:])
    worst = 0.0
    for i, p in enumerate(prompts):
        alone = generate(model, p, new, keep_hidden=True, return_result=True)
        assert alone.generated[0] == both.generated[i], f"request {i}"
        worst = max(worst, row_margin(both.hidden_rows(i), alone.hidden_rows(0)))
        assert torch.equal(both.hidden_rows(i), alone.hidden_rows(0)), f"request {i}"
    print(f"\nbatched vs alone: worst row-bound margin {worst:.3g} (0 = bit-identical)")
    assert worst == 0.0
    # the plain API: one prompt -> a flat list; several -> a list per prompt
    assert generate(model, prompts[0], 1) == both.generated[0][:1]


# ---- schedule ---------------------------------------------------------------------------------

def test_forward_visits_layers_in_order_with_every_mode(model):
    res = generate(model, prompt_ids(9, 4), 2, return_result=True)
    want = [(lc.layer, lc.mode) for lc in CFG.layers()]
    for step in res.steps:
        assert step.layers == want
    assert {m for _, m in want} == set(Mode)
    assert [m for _, m in want] == [Mode.SWA, Mode.SWA, Mode.C2A_FULL, Mode.C2A_REUSE,
                                    Mode.C2A_FULL, Mode.C2A_REUSE, Mode.C1A_FULL,
                                    Mode.C1A_REUSE, Mode.C1A_REINDEX, Mode.C1A_REUSE]


def test_staggered_pre_mix_is_handed_from_site_to_site(model):
    """Each site's collapse uses the previous site's pre-mix: the pre recorded after the
    Attention site of layer L is what the FFN site of L collapses with, and the head
    collapses with the last FFN site's pre."""
    seen = []
    prompt = prompt_ids(6, 5)
    pc = PagedCaches.for_lengths(CFG, [6])
    pc.add(0)
    batch = pc.batch([0], [6])
    out = model.forward(torch.tensor(prompt), batch, pc.caches,
                        on_site=lambda L, site, x, pre: seen.append((L, site, pre.clone())))
    assert [(L, s) for L, s, _ in seen] == [(L, s) for L in range(CFG.num_layers)
                                            for s in ("attn", "ffn")]
    assert torch.equal(out.last_pre, seen[-1][2])
    assert all(bool((p > 0).all()) for _, _, p in seen)  # sigmoid + eps, never one-hot again


def test_one_row_forward_equals_the_hc_block_chain_of_the_goldens(model, ckpt_dir):
    """For a single row every golden sees M = 1, so the forward must equal, bit for bit, the
    chain built directly from goldens.mhc.hc_block (Attention collapses with the incoming
    pre, FFN with the Attention pre, the block returns the FFN pre), goldens.moe.moe_block
    and goldens.boundary -- an independent statement of the Block ordering."""
    from goldens.boundary import embed, final_norm, greedy_sample, lm_head
    from goldens.mhc import hc_block, hc_head, initial_pre_mix
    from goldens.modes import attention_half_layer
    from goldens.moe import moe_block
    from goldens.norm import rms_norm
    from goldens.router import route

    w = CheckpointWeights.open(ckpt_dir, CFG)
    tok = [123]
    pc = PagedCaches.for_lengths(CFG, [1])
    pc.add(0)
    batch = pc.batch([0], [1])
    out = model.forward(torch.tensor(tok), batch, pc.caches)

    ref_pc = PagedCaches.for_lengths(CFG, [1])
    ref_pc.add(0)
    ref_batch = ref_pc.batch([0], [1])
    ref_pc.caches.begin_forward(CFG, ref_batch)
    x_hc = embed(torch.tensor(tok), w.embed(), CFG)
    pre = initial_pre_mix(1, CFG)
    eps = CFG.rms_norm_eps
    for L in range(CFG.num_layers):
        a, f = w.attention_site(L), w.ffn_site(L)

        def attention(x, a=a, L=L):
            return attention_half_layer(CFG, L, rms_norm(x, a.norm, eps), a.attention,
                                        ref_pc.caches, ref_batch, model.rope)[0]

        def ffn(x, f=f):
            xn = rms_norm(x, f.norm, eps)
            idx, wts = route(xn, f.gate_weight, f.gate_bias, CFG)
            return moe_block(xn, idx, wts, f.experts, f.shared, CFG)

        x_hc, pre = hc_block(x_hc, pre, a.hc, attention, f.hc, ffn, CFG)
    hidden = final_norm(hc_head(x_hc, pre, CFG), w.final_norm(), CFG)
    logits = lm_head(hidden, w.head(), CFG)
    assert torch.equal(out.x_hc, x_hc)
    assert torch.equal(out.last_pre, pre)
    assert torch.equal(out.hidden, hidden)
    assert torch.equal(out.logits, logits)
    assert torch.equal(out.next_ids, greedy_sample(logits))


# ---- finiteness -------------------------------------------------------------------------------

class _NanPost:
    """Wraps weights; layer 3's Attention-site mHC base carries a NaN in a post entry (no
    golden validates it, so only the forward's finiteness check can name the site)."""

    def __init__(self, inner):
        self._inner, self.config = inner, inner.config

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def attention_site(self, layer):
        w = self._inner.attention_site(layer)
        if layer == 3:
            base = w.hc.base.clone()
            base[CFG.hc.hc_mult] = float("nan")
            w = dataclasses.replace(w, hc=dataclasses.replace(w.hc, base=base))
        return w


def test_non_finite_never_appears_and_is_reported_where_it_starts(model, ckpt_dir):
    prompt = prompt_ids(20, 6)
    out, batch = prefill_only(model, prompt)
    assert bool(torch.isfinite(out.hidden).all()) and bool(torch.isfinite(out.logits).all())
    assert bool(torch.isfinite(out.x_hc).all())
    bad = GoldenModel(CFG, _NanPost(CheckpointWeights.open(ckpt_dir, CFG)), rope_capacity=256)
    with pytest.raises(FloatingPointError, match="layer 3 attention site"):
        prefill_only(bad, prompt)


def test_bad_inputs_raise(model):
    with pytest.raises(ValueError, match="outside"):
        generate(model, [1, CFG.vocab_size], 1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [1, 2], -1)
    with pytest.raises(ValueError, match="RoPE capacity"):
        generate(model, [1] * 250, 10)
    assert generate(model, [[1, 2], [3]], 0) == [[], []]


# ---- CLI ------------------------------------------------------------------------------------

def test_run_model_writes_then_reuses_a_checkpoint(tmp_path, capsys):
    args = ["--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--seed", "5",
            "--cache-dir", str(tmp_path)]
    assert run_model.main(args) == 0
    first = capsys.readouterr().out
    assert "written in" in first and "prompt (3 ids) [1, 2, 3]" in first
    assert "prefill:" in first and "decode: 1 steps" in first
    assert run_model.main(args) == 0
    second = capsys.readouterr().out
    assert "reused" in second
    gen = [ln for ln in first.splitlines() if "generated" in ln]
    assert gen == [ln for ln in second.splitlines() if "generated" in ln]
