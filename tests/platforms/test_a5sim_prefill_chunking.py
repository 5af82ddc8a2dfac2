"""Host chunking of prefill-sized launches is invisible in the results: a TINY C1A Reindex
prefill leaf (12 rows, 10 active) run with every piece in ONE launch equals, byte for byte
in every output and cache tensor, the same case with every row-chunked piece split into
launches of 5 rows (Q/KV projection, index query, paged indexer, sparse attention, output
projection).  FLASH prefill relies on exactly these splits (32-64 rows per launch)."""

from __future__ import annotations

import torch

from harness import registry
from harness.case import Case
from harness.entries import attention_kernels, index_query, o_proj, paged_indexer, qkv_proj_rope
from harness.entries import sparse_attention as sparse
from harness.entries._kernel import run_with
from harness.verdict import all_passed

CASE = Case(entry="prefill_attn_c1a_reindex", tokens=12, active_tokens=10, requests=2, seed=5)
CHUNK = 5


CHUNKED = ("v41.qkv_proj_rope", "v41.index_query", "v41.paged_indexer", "v41.sparse_attention",
           "v41.o_proj")


def _run(numerics, monkeypatch, chunk):
    """(verdicts, outputs, rows per launch of each chunked module)."""
    rows: dict = {}
    call = attention_kernels.RankLauncher.__call__

    def counted(self, module, axes, *args, **kwargs):
        if not self.dry:  # the launches, not the host's dry validation pass
            rows.setdefault(module, []).append(axes.get("tokens"))
        return call(self, module, axes, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(attention_kernels.RankLauncher, "__call__", counted)
        for mod in (qkv_proj_rope, o_proj, index_query):
            m.setattr(mod, "A5SIM_CHUNK", chunk)
        m.setattr(paged_indexer, "LAUNCH_ROWS", chunk)
        m.setattr(sparse, "chunk_tokens", lambda inputs, platform=None: chunk)
        verdicts, out, _ = run_with(numerics, CASE, registry.get(CASE.entry).kernels["a5sim"])
    return verdicts, out, rows


def test_one_launch_and_five_row_chunks_agree_bit_for_bit(numerics, monkeypatch):
    whole_v, whole, whole_rows = _run(numerics, monkeypatch, CASE.tokens)
    split_v, split, split_rows = _run(numerics, monkeypatch, CHUNK)
    n = CASE.active
    for module in CHUNKED:  # the split really happened, over the active rows
        assert whole_rows[module] == [n], (module, whole_rows[module])
        assert split_rows[module] == [5, 5], (module, split_rows[module])
    assert all_passed(whole_v) and all_passed(split_v)
    assert whole.keys() == split.keys()
    for k, a in whole.items():
        b = split[k]
        if a.dtype.itemsize == 1:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b), k
