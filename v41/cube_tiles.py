"""Cube tile shapes sized to the A5's cube buffers (no pypto import).

``pypto.set_cube_tile_shapes(m, k, n)`` takes ``[L0, L1]`` sizes per axis.  A product with
``m0 = 16`` rows re-reads the whole right operand once per 16 rows, so at FLASH decode
sizes (192 rows) the cost model charged every weight tile twelve times (``lm_head`` TP4
rank: 10.7 ms with ``[16, 16]`` rows, 1.8 ms with all 192).  :func:`cube_tiles` takes as
many rows as the kernel's row tile has and the largest ``k`` that still fits:

* L0A ``m0 * k0``, L0B ``k0 * n0`` elements of the operand width within 64 KiB each;
* L0C ``m0 * n0`` FP32 within 256 KiB;
* L1 ``(m1 + n1) * k1`` within 512 KiB (pypto's compile pass refuses more).

Sizes are the Ascend 950 platform file's (``l0_a_size``, ``l0_b_size``, ``l0_c_size``,
``l1_size``).
"""

from __future__ import annotations

L0A_BYTES = 64 << 10
L0B_BYTES = 64 << 10
L0C_BYTES = 256 << 10
L1_BYTES = 512 << 10
ALIGN = 16  # cube fractal rows / columns


def _round_up(v: int, a: int) -> int:
    return -(-v // a) * a


def _pow2_floor(v: int) -> int:
    return 1 << (max(v, 1).bit_length() - 1)


def row_tile(tokens: int, most: int, forced: int | None = None) -> int:
    """A kernel's row tile for a launch of ``tokens`` rows: ``tokens`` rounded up to 16, at
    most ``most``; ``forced`` (a multiple of 16, tests use it to run several row tiles in
    one small launch) instead when given.  A trace-time constant: any row count stays
    correct, the tile only sets how many rows one product takes."""
    if forced is not None:
        if forced < ALIGN or forced % ALIGN:
            raise ValueError(f"row_tile: {forced} must be a positive multiple of {ALIGN}")
        return forced
    if tokens < 1 or most < ALIGN or most % ALIGN:
        raise ValueError(f"tokens, most: {tokens}, {most} (need tokens >= 1, most a multiple "
                         f"of {ALIGN})")
    return min(most, _round_up(tokens, ALIGN))


def cube_tiles(m: int, k: int, n: int, operand_bytes: int) -> tuple[list, list, list]:
    """``(m, k, n)`` lists for ``set_cube_tile_shapes`` of a ``[m, k] @ [k, n]`` product
    with operands of ``operand_bytes`` each: ``m0 = m1`` the row tile (rounded up to 16),
    ``n0 = n1`` the column tile (rounded up to 16), ``k0`` / ``k1`` the largest powers of
    two (``k0 >= 16``, ``k1`` a multiple of ``k0``, neither above ``k`` rounded up to 16)
    inside the buffer limits above.  ValueError when even ``k0 = 16`` does not fit."""
    for name, v in (("m", m), ("k", k), ("n", n), ("operand_bytes", operand_bytes)):
        if v < 1:
            raise ValueError(f"{name}: {v} must be >= 1")
    mt, nt, kt = _round_up(m, ALIGN), _round_up(n, ALIGN), _round_up(k, ALIGN)
    if mt * nt * 4 > L0C_BYTES:
        raise ValueError(f"m x n: {mt} x {nt} FP32 exceeds L0C ({L0C_BYTES} bytes)")
    k0 = _pow2_floor(min(L0A_BYTES // (mt * operand_bytes), L0B_BYTES // (nt * operand_bytes),
                         kt))
    if k0 < ALIGN:
        raise ValueError(f"m, n: {mt}, {nt} leave k0 < {ALIGN} in L0A/L0B")
    k1 = _pow2_floor(min(L1_BYTES // ((mt + nt) * operand_bytes), kt))
    if k1 < k0:
        raise ValueError(f"m + n: {mt + nt} rows of k0 = {k0} exceed L1 ({L1_BYTES} bytes)")
    return [mt, mt], [k0, k1], [nt, nt]
