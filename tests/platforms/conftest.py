"""Shared a5sim fixtures of the platform tests: one platform per test module (at the default
verify level, and at ``lowered``), skipped with the platform's own reason where it cannot
run."""

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
def lowered():
    """An a5sim platform that verifies every interpretable lowering pass."""
    platform = _platform(verify="lowered")
    yield platform
    platform.close()
