"""Run the golden model end to end: ``python -m goldens.run_model``.

Writes (or reuses) a synthetic checkpoint of the preset (default TINY) from ``--seed`` in a
cache directory (default ``out/golden_model/<preset>-seed<seed>``; ``--checkpoint DIR`` uses
an existing checkpoint instead), loads it with :class:`goldens.checkpoint.Checkpoint`, runs
:func:`goldens.forward.generate` -- one packed prefill, then greedy decode steps with the
paged caches carried -- and prints the prompt, the generated ids and the timings (checkpoint
write, prefill seconds, each decode step's seconds).

Examples::

    python -m goldens.run_model
    python -m goldens.run_model --prompt-ids 1,2,3 --max-new-tokens 4 --seed 7
    python -m goldens.run_model --prompt-ids 5,6,7,8 --prompt-ids 9,10   # two requests
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from goldens.checkpoint import CONFIG_FILE, INDEX_FILE, CheckpointError, \
    write_synthetic_checkpoint
from goldens.config import preset
from goldens.forward import GoldenModel, generate

DEFAULT_PROMPT = [1, 17, 42, 99, 123, 7, 256, 311, 64, 5, 480, 23, 150, 8, 77, 301, 12, 199,
                  400, 3]
DEFAULT_CACHE = os.path.join("out", "golden_model")


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids: {text!r} is not a comma-separated "
                                         f"list of ints") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids: empty")
    return ids


def _synthetic_matches(root: str, seed: int) -> bool:
    try:
        with open(os.path.join(root, CONFIG_FILE), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return False
    return (cfg.get("synthetic", {}).get("seed") == seed
            and os.path.isfile(os.path.join(root, INDEX_FILE)))


def ensure_checkpoint(root: str, config, seed: int) -> tuple[str, float | None]:
    """A synthetic checkpoint of ``config`` from ``seed`` at ``root``: reused when one from
    the same seed is there, else written.  Returns ``(root, write seconds or None)``."""
    if _synthetic_matches(root, seed):
        return root, None
    t0 = time.perf_counter()
    write_synthetic_checkpoint(root, config, seed, overwrite=True)
    return root, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m goldens.run_model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny", help="model preset (default tiny)")
    ap.add_argument("--prompt-ids", type=_ids, action="append",
                    help="comma-separated token ids; repeat for several requests "
                         "(default: a fixed 20-token prompt)")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0, help="synthetic checkpoint seed")
    ap.add_argument("--checkpoint", help="an existing checkpoint directory (skips writing)")
    ap.add_argument("--cache-dir", default=DEFAULT_CACHE,
                    help=f"where synthetic checkpoints are kept (default {DEFAULT_CACHE})")
    ap.add_argument("--page-seed", type=int, default=None,
                    help="scatter physical cache pages with this seed")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: TINY ops are too small to gain from "
                         "more, and oversubscribed threads slow them down)")
    args = ap.parse_args(argv)

    config = preset(args.preset)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    prompts = args.prompt_ids or [list(DEFAULT_PROMPT)]

    if args.checkpoint:
        root, wrote = args.checkpoint, None
        source = f"checkpoint {root}"
    else:
        root = os.path.join(args.cache_dir, f"{config.name}-seed{args.seed}")
        root, wrote = ensure_checkpoint(root, config, args.seed)
        source = (f"synthetic checkpoint {root} (seed {args.seed}, "
                  + (f"written in {wrote:.2f} s)" if wrote is not None else "reused)"))
    try:
        t0 = time.perf_counter()
        longest = max(len(p) for p in prompts) + args.max_new_tokens
        cap = min(config.rope.max_position, max(4096, longest))
        model = GoldenModel.from_checkpoint(root, config, rope_capacity=cap)
        setup = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = generate(model, prompts, args.max_new_tokens, page_seed=args.page_seed,
                       return_result=True)
        total = time.perf_counter() - t0
    except (CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(f"golden model: preset {config.name}, {config.num_layers} layers "
          f"({', '.join(lc.mode.value for lc in config.layers())})")
    print(f"weights: {source}; model set-up {setup:.2f} s")
    for i, (p, g) in enumerate(zip(res.prompts, res.generated)):
        print(f"request {i}: prompt ({len(p)} ids) {p}")
        print(f"request {i}: generated ({len(g)} ids) {g}")
    dec = res.decode_seconds
    print(f"prefill: {res.prefill_seconds:.3f} s for {sum(len(p) for p in prompts)} rows")
    if dec:
        print(f"decode: {len(dec)} steps x {len(prompts)} rows, mean "
              f"{sum(dec) / len(dec):.3f} s/step, per step "
              f"[{', '.join(f'{s:.3f}' for s in dec)}]")
    print(f"total generate: {total:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
