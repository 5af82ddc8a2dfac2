"""``v41.subgraph.one_subgraph`` is re-entrant: a nested scope (a shared decoder's own
``with one_subgraph``, called inside a caller's tile scope) keeps the outer scope id and does
not close it; only the outermost exit resets the pass option."""

import pytest

from v41.subgraph import one_subgraph


class _Recorder:
    def __init__(self):
        self.calls = []

    def set_pass_options(self, **options):
        self.calls.append(options["sg_set_scope"])


def test_nested_scope_is_the_outer_one_and_stays_open():
    p = _Recorder()
    with one_subgraph(p):
        outer = p.calls[-1]
        with one_subgraph(p):
            with one_subgraph(p):
                assert p.calls == [outer]
        assert p.calls == [outer]  # the inner exits did not reset the scope
    assert p.calls == [outer, -1]
    assert outer >= 0


def test_sibling_scopes_get_distinct_ids_and_an_error_resets():
    p = _Recorder()
    with one_subgraph(p):
        pass
    with pytest.raises(RuntimeError):
        with one_subgraph(p):
            with one_subgraph(p):
                raise RuntimeError("trace failed")
    with one_subgraph(p):
        pass
    first, _, second, _, third, _ = p.calls
    assert p.calls[1::2] == [-1, -1, -1]
    assert len({first, second, third}) == 3
