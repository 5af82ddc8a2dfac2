"""Helpers for the thin pytest files in ``cases/``: parametrize an entry's matrix and run
one case as a test.

Node ids are the case ids (they name every axis); the axes tp, dp, ep, wiring and preset
are separate parameters so ``--tp 4`` selection and the queue runner's card count read
them.  FLASH-shape cases carry the ``slow`` marker; matrix cases outside an entry's
``representative`` ones carry ``matrix`` (:mod:`harness.pytest_plugin` says when they
run); cases whose system under test on a5sim
is a second path through the goldens (no kernel) carry ``golden_alt``, so
``-m "not golden_alt"`` runs kernels only.

Inside :func:`shared_platform` (``cases/conftest.py``: one per test module) the a5sim kernel
cases run on one platform object, so its launch worker (pypto imported, calculator loaded)
is started once per module instead of once per case; the worker is still replaced after
``V41_WORKER_JOBS`` launches and after any failed launch.
"""

from __future__ import annotations

import contextlib

import pytest

from harness import registry
from harness.case import Case
from harness.pytest_plugin import RunOptions
from harness.runner import load_platform, run_case, sut_kind

ARGNAMES = "case,tp,dp,ep,wiring,preset"


def entry_params(name: str) -> list:
    """pytest params of entry ``name``'s matrix (the cases outside its ``representative``
    ones marked ``matrix``) plus its slow cases (marked ``slow``), all marked
    ``golden_alt`` when the a5sim SUT is the golden-alt path."""
    entry = registry.get(name)
    alt = [pytest.mark.golden_alt] if sut_kind(entry.sut_for("a5sim")[0]) == "golden-alt" else []
    tier = entry.representative

    def marks(c):
        return alt if tier is None or c in tier else [pytest.mark.matrix, *alt]
    params = [pytest.param(c, c.tp, c.dp, c.ep, c.wiring, c.preset, id=c.case_id, marks=marks(c))
              for c in entry.matrix]
    params += [pytest.param(c, c.tp, c.dp, c.ep, c.wiring, c.preset, id=c.case_id,
                            marks=[pytest.mark.slow, *alt]) for c in entry.slow_cases]
    return params


_SHARED: dict[str, object] = {}  # platform name -> the platform shared_platform opened


@contextlib.contextmanager
def shared_platform(options: RunOptions):
    """While active, :func:`check_case` runs the kernel cases of ``options.platform`` on one
    platform object (a5sim only: a card platform is per case, with the case's devices),
    running the cost model only when ``options.cost_model``; the platform is closed on
    exit."""
    if options.platform != "a5sim" or options.platform in _SHARED:
        yield
        return
    platform = _SHARED[options.platform] = load_platform(options.platform,
                                                         cost_model=options.cost_model)
    try:
        yield
    finally:
        del _SHARED[options.platform]
        platform.close()


def check_case(case: Case, options: RunOptions) -> None:
    """Run ``case`` on the selected platform (the :func:`shared_platform` one for a kernel
    case when there is one); skip with the platform's reason, fail with every failing
    verdict line."""
    case = case.with_(platform=options.platform)
    kernel = registry.get(case.entry).sut_for(case.platform)[0].startswith("kernel:")
    platform = _SHARED.get(case.platform) if kernel else None
    cards = None
    if options.platform == "a5":
        if options.devices is None:
            pytest.fail("--device: the a5 platform needs the allocated card ids")
        if len(options.devices) != case.cards:
            pytest.fail(f"--device: {len(options.devices)} cards given, case needs {case.cards}")
        cards = len(options.devices)
    result = run_case(case, save_root=options.save_data, cards_available=cards,
                      platform=platform, devices=options.devices)
    if result.status == "skip":
        pytest.skip(result.reason)
    if result.status != "pass":
        pytest.fail(result.failure_text(), pytrace=False)
