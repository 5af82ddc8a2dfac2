"""``lm_head``: v41.lm_head (one TP rank's vocabulary shard: FP32 logits and the shard's
greedy pick) on every rank, the picks combined on the host, against
``goldens.boundary.lm_head`` / ``greedy_sample``.

Fixture (deterministic in the seed): BF16 hidden rows, an FP32 head ``[V, hidden]`` (scale
``hidden^-0.5``, sharded per rank with ``vocab_shard``); rows at or past ``num_rows``
(``case.active``) are padding and the golden sees them as zero hidden rows (a -1 logit row
of ``gather_logit_rows``).  Kind ``ties`` puts one head row (2.0 on channel 0, zeros
elsewhere) at vocab positions :data:`TIE_POSITIONS` (two in one tile, others in later tiles,
and at TP2/TP4 on other ranks) and 4.0 on channel 0 of two hidden rows in three: their
logit there is exactly 8.0 in any summation order and their maximum, so equal maxima occur
inside a tile, across tiles and across ranks, and the lowest position must win.

Outputs: ``logits`` FP32 ``[R, V]`` (the ranks' shards in rank order), each rank's pick
``rank_best_value`` / ``rank_best_index`` ``[tp, R]`` (global indices) and the combined
``best_value`` / ``ids`` ``[R]`` (:func:`combine_rank_picks`).

Checks:

* ``logits``: the contract's per-row bound on the active rows, no sentinel left, padding
  rows exact zeros; and ``fp32_accumulation``: every element within the rigorous bound of an
  FP32 dot product, ``|a - g| <= gamma_{D+1} * (|h| @ |W|^T) + 2^-24 |g|`` with
  ``gamma_n = n u / (1 - n u)``, ``u = 2^-24`` (:func:`logit_error_bound`).  The per-row
  bound alone does not see BF16-rounded logits (relative 2^-9 per element is below its 1 %
  RMS budget); this one does.
* ``*_self``: each pick is EXACTLY the golden rule applied to the kernel's own logits (the
  maximum's bytes and the lowest index among equal maxima; the combined pick over the
  concatenated logits), so every exact tie the kernel produces proves the tie rule.
* ``*_golden``: each pick against ``greedy_sample`` of the GOLDEN logits, exact on a row
  whose largest golden logit is more than ``2 * max bound`` above every DIFFERENT golden
  value (exact golden ties included: the lowest index is required); on a row with a closer
  distinct value (a near tie the FP32 kernel may legitimately order the other way) any id
  whose golden logit is within ``2 * max bound`` of the maximum is accepted, and the
  verdict's note counts those rows.

Host validation (:func:`validate_launch`, before any launch): dtype and shape of hidden and
head, finite values, ``num_rows`` INT32 ``[1]`` in ``[0, R]``.
"""

from __future__ import annotations

import dataclasses

import torch

from goldens.boundary import gather_logit_rows, greedy_sample, lm_head, lm_head_shard, vocab_shard
from goldens.config import local_vocab
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel, check_zero_rows
from harness.entries._kernel import active_count
from harness.fixtures import SENTINEL, randn, sentinel
from harness.platforms.topology import CUBE_FP32, VECTOR_FP32
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes
from harness.verdict import summarize

MODULE = "v41.lm_head"
SUPPORT = Support(phase="prefill", tp_sizes=(1, 2, 4), kinds=("mixed", "ties"),
                  inactive_rows=True)
TIE_POSITIONS = (70, 75, 300, 501)  # TINY V=512: tile 0 twice, later tiles / ranks
TIE_CHANNEL_VALUE = 4.0  # hidden[:, 0] of the tie rows (the tie head row: 2.0 there, 0 elsewhere)
INDEX_SENTINEL = -13
U32 = 2.0 ** -24  # FP32 unit roundoff


def _tie_positions(config) -> tuple[int, ...]:
    return tuple(p for p in TIE_POSITIONS if p < config.vocab_size)


