"""Unit-test wiring: one torch intra-op thread, except for ``slow`` FLASH-shape tests.

Fast tests use tiny tensors, where extra threads only add scheduling cost (up to 40x on a
loaded 2-core runner with two xdist workers); module-scoped fixtures (a written TINY
checkpoint, say) run under the same single thread.
"""

import pytest
import torch

DEFAULT_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(DEFAULT_THREADS)


@pytest.fixture(autouse=True)
def _all_threads_for_slow_tests(request):
    if request.node.get_closest_marker("slow") is None:
        yield
        return
    torch.set_num_threads(DEFAULT_THREADS)
    yield
    torch.set_num_threads(1)
