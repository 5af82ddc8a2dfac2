"""``compressor_state``: the contract's compressor-state regression -- two consecutive
v41.compressor_ratio2 launches over one state ring and one set of caches, against two
consecutive ``goldens.compressor.compress_and_publish`` calls.

Call 1 (a prefill): ``case.requests`` requests (persistent ids 0..B-1) of random lengths
continue random prefixes (odd and even starts), each owning a state block of a
``B + 2``-block ring drawn from a nonidentity permutation; three trailing padding rows.
Call 2 (the next step, requests in another batch order):

* request 0 has departed and its state block is REUSED by a new request that starts at
  position 0 (the block's old bytes are never read: the new request's even-position row
  is written before anything consumes it);
* the survivors come in reversed batch order (batch row != persistent id); the first of
  them runs a chunk LONGER than the ring (``capacity + 3`` tokens, only its last
  ``capacity`` rows are written), the last is INACTIVE (state block -1, slots -1), the
  second (with four or more requests) is an EMPTY request, the others decode one token;
* four trailing padding rows with junk x, positions and slots ``>= 0``.

``case.active_tokens == 0`` makes call 2 idle: ``num_tokens = 0`` with padding rows only
(no projection, state or cache access).  Compressed slots: every closing token of an
enabled request publishes at its compressed index through a per-request page table.

Comparison after both calls: the union of both calls' published rows dequantized (MXFP4
4 %) and every other cache byte unchanged; the ring slot by slot
(``check_state_ring``, the ratio-2 entry's bound) over the union of written slots and
byte-identical elsewhere.
"""

from __future__ import annotations

import torch

from goldens.rope import precompute_rope_tables
from harness.case import Case, Support
from harness.compare import check_state_ring
from harness.entries import compressor_fixture as fx
from harness.entries import compressor_ratio2 as ratio2
from harness.fixtures import generator, nonidentity_permutation, randn, split_lengths
from harness.entries._kernel import sequential_cost
from harness.registry import Entry, SutOutput, Work, register

SUPPORT = Support(phase="prefill", inactive_rows=True)
CALLS = ("c1", "c2")
PAD1, PAD2 = 3, 4  # trailing padding rows of call 1 / call 2
NEW_LENGTH = 3  # tokens of the request that reuses request 0's block


def _plan(config, case) -> tuple[list, list, int]:
    """Per call, a list of batch rows ``(request id, start position, length, enabled)``;
    and the number of request ids (B + 1)."""
    B, seed, cap = case.requests, case.seed, config.cache.state_capacity
    if B < 3:
        raise ValueError(f"requests: {B}, compressor_state needs >= 3 (a departure, a long "
                         f"chunk and an inactive request)")
    lens = split_lengths(case.tokens, B, seed, "c1/qlens")
    prefix = torch.randint(0, 2 * config.cache.block_size, (B,),
                           generator=generator(seed, "c1/prefix")).tolist()
    call1 = [(k, prefix[k], lens[k], True) for k in range(B)]
    nxt = [prefix[k] + lens[k] for k in range(B)]
    survivors = list(range(B - 1, 0, -1))
    call2 = [(B, 0, NEW_LENGTH, True)]
    for i, k in enumerate(survivors):
        if i == 0:
            length, on = cap + 3, True
        elif i == len(survivors) - 1:
            length, on = 2, False
        elif i == 1 and B >= 4:
            length, on = 0, True
        else:
            length, on = 1, True
        call2.append((k, nxt[k], length, on))
    if case.active_tokens == 0:
        call2 = [(k, p, 0, on) for k, p, _, on in call2]
    return call1, call2, B + 1


