"""One subgraph for a chain of tile operations (trace-time helper).

Left to itself, pypto 0.2.0's graph partitioner may cut a long elementwise chain (a
weight decode: ~10-40 vector steps per tile) into many small subgraphs, and every cut
sends the intermediate tile to global memory and back: on the A5 cost model those copies
were most of the FP4 and MXFP8 weight decodes' time.  ``pass option sg_set_scope`` marks
operations with a scope id; adjacent operations of one id are forced into one subgraph
that is not merged with others.

:func:`one_subgraph` is re-entrant: a ``with one_subgraph(pypto)`` opened inside another
(a shared decoder's own scope, called from a caller's tile scope) does nothing, so its
operations join the outer scope (one task) and the outer scope stays open after it.
"""

import contextlib
import itertools
import threading

_ids = itertools.count(1000)  # distinct ids: two adjacent scopes must not merge
_open = threading.local()  # per tracing thread: how many one_subgraph scopes are open


@contextlib.contextmanager
def one_subgraph(pypto):
    """Every operation traced inside the ``with`` block goes to one subgraph (nested: the
    outermost open scope's)."""
    depth = getattr(_open, "depth", 0)
    if depth == 0:
        pypto.set_pass_options(sg_set_scope=next(_ids))
    _open.depth = depth + 1
    try:
        yield
    finally:
        _open.depth = depth
        if depth == 0:
            pypto.set_pass_options(sg_set_scope=-1)
