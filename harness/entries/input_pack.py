"""``input_pack``: v41.input_pack (embedding rows gathered in the kernel, replicated over the
mHC lanes) against ``goldens.boundary.embed``.

The golden sees the ids with every row at or past ``num_tokens`` replaced by -1 (its padding
id), so its inactive rows are zeros.  Active rows must equal the golden byte for byte (an
exact BF16 -> FP32 upcast; the table holds a ``-0.0`` that must keep its sign); rows at or
past ``num_tokens`` must be exact zeros (``check_zero_rows``).  Kind ``mixed`` puts -1 ids
(zero rows) among the active rows; the inactive rows hold in-range ids, so a kernel that
embeds them fails the zero-row check instead of aborting the gather.

Host validation (:func:`validate_launch`, before the launch): ``token_ids`` INT32 ``[T]``,
``num_tokens`` INT32 ``[1]`` in ``[0, T]``, ``embed`` BF16 ``[vocab, hidden]`` and every
ACTIVE id in ``[-1, vocab)`` (-1 = padding row, as the golden allows); inactive ids are
never read and not checked.
"""

from __future__ import annotations

import torch

from goldens.boundary import embed
from harness.case import Case, Support
from harness.compare import check_non_owned_bytes, check_zero_rows
from harness.entries._kernel import active_count, single_launch
from harness.fixtures import generator, randn, sentinel
from harness.platforms.topology import VECTOR_FP32
from harness.registry import Entry, Work, register

MODULE = "v41.input_pack"
SUPPORT = Support(phase="prefill", kinds=("mixed",), inactive_rows=True)
PAD_EVERY = 5  # kind mixed: every 5th active id is -1


def build_inputs(config, case):
    t, v, d = case.tokens, config.vocab_size, config.hidden_size
    ids = torch.randint(0, v, (t,), generator=generator(case.seed, "token_ids"),
                        dtype=torch.int64).to(torch.int32)
    ids[2:case.active:PAD_EVERY] = -1
    table = randn((v, d), case.seed, "embed", scale=0.02).to(torch.bfloat16)
    table[int(ids.clamp_min(0)[0]), 0] = -0.0  # a signed zero must survive the upcast
    return {"token_ids": ids, "num_tokens": torch.tensor([case.active], dtype=torch.int32),
            "embed": table, "x_hc": sentinel((t, config.hc.hc_mult, d), torch.float32)}


def validate_launch(config, inputs) -> int:
    """Host check before launch: shapes and dtypes, ``num_tokens`` in ``[0, T]`` and the
    active ids in ``[-1, vocab)``.  Returns the active count; raises ValueError naming the
    field and the bound."""
    ids, table = inputs["token_ids"], inputs["embed"]
    v, d = config.vocab_size, config.hidden_size
    if ids.dtype != torch.int32 or ids.dim() != 1 or ids.numel() < 1:
        raise ValueError(f"token_ids: must be INT32 [T >= 1], got {ids.dtype} "
                         f"{tuple(ids.shape)}")
    if table.dtype != torch.bfloat16 or tuple(table.shape) != (v, d):
        raise ValueError(f"embed: must be bfloat16 [{v}, {d}], got {table.dtype} "
                         f"{tuple(table.shape)}")
    n = active_count(inputs["num_tokens"], ids.numel())
    if n:
        lo, hi = int(ids[:n].min()), int(ids[:n].max())
        if lo < -1 or hi >= v:
            bad = lo if lo < -1 else hi
            raise ValueError(f"token_ids: active id {bad} outside [-1, vocab={v}) "
                             f"(-1 = padding row)")
    return n


def kernel_sut(**options):
    """The a5sim/a5 system under test: validate on the host, then one launch (``options``
    go to the kernel builder, e.g. ``variant``)."""
    def run(platform, config, case, inputs):
        validate_launch(config, inputs)
        return single_launch(MODULE, **options)(platform, config, case, inputs)
    return run


def work(config, case, inputs):
    """Ids read, one BF16 table row gathered per active token, every lane written in FP32;
    one cast and one select per gathered element."""
    n, d = case.active, config.hidden_size
    moved = inputs["token_ids"].numel() * 4 + n * d * 2 + inputs["x_hc"].numel() * 4
    return Work(moved, {VECTOR_FP32: 2 * n * d})


def golden(config, case, inputs):
    n = int(inputs["num_tokens"][0])
    ids = inputs["token_ids"].clone()
    ids[n:] = -1
    return {"x_hc": embed(ids, inputs["embed"], config)}


def compare(config, case, inputs, gold, actual):
    n, t = int(inputs["num_tokens"][0]), inputs["token_ids"].numel()
    verdicts = []
    if n:  # active rows: the golden's bytes exactly
        verdicts += check_non_owned_bytes("x_hc", actual["x_hc"][:n], gold["x_hc"][:n])
    padding = (torch.arange(t) >= n)[:, None].expand(t, config.hc.hc_mult)  # (token, lane)
    return verdicts + check_zero_rows("x_hc", actual["x_hc"], rows=padding)


ENTRY = register(Entry(
    name="input_pack",
    description="embedding rows gathered for the token ids in-kernel, exact FP32, replicated "
                "over the mHC lanes; -1 ids and rows past num_tokens exact zeros",
    support=SUPPORT,
    matrix=(Case(entry="input_pack", tokens=21), Case(entry="input_pack", tokens=50,
                                                      active_tokens=21),
            Case(entry="input_pack", tokens=8, active_tokens=0)),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut()},
    work=work,
))
