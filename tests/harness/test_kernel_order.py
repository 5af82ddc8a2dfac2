"""The order audit on the kernels' own task graphs (``harness.order_audit``): no loop of a
kernel hands rows to a later root function with edges from its last iteration only, and no
writer of a tensor that later root functions read is left with no edge to any of them
(pypto 0.2.0 tracks a tensor across root functions in cells of its static dims, the last
partial writer per cell).  Each case runs the entry at TINY on the cost model (no outputs
computed) with its launches kept, at token counts that fill every row tile (T = 64 and 384:
an empty piece of a last partial tile, or a clamped tile that rewrites its neighbour's
bytes, counts as a writer no reader waits for), through ``python -m harness.bench
--order-audit`` (each case's ``dyn_topo.txt`` and ``program.json`` kept, audited, deleted).

The default run covers the kernels that hand rows from one loop or piece to another, at
T=384 (two row tiles of the 192-row kernels); the ``slow`` run covers every building block
at T=64 and T=384."""

from __future__ import annotations

import json

import pytest

from harness import bench

REORDERED = ["compressor_ratio2", "compressor_state", "index_query", "o_proj", "qkv_proj_rope",
             "routed_experts", "shared_expert"]
OTHERS = ["compressor_ratio1", "gate", "hc_head", "hc_mixes", "hc_post", "hc_pre",
          "hierarchical_sparse_indexer", "input_pack", "lm_head", "paged_indexer", "rmsnorm",
          "rope_rows", "sparse_attention", "window_publish"]


def _audit(entry: str, tokens: int, capsys) -> None:
    rc = bench.main(["--preset", "tiny", "--estimate-only", "--json", "--order-audit",
                     "--tokens", str(tokens), entry])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()
            if line.startswith("{")]
    assert rows, f"{entry} T={tokens}: no case ran"
    bad = {r["case"]: r["order"] if r["status"] == "estimate" else r["reason"] for r in rows
           if r["status"] != "estimate" or r["order"] != "ordered"}
    assert rc == 0 and not bad, f"{entry} T={tokens}: {bad}"


@pytest.mark.parametrize("entry", REORDERED)
def test_reordered_kernels_order_every_iteration(entry, capsys):
    _audit(entry, 384, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [64, 384])
@pytest.mark.parametrize("entry", REORDERED + OTHERS)
def test_every_kernel_orders_every_iteration(entry, tokens, capsys):
    _audit(entry, tokens, capsys)

