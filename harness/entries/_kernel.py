"""Shared system-under-test glue: run one v41 kernel module on a platform, rank by rank."""

from __future__ import annotations

import torch

from harness.registry import SutOutput


def active_count(num_tokens: torch.Tensor, tokens: int, name: str = "num_tokens") -> int:
    """The runtime active-row count of a kernel launch: ``num_tokens`` (the ABI field
    ``name``) must be INT32 ``[1]`` in ``[0, tokens]``.  Returns it; raises ValueError naming
    the field and the bound."""
    if num_tokens.dtype != torch.int32 or num_tokens.numel() != 1:
        raise ValueError(f"{name}: must be INT32 [1], got {num_tokens.dtype} "
                         f"{tuple(num_tokens.shape)}")
    n = int(num_tokens.reshape(-1)[0])
    if not 0 <= n <= tokens:
        raise ValueError(f"{name}: {n} outside [0, T={tokens}]")
    return n


def launch_step(platform, tokens: int, chunk: int) -> int:
    """Tokens per launch of a row-independent kernel: ``chunk`` on a5sim's interpreter (its
    memory), all ``tokens`` on an estimate-only platform (it interprets nothing: one
    launch, as a card runs it) and on any other platform."""
    interpreted = (getattr(platform, "name", "a5sim") == "a5sim"
                   and not getattr(platform, "estimate_only", False))
    return chunk if interpreted else max(tokens, 1)


def sequential_cost(records: list[dict]) -> dict:
    """One rank's cost record for launches run one after another (host-chunked work):
    estimated times, cycles, tasks and compile seconds add, ``launches`` counts them; None
    if any launch lacks one.
    Records that name their ``module`` also give ``by_module``: the estimated time per
    module, summed, in order of first launch."""
    total = dict(records[0], launches=len(records))
    total.pop("module", None)
    for key in ("aicore_e2e_us", "total_cycles"):
        values = [r.get(key) for r in records]
        total[key] = None if None in values else sum(values)
    for key in ("tasks", "compile_s", "compile_cpu_s"):  # measured ones only: absent unless every launch has it
        values = [r.get(key) for r in records]
        total.pop(key, None)
        if None not in values:
            total[key] = sum(values)
    if total["aicore_e2e_us"] is not None and any("module" in r for r in records):
        parts: dict = {}
        for r in records:
            name = r.get("module", "?")
            parts[name] = parts.get(name, 0) + r["aicore_e2e_us"]
        total["by_module"] = parts
    return total


def single_launch(module: str, *, validate=None, **options):
    """A SUT function that compiles ``module`` for (config, case) and launches it once
    (rank 0) on the platform, feeding the case inputs by ABI name.  ``validate(inputs)``,
    if given, runs on the host first and raises ValueError naming the field and bound, so
    bad input never reaches the kernel."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        if validate is not None:
            validate(inputs)
        program = platform.compile(KernelSpec(module, options), config, case)
        result = platform.launch(program, 0, {a.name: inputs[a.name] for a in program.args})
        result.raise_for_error()
        record = result.cost_record()
        return SutOutput(dict(result.outputs), [record] if record else [])
    return run


def run_with(platform, case, sut):
    """(verdicts, outputs, golden) of ``case``'s entry comparison with ``sut`` (for example a
    deliberately wrong kernel variant) in place of the registered kernel."""
    from harness import registry
    from harness.fixtures import clone_tensors
    entry = registry.get(case.entry)
    cfg = case.config
    inputs = entry.build_inputs(cfg, case)
    produced = sut(platform, cfg, case, clone_tensors(inputs))
    gold = entry.golden(cfg, case, clone_tensors(inputs))
    return entry.compare(cfg, case, inputs, gold, produced.outputs), produced.outputs, gold
