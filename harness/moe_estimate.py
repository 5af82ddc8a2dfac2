"""``python -m harness.moe_estimate``: the estimated A5 time of every EP rank's routed
experts at a preset's full size, without the fixture's expert weights.

``python -m harness.bench --preset flash --estimate-only routed_experts`` builds the whole
fixture: 384 packed FLASH experts (5.8 GB), cloned for the SUT, which with the cost model's
worker passes 24 GiB.  The cost model's estimate depends on shapes and integer metadata
only (``tests/platforms/test_a5sim_estimate_only.py``), so this command takes the case's
routing from the fixture (:func:`harness.entries.routed_experts.routing`), gives every
expert constant packed weights of the right shapes (codes 0, scales 2^0), and estimates
each rank through the same launches as the estimate-only SUT: the whole rank at once, or
chunks of experts for a rank past the size limit
(:func:`harness.entries.routed_experts.estimate_rank_in_chunks`).
``tests/harness/test_moe_estimate.py`` checks it gives the SUT's per-rank figures.

Usage: ``python -m harness.moe_estimate [--preset flash] [--tokens 192] [--ep 4] [--tp 2]
[--dp 2] [--seed 17] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from harness.case import Case
from harness.entries import routed_experts as re_entry

def rank_estimates(platform, config, case: Case) -> list[dict]:
    """Per EP rank: ``rank``, dispatched ``rows``, ``experts_with_rows``, ``launches`` and
    the summed ``aicore_e2e_us`` (None for a rank with nothing to launch)."""
    inputs = re_entry.routing(config, case)
    ranks = re_entry.ranks(case)
    cap = re_entry.capacity(config, case, inputs["indices"])
    inputs["y"] = torch.empty((ranks, cap, 0), dtype=torch.bfloat16)  # rank_inputs reads cap
    inputs.update(re_entry.placeholder_weights(config))
    re_entry.validate_routing(config, case, inputs)
    n_local = config.moe.n_routed_experts // ranks
    out = []
    for r in range(ranks):
        args = re_entry.rank_inputs(config, case, r, inputs)
        off = args["expert_offsets"]
        record = re_entry.estimate_rank_in_chunks(platform, config, case, r, args)
        out.append({"rank": r, "rows": int(off[-1]), "local_experts": n_local,
                    "experts_with_rows": int((off[1:] > off[:-1]).sum()),
                    "launches": record["launches"] if record else 0,
                    "aicore_e2e_us": record["aicore_e2e_us"] if record else None})
        del args
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.moe_estimate",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=("tiny", "flash"), default="flash")
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--ep", type=int, default=4)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from harness.platforms.a5sim import A5SimPlatform
    from harness.platforms.verify import ESTIMATE_LEVEL

    case = Case(entry="routed_experts", tokens=args.tokens, ep=args.ep, tp=args.tp, dp=args.dp,
                seed=args.seed, preset=args.preset)
    platform = A5SimPlatform(verify=ESTIMATE_LEVEL)
    t0 = time.time()
    try:
        rows = rank_estimates(platform, case.config, case)
    finally:
        platform.close()
    times = [r["aicore_e2e_us"] for r in rows if r["aicore_e2e_us"] is not None]
    summary = {"case": case.case_id, "ranks": rows, "slowest_rank_us": max(times, default=None),
               "wall_s": round(time.time() - t0, 1)}
    if args.json:
        print(json.dumps(summary))
    else:
        for r in rows:
            print(f"rank {r['rank']}: {r['rows']} rows, {r['experts_with_rows']}/"
                  f"{r['local_experts']} experts with rows, {r['launches']} launches, "
                  f"{r['aicore_e2e_us']} us")
        print(f"{case.case_id}: slowest rank {summary['slowest_rank_us']} us "
              f"(a split rank's launches summed; {summary['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
