# ci: a5
"""paged_indexer kernel vs golden on the selected platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("paged_indexer"))
def test_paged_indexer(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
