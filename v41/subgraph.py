"""One subgraph for a chain of tile operations (trace-time helper).

Left to itself, pypto 0.2.0's graph partitioner may cut a long elementwise chain (a
weight decode: ~10-40 vector steps per tile) into many small subgraphs, and every cut
sends the intermediate tile to global memory and back: on the A5 cost model those copies
were most of the FP4 and MXFP8 weight decodes' time.  ``pass option sg_set_scope`` marks
operations with a scope id; adjacent operations of one id are forced into one subgraph
that is not merged with others.
"""

import contextlib
import itertools

_ids = itertools.count(1000)  # distinct ids: two adjacent scopes must not merge


@contextlib.contextmanager
def one_subgraph(pypto):
    """Every operation traced inside the ``with`` block goes to one subgraph."""
    pypto.set_pass_options(sg_set_scope=next(_ids))
    try:
        yield
    finally:
        pypto.set_pass_options(sg_set_scope=-1)
