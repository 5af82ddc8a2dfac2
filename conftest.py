"""Root pytest wiring: the harness options (--tp --dp --ep --platform --device --preset
--wiring --save-data) and the queue runner's node collection (--collect-nodes).

Under pytest-xdist (``-n N``) the run is scheduled for wall time.  Each worker's collection
lists the kernel-launching tests first, heaviest first (whole modules kept together, so a
module-scoped platform starts once per worker), and unless the run names its own
``--dist`` or ``--maxschedchunk`` the load scheduler hands out one test at a time
(``--maxschedchunk 1``): an idle worker always takes the next test of that list, so neither
worker is left holding a queue of kernel cases while the other idles.  Every worker still
runs its tests in collection order, the lowered-verification module first (its cases are
the longest).  The a5sim launch memo keeps one memo per verify level
(``attention_kernels.launch_memo``), so order never decides what a launch was verified at.
Without xdist the order is pytest's.
"""

import os
import shlex

import pytest

pytest_plugins = ["harness.pytest_plugin", "ci.collect"]

# Modules that launch the most kernels, in this order (measured on the 2-core runner).  Within them, cases/ kernel
# cases go by their launch count (see _case_weight).
HEAVY_MODULES = (
    "tests/platforms/test_a5sim_lowered.py",
    "cases/test_attention_modes.py",
    "tests/platforms/test_a5sim_decode_attn.py",
    "cases/test_prefill_attn.py",
    "tests/platforms/test_a5sim_routed_experts.py",
    "tests/platforms/test_a5sim_prefill_chunking.py",
    "tests/platforms/test_a5sim_moe.py",
)


def _named(config: pytest.Config, *flags: str) -> bool:
    """Whether the run gives one of ``flags`` itself (command line, PYTEST_ADDOPTS, ini)."""
    args = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
            *config.getini("addopts")]
    return any(a in flags or a.split("=", 1)[0] in flags for a in args)


def pytest_configure(config: pytest.Config) -> None:
    if (getattr(config.option, "dist", "no") == "load" and not hasattr(config, "workerinput")
            and not _named(config, "--dist", "-d", "--distload", "--maxschedchunk")):
        config.option.maxschedchunk = 1


def _case_weight(item: pytest.Item) -> int:
    """Rank-epoch launch sequences of a kernel case parameter (0 for anything else)."""
    case = getattr(getattr(item, "callspec", None), "params", {}).get("case")
    if case is None or item.get_closest_marker("golden_alt") is not None:
        return 0
    return case.tp * case.dp * case.epochs


def _order_key(item: pytest.Item) -> tuple[int, int]:
    path = item.nodeid.split("::", 1)[0]
    if path in HEAVY_MODULES:
        return HEAVY_MODULES.index(path), -_case_weight(item)
    if path.startswith("tests/platforms/test_a5sim_") or path.startswith("cases/"):
        return len(HEAVY_MODULES), 0
    return len(HEAVY_MODULES) + 1, 0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # the xdist workers' collection is the schedule's order
        items.sort(key=_order_key)  # stable: pytest's order within each group