def build_inputs(config, case):
    t, d, v, tp = case.tokens, config.hidden_size, config.vocab_size, case.tp
    hidden = randn((t, d), case.seed, "hidden")
    head = randn((v, d), case.seed, "head", scale=d ** -0.5)
    if case.kind == "ties":
        # one nonzero channel: 4.0 * 2.0 = 8.0 exactly in any summation order, so the tie
        # is exact in every lowering of the kernel (a dense copied row ties exactly only
        # within one consistent summation order)
        row = torch.zeros(d)
        row[0] = 2.0
        for p in _tie_positions(config):
            head[p] = row
        hidden[::3, 0] = 0.0  # every third row keeps a random maximum
        hidden[torch.arange(t) % 3 != 0, 0] = TIE_CHANNEL_VALUE
    return {"hidden": hidden.to(torch.bfloat16), "head": head,
            "num_rows": torch.tensor([case.active], dtype=torch.int32),
            "logits": sentinel((t, v), torch.float32),
            "rank_best_value": sentinel((tp, t), torch.float32),
            "rank_best_index": torch.full((tp, t), INDEX_SENTINEL, dtype=torch.int32),
            "best_value": sentinel((t,), torch.float32),
            "ids": torch.full((t,), INDEX_SENTINEL, dtype=torch.int32)}


def validate_launch(config, inputs) -> int:
    """Host check before any launch: hidden BF16 ``[R >= 1, D]``, head FP32 ``[V, D]``, both
    finite, ``num_rows`` INT32 ``[1]`` in ``[0, R]``.  Returns the active row count; raises
    ValueError naming the field and the bound."""
    h, w = inputs["hidden"], inputs["head"]
    d, v = config.hidden_size, config.vocab_size
    if h.dtype != torch.bfloat16 or h.dim() != 2 or h.shape[0] < 1 or h.shape[1] != d:
        raise ValueError(f"hidden: must be bfloat16 [R >= 1, {d}], got {h.dtype} "
                         f"{tuple(h.shape)}")
    if w.dtype != torch.float32 or tuple(w.shape) != (v, d):
        raise ValueError(f"head: must be float32 [{v}, {d}], got {w.dtype} {tuple(w.shape)}")
    for name, x in (("hidden", h), ("head", w)):
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name}: contains NaN or Inf; values must be finite")
    return active_count(inputs["num_rows"], h.shape[0], "num_rows")


