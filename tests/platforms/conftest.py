"""Shared a5sim fixtures of the platform tests: one platform per test module (at the default
verify level, numerics only, and at ``lowered``), skipped with the platform's own reason
where it cannot run.  Tests that assert no estimate take ``numerics`` or ``lowered``, which
skip the cost model (it doubles a launch's time)."""

import pytest

from harness.platforms import get_platform


def _platform(**options):
    platform = get_platform("a5sim", **options)
    ok, why = platform.available()
    if not ok:
        pytest.skip(why)
    return platform


@pytest.fixture(scope="module")
def a5sim():
    platform = _platform()
    yield platform
    platform.close()


@pytest.fixture(scope="module")
def numerics():
    """An a5sim platform without the cost model: outputs only, no estimate."""
    platform = _platform(cost_model=False)
    yield platform
    platform.close()


@pytest.fixture(scope="module")
def lowered():
    """An a5sim platform that verifies every interpretable lowering pass (no cost model)."""
    platform = _platform(verify="lowered", cost_model=False)
    yield platform
    platform.close()