def _call(config, case, rows, pad, tag, blocks_of, pages, capacity) -> dict:
    bs = config.cache.block_size
    n = sum(length for _, _, length, _ in rows)
    T = n + pad
    pos = torch.zeros(T, dtype=torch.int64)
    req = torch.zeros(T, dtype=torch.int64)
    slots = torch.full((T,), -1, dtype=torch.int64)
    qsl, t = [0], 0
    for r, (k, p0, length, on) in enumerate(rows):
        for j in range(length):
            p = p0 + j
            pos[t], req[t] = p, r
            if on and p % 2 == 1:
                ci = (p + 1) // 2 - 1
                slots[t] = pages[k][ci // bs] * bs + ci % bs
            t += 1
        qsl.append(t)
    rows_total = sum(len(v) for v in pages.values()) * bs
    pos[n:] = capacity + 1
    req[n:] = len(rows) + 3
    slots[n:] = torch.arange(pad) % rows_total
    x = randn((T, config.hidden_size), case.seed, f"{tag}/x", torch.bfloat16)
    x[n:] = 7.0
    table = torch.tensor([blocks_of[k] if on else -1 for k, _, _, on in rows],
                         dtype=torch.int32).reshape(len(rows), 1)
    return {"x": x, "query_start_loc": torch.tensor(qsl, dtype=torch.int32),
            "position_ids": pos.to(torch.int32), "token_to_req_indices": req.to(torch.int32),
            "compressed_slots": slots.to(torch.int32),
            "num_tokens": torch.tensor([n], dtype=torch.int32), "state_block_table": table}


def build_inputs(config, case):
    call1, call2, ids = _plan(config, case)
    B, bs, seed = case.requests, config.cache.block_size, case.seed
    nsb = B + 2
    perm = nonidentity_permutation(nsb, seed, "state_blocks").tolist()
    blocks_of = {k: perm[k] for k in range(B)}
    blocks_of[B] = blocks_of[0]  # the departed request's block, reused
    last = {}
    for k, p0, length, _ in (*call1, *call2):
        last[k] = max(last.get(k, 0), p0 + length)
    npages = {k: -(-(last[k] // 2) // bs) + 1 for k in range(ids)}
    cperm = nonidentity_permutation(sum(npages.values()) + 2, seed, "pages").tolist()
    pages, at = {}, 0
    for k in range(ids):
        pages[k] = cperm[at:at + npages[k]]
        at += npages[k]
    capacity = -(-(max(last.values()) + 2) // 64) * 64
    cos, sin = precompute_rope_tables(config, compressed=True, capacity=capacity)
    out = {**fx.weights(config, case, 2), "freqs_cos": cos, "freqs_sin": sin,
           **fx.caches(config, len(cperm), seed),
           "state_cache": randn((nsb, config.cache.state_capacity, config.state_width), seed,
                                "state")}
    for tag, rows, pad in (("c1", call1, PAD1), ("c2", call2, PAD2)):
        for k, v in _call(config, case, rows, pad, tag, blocks_of, pages, capacity).items():
            out[f"{tag}.{k}"] = v
    return out


def call_inputs(inputs: dict, tag: str, state: dict) -> dict:
    """One call's inputs in the ratio-2 entry's names: shared weights and tables, the
    call's metadata, and the caches / ring ``state`` carried from the previous call."""
    shared = {k: v for k, v in inputs.items() if "." not in k}
    mine = {k.split(".", 1)[1]: v for k, v in inputs.items() if k.startswith(f"{tag}.")}
    return {**shared, **mine, **state}


def kernel_sut(**options):
    """Two ratio-2 launches; the second starts from the first's caches and ring."""
    launch = ratio2.kernel_sut(**options)

    def run(platform, config, case, inputs) -> SutOutput:
        state = {k: inputs[k] for k in ratio2.OUTPUTS}
        costs = []
        for tag in CALLS:
            produced = launch(platform, config, case, call_inputs(inputs, tag, state))
            state = dict(produced.outputs)
            costs += produced.costs
        return SutOutput(state, [sequential_cost(costs)] if costs else [])
    return run


def golden(config, case, inputs):
    state = {k: inputs[k].clone() for k in ratio2.OUTPUTS}
    for tag in CALLS:
        call = call_inputs(inputs, tag, {})
        fx.run_golden(config, 2, call, state, state["state_cache"])
    return state


def compare(config, case, inputs, gold, actual):
    calls = [call_inputs(inputs, tag, {}) for tag in CALLS]
    published = torch.cat([fx.published_slots(c) for c in calls]).unique()
    written = torch.cat([ratio2.ring_slots(config, c) for c in calls]).unique()
    return [*fx.compare_caches(config, inputs, gold, actual, slots=published),
            *check_state_ring("state_cache", actual["state_cache"], gold["state_cache"],
                              written, atol=ratio2.RING_ATOL, rtol=ratio2.RING_RTOL)]


def work(config, case, inputs):
    """The two launches' work, summed."""
    parts = [ratio2.work(config, case, call_inputs(inputs, tag, {})) for tag in CALLS]
    flops: dict = {}
    for w in parts:
        for k, v in w.flops.items():
            flops[k] = flops.get(k, 0) + v
    return Work(sum(w.bytes for w in parts), flops)


ENTRY = register(Entry(
    name="compressor_state",
    description="compressor-state regression: two consecutive ratio-2 launches with "
                "request reordering, block reuse, a chunk longer than the ring, an "
                "inactive and an empty request, trailing padding, and an idle call",
    support=SUPPORT,
    matrix=(Case(entry="compressor_state", tokens=20, requests=4),
            Case(entry="compressor_state", tokens=9, requests=3, seed=5),
            Case(entry="compressor_state", tokens=12, active_tokens=0, requests=3, seed=2)),
    slow_cases=(Case(entry="compressor_state", tokens=192, requests=32, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut()},
    work=work,
))
