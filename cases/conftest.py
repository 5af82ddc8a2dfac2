"""The kernel cases of one test module share one a5sim platform (one launch worker)."""

import pytest

from harness.pytest_cases import shared_platform


@pytest.fixture(scope="module", autouse=True)
def _one_platform_per_module(run_options):
    with shared_platform(run_options):
        yield
