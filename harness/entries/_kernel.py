"""Shared system-under-test glue: run one v41 kernel module on a platform, rank by rank."""

from __future__ import annotations

from harness.registry import SutOutput


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
