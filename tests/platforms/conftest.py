"""Shared a5sim fixture of the platform tests: one platform per test module, skipped with
the platform's own reason where it cannot run."""

import pytest

from harness.platforms import get_platform


@pytest.fixture(scope="module")
def a5sim():
    platform = get_platform("a5sim")
    ok, why = platform.available()
    if not ok:
        pytest.skip(why)
    yield platform
    platform.close()
