"""a5: each rank launches on the card the queue allocated to this process."""

import pytest

from harness.platforms import PlatformError
from harness.platforms.a5 import A5Platform
from harness.runner import load_platform


def test_rank_runs_on_its_allocated_card():
    p = A5Platform(devices=(3, 5))
    assert [p.device_of(r) for r in (0, 1)] == [3, 5]
    with pytest.raises(PlatformError, match="rank: 2 has no allocated card"):
        p.device_of(2)
    assert A5Platform().device_of(1) == 1


def test_runner_hands_the_devices_to_the_card_platform():
    assert load_platform("a5", (6, 7)).devices == (6, 7)
    assert load_platform("a5sim", (6, 7)).name == "a5sim"
