"""``v41.cube_tiles``: the cube tile shapes stay inside the A5's L0A / L0B / L0C / L1 sizes
(the Ascend 950 platform file's), take every row of the row tile, and refuse shapes that
cannot fit."""

import configparser

import pytest

from harness.platforms.pypto_env import A5_PLATFORM_INI
from v41 import cube_tiles as ct


def test_buffer_sizes_are_the_platform_files():
    ini = configparser.ConfigParser(strict=False)
    ini.read(A5_PLATFORM_INI)
    sizes = {k: int(v) for s in ini.sections() for k, v in ini[s].items()
             if k in ("l0_a_size", "l0_b_size", "l0_c_size", "l1_size")}
    assert sizes == {"l0_a_size": ct.L0A_BYTES, "l0_b_size": ct.L0B_BYTES,
                     "l0_c_size": ct.L0C_BYTES, "l1_size": ct.L1_BYTES}


@pytest.mark.parametrize("m, k, n, b", [(192, 4096, 64, 4), (192, 4096, 128, 4),
                                        (21, 64, 256, 4), (16, 4096, 128, 2),
                                        (192, 2304, 128, 2), (1, 1, 1, 1)])
def test_tiles_fit_the_buffers_and_take_every_row(m, k, n, b):
    (m0, m1), (k0, k1), (n0, n1) = ct.cube_tiles(m, k, n, b)
    assert m0 == m1 >= m and m0 % 16 == 0 and m0 - m < 16
    assert n0 == n1 >= n and n0 % 16 == 0
    assert 16 <= k0 <= k1 and k1 % k0 == 0
    assert m0 * k0 * b <= ct.L0A_BYTES and k0 * n0 * b <= ct.L0B_BYTES
    assert m0 * n0 * 4 <= ct.L0C_BYTES
    assert (m1 + n1) * k1 * b <= ct.L1_BYTES
    # the largest power of two: doubling k1 would overflow L1 or pass k
    assert (m1 + n1) * 2 * k1 * b > ct.L1_BYTES or 2 * k1 > -(-k // 16) * 16


def test_shapes_that_cannot_fit_are_refused():
    with pytest.raises(ValueError, match="exceeds L0C"):
        ct.cube_tiles(512, 64, 256, 4)
    with pytest.raises(ValueError, match="k0 < 16"):
        ct.cube_tiles(2048, 64, 16, 4)
    with pytest.raises(ValueError, match="m: 0 must be >= 1"):
        ct.cube_tiles(0, 64, 16, 4)
