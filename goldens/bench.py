"""Golden cost of one decode Attention half-layer per mode: ``python -m goldens.bench``.

Each mode runs in its own subprocess (so one mode's allocations cannot hide another's
peak) on the preset's representative layer of that mode: a decode batch of ``--tokens``
rows (default 192 = 32 requests x 6 rows, the decode reservation) over long prefixes
(``--context``, default 4096 tokens per request at FLASH), the full TP1 head set
(``--tp 1``, replicated wiring) unless asked otherwise.  The caches are filled with random
bytes of the production formats; a Reuse / Reindex layer gets synthetic Top-K rows /
candidate mask of its source (fixture initialization, not timed).

Reported per mode: wall and CPU (all threads) time of :func:`goldens.modes.attention_half_layer` (validation
included), and peak memory of the call -- the process high-water mark reset just before
the call (``/proc/self/clear_refs``) minus the resident size before it; where the kernel
does not allow the reset, the ``ru_maxrss`` delta (a lower bound).  Also the process peak.

``--preset tiny`` is a quick run; ``--json`` prints the results as one JSON line last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time

import torch

from goldens.config import Mode, V41Config, preset
from goldens.indexer import select_candidate_blocks
from goldens.modes import ModelCaches, RopeTables, attention_half_layer, build_forward_batch, \
    random_mode_weights

_GIB = 2**30
_DEFAULT_CONTEXT = {"flash": 4096, "tiny": 200}


# ---- memory probes -----------------------------------------------------------------------------

def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ---- fixture -----------------------------------------------------------------------------------

def _random_bytes(t: torch.Tensor, g: torch.Generator, mask: int = 0xFF) -> None:
    b = t.view(torch.uint8)
    b.copy_(torch.randint(0, 256, b.shape, generator=g, dtype=torch.uint8) & mask)


def build_fixture(config: V41Config, layer: int, tokens: int, active: int, context: int,
                  seed: int = 0, phase: str = "decode", requests: int | None = None):
    """Batch of ``active`` rows padded to ``tokens``, caches for ``layer`` and its sources
    with random contents, scratch published for its sources.  Decode: <= 6 rows per
    request over ~``context`` cached tokens each; prefill: ``requests`` packed prompts
    (default one per 2048 rows) over a cached prefix of ``context`` tokens."""
    g = torch.Generator().manual_seed(seed)
    i32 = torch.int32
    if phase == "prefill":
        B = requests or max(1, -(-active // 2048))
        rows = [active // B + (1 if r < active % B else 0) for r in range(B)]
        per = max(rows)
        kv = [context] * B
    else:
        per = config.cache.decode_rows_per_request
        rows = [per] * (active // per) + ([active % per] if active % per else [])
        B = max(1, len(rows))
        rows = rows or [0]
        kv = [int(context * (0.5 + (r * 0.6180339887) % 1.0)) for r in range(B)]
    bs = config.cache.block_size
    pages = -(-(max(kv) + per) // bs)
    wt = torch.randperm(B * pages, generator=g).to(i32).view(B, pages)
    ctab = torch.randperm(B * pages, generator=g).to(i32).view(B, pages)
    ctables = {s: ctab for s in config.kv_source_layer_ids}
    sblk = torch.arange(B, dtype=i32)[:, None]
    stables = {s: sblk for s in config.kv_source_layer_ids if config.compress_ratios[s] == 2}
    qsl = torch.tensor([0] + torch.tensor(rows).cumsum(0).tolist(), dtype=i32)
    batch = build_forward_batch(config, qsl, torch.tensor(kv, dtype=i32), wt, ctables, stables,
                                num_padded_tokens=tokens, num_state_blocks=B)
    caches = ModelCaches.allocate(config, window_blocks=B * pages, compressed_blocks=B * pages,
                                  state_blocks=B, layers=[layer])
    for wc in caches.windows.values():  # E4M3 payload without NaN codes, scales 2^-4
        _random_bytes(wc.payload, g, 0x77)
        wc.scales.fill_(127 - 4)
    for sc in caches.sources.values():  # packed FP4 (every code finite)
        _random_bytes(sc.compressed_kv, g)
        sc.compressed_kv_scale.copy_(torch.full(sc.compressed_kv_scale.shape, 0.25))
        _random_bytes(sc.index_key, g)
        sc.index_key_scale.fill_(127 - 2)
    for st in caches.states.values():
        st.copy_(torch.randn(st.shape, generator=g))
    scratch = caches.begin_forward(config, batch)
    lc = config.layer_config(layer)
    md = batch.metadata
    if lc.kv_source is not None and lc.mode in (Mode.C2A_REUSE, Mode.C1A_REUSE):
        lens = md.compressed_lens[lc.kv_source].long()
        req = md.token_to_req_indices.long()
        topk = torch.full((tokens, config.index.topk), -1, dtype=i32)
        for t in range(md.num_tokens):
            n = int(lens[t])
            k = min(n, config.index.topk)
            pos = torch.randperm(n, generator=g)[:k].sort().values
            phys = ctab[int(req[t])].long()[pos // bs] * bs + pos % bs
            topk[t, :k] = phys.to(i32)
        scratch.publish(lc.index_source, topk_rows=topk)
    if lc.mode is Mode.C1A_REINDEX:
        lens = md.compressed_lens[lc.kv_source]
        width = scratch.candidate_mask[lc.candidate_source].shape[1]
        scores = torch.rand(tokens, width, generator=g)
        scores[torch.arange(width)[None, :] >= lens.long()[:, None]] = float("-inf")
        scratch.publish(lc.candidate_source,
                        candidate_mask=select_candidate_blocks(config, scores, lens))
    x = torch.randn(tokens, config.hidden_size, generator=g).to(torch.bfloat16)
    rope = RopeTables.build(config, max(kv) + per + 1)
    return x, caches, batch, rope


# ---- worker and driver -------------------------------------------------------------------------

def run_one(preset_name: str, mode: Mode, tokens: int, active: int, context: int, tp: int,
            wiring: str, phase: str = "decode", requests: int | None = None) -> dict:
    config = preset(preset_name)
    layer = config.representative_layer(mode)
    t0 = time.perf_counter()
    weights = random_mode_weights(config, layer)
    x, caches, batch, rope = build_fixture(config, layer, tokens, active, context,
                                           phase=phase, requests=requests)
    setup = time.perf_counter() - t0
    gc.collect()
    rss0 = _status_kib("VmRSS")
    maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    reset = rss0 is not None and _reset_hwm()
    t1, c1 = time.perf_counter(), time.process_time()
    out, caches, aux = attention_half_layer(config, layer, x, weights, caches, batch, rope,
                                            tp=tp, wiring=wiring)
    seconds, cpu = time.perf_counter() - t1, time.process_time() - c1
    maxrss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hwm = _status_kib("VmHWM") if reset else None
    if hwm is not None:
        delta_kib, method = hwm - rss0, "VmHWM after clear_refs - VmRSS"
    else:
        delta_kib, method = max(0, maxrss1 - maxrss0), "ru_maxrss delta (lower bound)"
    full = out if wiring == "replicated" else torch.cat(out)[:tokens]
    return dict(mode=mode.value, layer=layer, preset=config.name, phase=phase, tokens=tokens,
                active=active,
                requests=batch.metadata.num_requests, context=context, tp=tp, wiring=wiring,
                threads=torch.get_num_threads(), seconds=round(seconds, 3),
                cpu_seconds=round(cpu, 3),
                setup_seconds=round(setup, 3), peak_delta_gib=round(delta_kib / 2**20, 3),
                process_peak_gib=round(maxrss1 / 2**20, 3), memory_method=method,
                finite=bool(torch.isfinite(full.float()).all()),
                padding_zero=bool((full[active:] == 0).all()),
                topk_valid=None if aux.topk_rows is None else int((aux.topk_rows >= 0).sum()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m goldens.bench", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="flash", choices=["flash", "tiny"])
    p.add_argument("--modes", default=",".join(m.value for m in Mode),
                   help="comma list of modes (default: all six)")
    p.add_argument("--tokens", type=int, default=192, help="token rows T (default 192)")
    p.add_argument("--active", type=int, default=None, help="active rows (default T)")
    p.add_argument("--context", type=int, default=None,
                   help="mean cached tokens per request (default flash 4096, tiny 200)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--phase", default="decode", choices=["decode", "prefill"])
    p.add_argument("--requests", type=int, default=None,
                   help="prefill: packed prompts (default one per 2048 rows)")
    p.add_argument("--wiring", default="replicated", choices=["replicated", "sharded"])
    p.add_argument("--json", action="store_true", help="print the results as one JSON line last")
    p.add_argument("--in-process", action="store_true",
                   help="run the modes in this process (peaks then overlap)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    active = a.tokens if a.active is None else a.active
    context = _DEFAULT_CONTEXT[a.preset] if a.context is None else a.context
    if a.phase == "prefill" and a.context is None:
        context = 0
    modes = [Mode(m.strip()) for m in a.modes.split(",") if m.strip()]
    if a.worker:
        print(json.dumps(run_one(a.preset, Mode(a.worker), a.tokens, active, context, a.tp,
                                 a.wiring, a.phase, a.requests)))
        return 0
    results = []
    for mode in modes:
        if a.in_process:
            results.append(run_one(a.preset, mode, a.tokens, active, context, a.tp, a.wiring,
                                   a.phase, a.requests))
            continue
        cmd = [sys.executable, "-m", "goldens.bench", "--worker", mode.value, "--preset",
               a.preset, "--tokens", str(a.tokens), "--active", str(active), "--context",
               str(context), "--tp", str(a.tp), "--wiring", a.wiring, "--phase", a.phase]
        cmd += ["--requests", str(a.requests)] if a.requests else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            print(f"{mode.value}: worker failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    head = f"{'mode':<12} {'layer':>5} {'T':>4} {'tp':>2} {'wall s':>8} {'cpu s':>8} " \
           f"{'peak GiB':>9} {'proc GiB':>9}"
    if results:
        r0 = results[0]
        print(f"preset {r0['preset']} {r0['phase']}, T={r0['tokens']} (active {r0['active']}, "
              f"{r0['requests']} requests), context ~{r0['context']}, tp {r0['tp']} "
              f"{r0['wiring']}, {r0['threads']} threads; peak = {r0['memory_method']}")
    print(head)
    for r in results:
        print(f"{r['mode']:<12} {r['layer']:>5} {r['tokens']:>4} {r['tp']:>2} "
              f"{r['seconds']:>8.3f} {r['cpu_seconds']:>8.3f} {r['peak_delta_gib']:>9.3f} {r['process_peak_gib']:>9.3f}")
    if a.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
