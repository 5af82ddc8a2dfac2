"""``prefill_attn_<mode>``: the six prefill attention leaves on v41 kernels (replicated
output, as the contract keeps the standalone prefill leaves).

Same building blocks, fixture, golden and comparison as the decode leaves
(:mod:`harness.entries.attention`): one TP rank's half-layer is
:func:`harness.entries.attention_kernels.rank_partial` over the group's active rows, here
with prefill batches (requests of 4-8 new tokens over a cached prefix, chunks longer than
the ratio-2 state ring, causal rows inside each chunk from the page tables), the TP sum on
the host's FP32 all-reduce.  The sequence-parallel compositions around them are
``prefill_<mode>`` (:mod:`harness.entries.decode_compose`).

Default matrix (cost of a TINY prefill case on a5sim: 40-200 s): the (2,2) split with two
epochs (DP groups independent, TP replicas compared, cache publication repeated); TP1 with
reserved capacity runs in ``tests/platforms/test_a5sim_prefill_attn.py`` (SWA, C1A
Reindex); TP1, the TP4 reserved-capacity batch and a TP4 long prefix under ``slow``.
"""

from __future__ import annotations

from harness.case import Case, Support
from harness.entries import attention as modes
from harness.entries import attention_fixture as fixture
from harness.entries import attention_kernels as kernels
from harness.entries import attention_paths as paths
from harness.registry import Entry, register


def _matrix(name: str) -> tuple[tuple[Case, ...], tuple[Case, ...]]:
    base = Case(entry=name, tokens=24, requests=3)
    cases = (base.with_(tp=2, dp=2, tokens=16, kind="sink", epochs=2),)
    slow = (base.with_(kind="mixed"),
            base.with_(tp=4, tokens=33, active_tokens=31, requests=6, kind="masked"),
            base.with_(tp=4, kind="long"),
            base.with_(tokens=12, requests=2, kind="zero"))
    return cases, slow


def _make(spec: modes.ModeSpec) -> Entry:
    name = f"prefill_attn_{spec.mode.value}"
    support = Support(phase="prefill", tp_sizes=(1, 2, 4, 8), dp_sizes=(1, 2), wirings=("replicated",),
                      kinds=modes.KINDS, inactive_rows=True)
    matrix, slow = _matrix(name)

    def layer(config):
        return config.representative_layer(spec.mode)

    def build_inputs(config, case):
        with paths.small_shape_threads(config):
            return fixture.build_inputs(config, case, layer(config))

    def golden(config, case, inputs):
        with paths.small_shape_threads(config):
            return paths.golden(config, case, inputs, layer(config))

    def compare_case(config, case, inputs, gold, actual):
        with paths.small_shape_threads(config):
            return modes.compare(spec, config, case, inputs, gold, actual)

    def kernel_path(platform, config, case, inputs):
        with paths.small_shape_threads(config):
            return kernels.kernel_sut(layer(config))(platform, config, case, inputs)

    return register(Entry(
        name=name,
        description=f"prefill {spec.mode.value} attention leaf at the preset's representative layer "
                    f"(v41 building-block kernels per rank, FP32 all-reduce on the host): output, "
                    f"Top-K rows and every cache tensor by ownership, DP groups independent",
        support=support, matrix=matrix, slow_cases=slow,
        build_inputs=build_inputs, golden=golden, compare=compare_case,
        kernels={"a5sim": kernel_path, "a5": kernel_path},
        work=lambda config, case, inputs: kernels.leaf_work(layer(config))(config, case, inputs),
    ))


ENTRIES = {e.name: e for e in (_make(s) for s in modes.MODES)}