def combine_rank_picks(values: torch.Tensor, indices: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The host transport of the greedy picks: ``values`` FP32 / ``indices`` INT32
    ``[tp, R]`` (rank ``r``'s best logit and its GLOBAL vocab index per row) -> ``(value,
    index)`` ``[R]``: the largest value; on equal values the LOWEST rank wins (ranks hold
    ascending vocab ranges and each rank's index is its lowest maximum, so this is the
    lowest global index among equal maxima: ``greedy_sample``'s rule).  Ranks are visited in
    ascending order and a later rank replaces the pick only when STRICTLY greater."""
    if values.dim() != 2 or values.shape != indices.shape or values.shape[0] < 1:
        raise ValueError(f"values/indices: must both be [tp >= 1, R], got "
                         f"{tuple(values.shape)} and {tuple(indices.shape)}")
    if bool(torch.isnan(values).any()):
        raise ValueError("values: contains NaN")
    best, idx = values[0].clone(), indices[0].clone()
    for r in range(1, values.shape[0]):
        take = values[r] > best
        best = torch.where(take, values[r], best)
        idx = torch.where(take, indices[r], idx)
    return best, idx


def kernel_sut(variant: str = "reference", combine=combine_rank_picks):
    """The SUT: host validation, one launch per TP rank (its head shard), the ranks' logits
    in rank order and their picks combined by ``combine`` (tests pass a wrong one)."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        validate_launch(config, inputs)
        tp, t = case.tp, inputs["hidden"].shape[0]
        vl = local_vocab(config, tp)
        from v41.lm_head import dims  # no pypto: safe in the calling process
        cols = dims(config, {"tokens": t, "tp": tp})["pick_columns"]
        options = {} if variant == "reference" else {"variant": variant}
        logits = inputs["logits"]
        values, indices = inputs["rank_best_value"], inputs["rank_best_index"]
        records = []
        for rank in range(tp):
            program = platform.compile(KernelSpec(MODULE, options), config,
                                       {"tokens": t, "tp": tp, "rank": rank})
            args = {"hidden": inputs["hidden"],
                    "head": vocab_shard(inputs["head"], config, tp, rank).contiguous(),
                    "num_rows": inputs["num_rows"],
                    "logits": torch.full((t, vl), SENTINEL, dtype=torch.float32),
                    "best_value": torch.full((t, 1), SENTINEL, dtype=torch.float32),
                    "best_index": torch.full((t, 1), INDEX_SENTINEL, dtype=torch.int32)}
            for name in ("tile_max", "tile_pick"):  # kernel scratch, not compared
                args[name] = torch.full((t, cols), SENTINEL, dtype=torch.float32)
            result = platform.launch(program, rank, args)
            result.raise_for_error()
            logits[:, rank * vl:(rank + 1) * vl] = result.outputs["logits"]
            values[rank] = result.outputs["best_value"][:, 0]
            indices[rank] = result.outputs["best_index"][:, 0]
            record = result.cost_record()
            if record:
                records.append(record)
        best, ids = combine(values, indices)
        return SutOutput({"logits": logits, "rank_best_value": values,
                          "rank_best_index": indices, "best_value": best, "ids": ids}, records)
    return run


def work(config, case, inputs):
    """One rank's launch (the estimate is the slowest rank's): the hidden rows, its head
    shard and its logits moved once, the per-tile pick scratch written and read back; the
    FP32 cube product; about six vector operations per logit for the tile picks."""
    from v41.lm_head import dims  # no pypto: safe in the calling process
    t, d = case.tokens, config.hidden_size
    vl = local_vocab(config, case.tp)
    cols = dims(config, {"tokens": t, "tp": case.tp})["pick_columns"]
    moved = tensor_bytes(inputs["hidden"]) + vl * d * 4 + t * vl * 4 + t * 8 + 2 * 2 * t * cols * 4
    return Work(moved, {CUBE_FP32: 2 * case.active * d * vl, VECTOR_FP32: 6 * case.active * vl})


def _rows(inputs) -> torch.Tensor:
    """The hidden rows the golden sees: padding rows (at or past ``num_rows``) zero."""
    t = inputs["hidden"].shape[0]
    n = int(inputs["num_rows"][0])
    ids = torch.arange(t, dtype=torch.int32)
    ids[n:] = -1
    return gather_logit_rows(inputs["hidden"], ids)


def golden(config, case, inputs):
    tp, vl = case.tp, local_vocab(config, case.tp)
    rows = _rows(inputs)
    values, indices = [], []
    for r in range(tp):
        shard = lm_head_shard(rows, vocab_shard(inputs["head"], config, tp, r))
        values.append(shard.amax(dim=-1))
        indices.append(greedy_sample(shard) + r * vl)
    logits = lm_head(rows, inputs["head"], config, tp)
    return {"logits": logits, "rank_best_value": torch.stack(values),
            "rank_best_index": torch.stack(indices).to(torch.int32),
            "best_value": logits.amax(dim=-1), "ids": greedy_sample(logits)}


def logit_error_bound(rows: torch.Tensor, head: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """FP64 ``[R, V]``: the worst-case error of an FP32 dot product of length D in any
    summation order, ``gamma_{D+1} * (|h| @ |W|^T)``, plus the golden's own rounding to
    FP32 (``2^-24 |g|``)."""
    n = rows.shape[1] + 1
    gamma = n * U32 / (1 - n * U32)
    mag = rows.to(torch.float64).abs() @ head.to(torch.float64).abs().T
    return gamma * mag + U32 * gold.to(torch.float64).abs()


def _pick_self(name, logits, index, value, offset):
    """Exact: ``index`` is ``offset`` + the lowest index of the maximum of ``logits`` (the
    kernel's own) and ``value`` holds that maximum's bytes."""
    want = greedy_sample(logits).to(torch.int64) + offset
    top = logits.amax(dim=-1)
    bad = (index.to(torch.int64) != want) | (value.view(torch.int32) != top.view(torch.int32))
    labels = list(range(logits.shape[0]))
    return [summarize(name, "pick_self", bad.to(torch.float64), 0.0, labels,
                      metric="pick != (max bytes, lowest index among equal maxima) of its own "
                             "logits")]


def _pick_golden(name, gold, bound, index, offset):
    """``index`` against ``greedy_sample(gold)``: exact unless a DIFFERENT golden value lies
    within ``2 * max(bound)`` of the row maximum (then any id that close is accepted)."""
    g = gold.to(torch.float64)
    slack = 2 * bound.amax(dim=-1)
    top = g.amax(dim=-1)
    below = torch.where(g == top[:, None], torch.full_like(g, -torch.inf), g).amax(dim=-1)
    near_tie = (top - below) <= slack
    want = greedy_sample(gold).to(torch.int64) + offset
    local = index.to(torch.int64) - offset
    inside = (local >= 0) & (local < g.shape[1])
    picked = g.gather(1, local.clamp(0, g.shape[1] - 1)[:, None])[:, 0]
    ok = torch.where(near_tie, inside & (picked >= top - slack), index.to(torch.int64) == want)
    labels = list(range(g.shape[0]))
    note = f"{int(near_tie.sum())} near-tied rows accepted any id within 2*bound of the max"
    v = summarize(name, "pick_golden", (~ok).to(torch.float64), 0.0, labels,
                  metric="pick != greedy_sample(golden) (near ties: within 2*bound)")
    return [dataclasses.replace(v, note=note)]


def compare(config, case, inputs, gold, actual):
    n, tp, vl = int(inputs["num_rows"][0]), case.tp, local_vocab(config, case.tp)
    t = inputs["hidden"].shape[0]
    a, g = actual["logits"], gold["logits"]
    bound = logit_error_bound(_rows(inputs), inputs["head"], g)
    verdicts = []
    if n:
        diff = (a[:n].to(torch.float64) - g[:n].to(torch.float64)).abs()
        # a zero bound (a zero head row or hidden row) allows exactly no error
        err = torch.where(bound[:n] > 0, diff / bound[:n].clamp_min(1e-300),
                          torch.where(diff == 0, 0.0, torch.inf))
        verdicts += (check_row_bound("logits", a[:n], g[:n])
                     + check_sentinel("logits", a[:n], SENTINEL, ref=g[:n])
                     + [summarize("logits", "fp32_accumulation", err.amax(dim=-1), 1.0,
                                  list(range(n)), metric="max |a-g| / (gamma_{D+1} |h||W|^T "
                                                         "+ 2^-24 |g|)")])
    verdicts += check_zero_rows("logits", a, rows=slice(n, t))
    for r in range(tp):
        cols = slice(r * vl, (r + 1) * vl)
        name = f"rank_best_index[{r}]"
        verdicts += _pick_self(name, a[:, cols], actual["rank_best_index"][r],
                               actual["rank_best_value"][r], r * vl)
        verdicts += _pick_golden(name, g[:, cols], bound[:, cols],
                                 actual["rank_best_index"][r], r * vl)
    verdicts += _pick_self("ids", a, actual["ids"], actual["best_value"], 0)
    return verdicts + _pick_golden("ids", g, bound, actual["ids"], 0)


ENTRY = register(Entry(
    name="lm_head",
    description="LM head: each TP rank's vocab shard streamed in tiles (FP32 logits) with its "
                "greedy pick (lowest index among equal maxima); picks combined on the host "
                "(largest value, lowest rank on ties)",
    support=SUPPORT,
    matrix=(Case(entry="lm_head", tokens=21), Case(entry="lm_head", tokens=6, kind="ties"),
            Case(entry="lm_head", tokens=40, active_tokens=17, tp=2),
            Case(entry="lm_head", tokens=9, tp=4, kind="ties")),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut()},
    work=work,
))
