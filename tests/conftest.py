"""Unit-test wiring: one torch intra-op thread for fast tests.

Their tensors are tiny, so extra threads only add scheduling cost (up to 40x on a loaded
2-core runner with two xdist workers); ``slow`` FLASH-shape tests keep the default.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread_for_fast_tests(request):
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
