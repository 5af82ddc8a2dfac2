"""Top-K membership with the golden's tie rule, and ascending compaction (trace-time helpers).

``pypto.topk`` documents no tie order, so it is only asked for VALUES (which are the same
whatever order ties come in) and for the top of keys that are unique by construction:

* :func:`select` marks the ``k`` best entries of a score row, equal scores going to the
  LOWER position (the golden's stable descending sort): ``v`` = the ``k``-th largest score;
  every score ``> v`` is kept; of the scores ``== v`` the ``k - #(> v)`` lowest positions
  are kept, found as the top of the unique keys ``n - pos`` over the tied entries.
  Entries at or below ``FLOOR`` (masked, -inf) are never kept.
* :func:`ascending` lists the marked positions in ascending order, -1 padded: the top of
  the unique keys ``n - pos`` over the marked entries, read back as ``n - key``.

(``pypto.sub`` with a scalar first is a parser TypeError: ``n - x`` is written
``x * -1 + n``.)  Every value here is an FP32 integer below 2^24 or a score; all comparisons are exact.
"""

MASKED = -1.0e38  # score of an excluded position (stands for -inf)
FLOOR = -1.0e37  # scores at or below this are never selected


def _col(pypto, t, n):
    return pypto.expand_clone(t, [1, n])


def select(pypto, s, rev, iota, n, k):
    """FP32 0/1 ``[1, n]``: the ``k`` (<= n) best entries of the FP32 score row ``s [1, n]``,
    ties to the lower position; ``rev [1, n]`` is ``n - pos`` and ``iota [1, k]`` is
    ``0 .. k-1`` (FP32); vector tile shapes ``(1, n)`` must be set.  ``higher ties``
    variants pass ``rev = pos + 1`` instead."""
    vals, _ = pypto.topk(s, k, -1, True)
    vk = _col(pypto, pypto.amin(vals, -1, keepdim=True), n)
    greater = pypto.where(pypto.gt(s, vk), 1.0, 0.0)
    need = pypto.add(pypto.mul(pypto.sum(greater, -1, keepdim=True), -1.0), float(k))  # >= 1
    tied = pypto.eq(s, vk)
    key = pypto.where(tied, rev, -1.0)
    tvals, _ = pypto.topk(key, k, -1, True)  # tied keys, descending
    hit = pypto.eq(pypto.add(iota, 1.0), pypto.expand_clone(need, [1, k]))
    cut = _col(pypto, pypto.sum(pypto.where(hit, tvals, 0.0), -1, keepdim=True), n)
    keep_tied = pypto.where(tied, pypto.where(pypto.ge(rev, cut), 1.0, 0.0), 0.0)
    chosen = pypto.maximum(greater, keep_tied)
    return pypto.where(pypto.gt(s, FLOOR), chosen, 0.0)


def ascending(pypto, chosen, rev, n, k):
    """``(pos, valid)`` FP32 ``[1, k]``: the positions marked in ``chosen [1, n]`` (at most
    ``k``) in ascending order, then padding (``valid`` 0/1, ``pos`` 0 where invalid)."""
    key = pypto.where(pypto.gt(chosen, 0.5), rev, -1.0)
    vals, _ = pypto.topk(key, k, -1, True)
    valid = pypto.where(pypto.gt(vals, 0.0), 1.0, 0.0)
    pos = pypto.mul(pypto.add(pypto.mul(vals, -1.0), float(n)), valid)
    return pos, valid
