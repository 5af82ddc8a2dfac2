"""``routed_experts``: v41.routed_experts (one EP rank's local MXFP4 experts) on every EP
rank against ``goldens.moe.routed_expert`` per expert on the same rows.

Fixture (deterministic in the seed): BF16 token rows ``x [T, D]``; random router choices,
``k`` DISTINCT experts per token (``indices [T, k]``) with FP32 route weights in [0.25,
1.5); every routed expert's float weights quantized by the golden's
``quantize_routed_expert`` (packed MXFP4, E8M0 per 32 inputs), stacked ``[E, ...]``.  The
W1/W3 scale makes ``|g|``, ``|u|`` exceed the SwiGLU limit on a few percent of the
elements, so the clamps matter.  Kind ``holes`` routes no token to expert 1 nor to the
last rank's experts (single rank: experts 1 and E-1): an expert with no rows and, for
``ep > 1``, a rank with no rows at all.

Host dispatch (:func:`dispatch`, metadata only): rank ``r`` owns experts ``[r*L, (r+1)*L)``,
``L = n_routed / ep`` (``ep`` None: one rank, every expert); its rows are the (token,
slot) pairs choosing one of them, sorted by expert, then token (the golden's gather order);
``expert_offsets`` delimit the experts.  Every rank's buffer has the same capacity
``max rows + PAD_ROWS`` (a fixed receive window): its rows past ``offsets[L]`` are padding,
filled with garbage (x = 13.0, route weight NaN) the kernel must not read, and must come
back exactly zero.  One launch per rank (an empty rank too).  An estimate-only platform
splits a rank whose packed weights pass :data:`ESTIMATE_RANK_BYTES` (a FLASH EP4 rank: the
cost model cannot hold its whole task graph in 24 GiB) into equal chunks of consecutive
experts, one launch per chunk with rows plus one padding launch, and reports their sum
(:func:`estimate_rank_in_chunks`): chunks run one after another there, so the figure leaves
out any overlap between chunks that one launch would have.  A FLASH EP8 rank (48 experts,
903 MB packed) is one launch: 11.7 GB and about 5 min in the cost model here.

Output ``y [ranks, capacity, D]`` BF16: each dispatched row checked with the contract's
per-row bound and for missing writes, each padding row on its own for exact zeros.

Host validation before any launch (:func:`validate_routing`, :func:`validate_launch`):
expert ids in ``[0, E)``, no token choosing an expert twice, finite route weights and x,
no E8M0 NaN scale code, ``expert_offsets`` starting at 0, nondecreasing, ``<= rows``.
"""

from __future__ import annotations

import torch

from goldens.config import local_experts
from goldens.moe import ExpertWeights, quantize_routed_expert, routed_expert
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel, check_zero_rows
from harness.fixtures import SENTINEL, generator, is_broadcast, placeholders_wanted, randn, sentinel
from harness.platforms.topology import CUBE_BF16, VECTOR_FP32
from harness.registry import Entry, SutOutput, Work, register

MODULE = "v41.routed_experts"
SUPPORT = Support(phase="prefill", tp_sizes=(1, 2, 4), dp_sizes=(1, 2),
                  ep_sizes=(None, 2, 4, 8), kinds=("mixed", "holes"))
PAD_ROWS = 3  # padding rows past the fullest rank's dispatched rows
PAD_X = 13.0  # padding x rows: garbage the kernel must not read
WEIGHT_NAMES = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")
GU_STD = 6.0  # std of g and u before the clamps (limit 10: a few percent clamp)
ESTIMATE_RANK_BYTES = 1 << 30  # packed expert bytes one estimate-only launch may take


def ranks(case) -> int:
    return 1 if case.ep is None else case.ep


def excluded_experts(config, case) -> set[int]:
    """Experts no token chooses in kind ``holes`` (empty for ``mixed``)."""
    if case.kind != "holes":
        return set()
    e = config.moe.n_routed_experts
    n_local = local_experts(config, ranks(case)) if ranks(case) > 1 else 1
    return {1} | set(range(e - n_local, e))


def routing(config, case) -> dict:
    """The fixture's token rows and router choices (no expert weights): ``x``, ``indices``
    and ``weights`` as :func:`build_inputs` makes them."""
    m, d, t = config.moe, config.hidden_size, case.tokens
    e, k = m.n_routed_experts, m.num_experts_per_tok
    x = randn((t, d), case.seed, "x").to(torch.bfloat16)
    allowed = torch.tensor(sorted(set(range(e)) - excluded_experts(config, case)))
    g = generator(case.seed, "indices")
    idx = torch.stack([allowed[torch.randperm(len(allowed), generator=g)[:k]] for _ in range(t)])
    w = torch.rand((t, k), generator=generator(case.seed, "weights")) * 1.25 + 0.25
    return {"x": x, "indices": idx.to(torch.int32), "weights": w.to(torch.float32)}


CODE_ZERO = 0  # E2M1 code pair of two zeros
SCALE_ONE = 127  # E8M0 code of 2^0


def placeholder_weights(config) -> dict:
    """Every routed expert's packed weights ``[E, ...]`` (uint8, the fixture's names) as
    broadcast views of one constant expert (codes 0, scales 2^0): no memory per expert.
    For estimate-only runs only (:func:`harness.fixtures.weight_placeholders`)."""
    d, i, e = config.hidden_size, config.moe.intermediate_size, config.moe.n_routed_experts
    shapes = {"w1": (i, d // 2), "w1_scale": (i, d // 32), "w3": (i, d // 2),
              "w3_scale": (i, d // 32), "w2": (d, i // 2), "w2_scale": (d, i // 32)}
    return {n: torch.full((1, *s), SCALE_ONE if n.endswith("_scale") else CODE_ZERO,
                          dtype=torch.uint8).expand(e, *s) for n, s in shapes.items()}


def build_inputs(config, case):
    """The fixture; inside :func:`harness.fixtures.weight_placeholders` the expert weights
    are :func:`placeholder_weights` (estimate-only runs)."""
    m, d = config.moe, config.hidden_size
    e, inter = m.n_routed_experts, m.intermediate_size
    inputs = routing(config, case)
    gu = GU_STD * d ** -0.5
    if placeholders_wanted():
        inputs.update(placeholder_weights(config))
        inputs["y"] = sentinel((ranks(case), capacity(config, case, inputs["indices"]), d),
                               torch.bfloat16)
        return inputs
    experts = [quantize_routed_expert(randn((inter, d), case.seed, f"w1/{j}", scale=gu),
                                      randn((inter, d), case.seed, f"w3/{j}", scale=gu),
                                      randn((d, inter), case.seed, f"w2/{j}", scale=inter ** -0.5))
               for j in range(e)]
    for i, name in enumerate(WEIGHT_NAMES):
        inputs[name] = torch.stack([ew[i] for ew in experts])
    cap = capacity(config, case, inputs["indices"])
    inputs["y"] = sentinel((ranks(case), cap, d), torch.bfloat16)
    return inputs


def dispatch(indices: torch.Tensor, first: int, count: int):
    """``(tokens, slots, offsets)`` of the rank owning experts ``first .. first+count-1``:
    its (token, slot) pairs sorted by expert then token, and INT32 ``offsets [count+1]``."""
    idx = indices.to(torch.int64)
    toks, slots, offsets = [], [], [0]
    for ex in range(first, first + count):
        t, s = torch.nonzero(idx == ex, as_tuple=True)  # tokens ascending
        toks.append(t)
        slots.append(s)
        offsets.append(offsets[-1] + len(t))
    return torch.cat(toks), torch.cat(slots), torch.tensor(offsets, dtype=torch.int32)


def capacity(config, case, indices) -> int:
    """Rows per rank buffer: the fullest rank's dispatched rows plus :data:`PAD_ROWS`."""
    n_local = config.moe.n_routed_experts // ranks(case)
    most = max(int(dispatch(indices, r * n_local, n_local)[2][-1]) for r in range(ranks(case)))
    return most + PAD_ROWS


def validate_routing(config, case, inputs) -> None:
    """Host check before any launch: ``ep`` divides the experts, ids in ``[0, E)``, no
    token choosing one expert twice, finite route weights and x, no E8M0 NaN scale code.
    Raises ValueError naming the field and the bound."""
    e, k = config.moe.n_routed_experts, config.moe.num_experts_per_tok
    local_experts(config, ranks(case))  # ValueError: n_routed_experts % ep == 0
    idx, w, t = inputs["indices"], inputs["weights"], inputs["x"].shape[0]
    if idx.dtype != torch.int32 or tuple(idx.shape) != (t, k):
        raise ValueError(f"indices: must be int32 [{t}, {k}], got {idx.dtype} {list(idx.shape)}")
    if w.dtype != torch.float32 or tuple(w.shape) != (t, k):
        raise ValueError(f"weights: must be float32 [{t}, {k}], got {w.dtype} {list(w.shape)}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= e):
        raise ValueError(f"indices: expert ids must lie in [0, {e}), got "
                         f"[{int(idx.min())}, {int(idx.max())}]")
    srt = idx.sort(dim=-1).values
    dup = (srt[:, 1:] == srt[:, :-1]).any(dim=-1).nonzero()
    if len(dup):
        raise ValueError(f"indices: token {int(dup[0])} selects expert "
                         f"{idx[int(dup[0])].tolist()} twice; top-k experts must be distinct")
    for name in ("weights", "x"):
        if not bool(torch.isfinite(inputs[name]).all()):
            raise ValueError(f"{name}: contains NaN or Inf; values must be finite")
    for name in WEIGHT_NAMES[1::2]:
        if inputs[name].numel() and int(inputs[name].max()) == 255:
            raise ValueError(f"{name}: contains E8M0 code 255 (NaN); codes must be <= 254")


def validate_launch(config, args) -> int:
    """Host check of one rank's launch arguments: ``expert_offsets`` INT32 ``[L+1]``,
    ``offsets[0] = 0``, nondecreasing, ``offsets[L] <= rows``; finite route weights on the
    dispatched rows.  Returns ``offsets[L]``; raises ValueError naming the field."""
    off, rows = args["expert_offsets"], args["x"].shape[0]
    n_local = args["w1"].shape[0]
    if off.dtype != torch.int32 or tuple(off.shape) != (n_local + 1,):
        raise ValueError(f"expert_offsets: must be int32 [{n_local + 1}], got {off.dtype} "
                         f"{list(off.shape)}")
    o = off.tolist()
    if o[0] != 0:
        raise ValueError(f"expert_offsets: expert_offsets[0] = {o[0]}, must be 0")
    for j in range(n_local):
        if o[j + 1] < o[j]:
            raise ValueError(f"expert_offsets: decreases at expert {j}: expert_offsets[{j + 1}]"
                             f" = {o[j + 1]} < expert_offsets[{j}] = {o[j]} (must be "
                             f"nondecreasing)")
    if o[-1] > rows:
        raise ValueError(f"expert_offsets: expert_offsets[{n_local}] = {o[-1]} exceeds rows "
                         f"= {rows}")
    if not bool(torch.isfinite(args["route_weight"][:o[-1]]).all()):
        raise ValueError("route_weight: a dispatched row's weight is NaN or Inf; must be finite")
    return o[-1]


def rank_inputs(config, case, rank: int, inputs) -> dict:
    """Kernel arguments of EP rank ``rank`` (its dispatched rows, padded to the capacity,
    and its experts' packed weights)."""
    n_local = config.moe.n_routed_experts // ranks(case)
    cap = inputs["y"].shape[1]
    toks, slots, off = dispatch(inputs["indices"], rank * n_local, n_local)
    n = len(toks)
    x = torch.full((cap, config.hidden_size), PAD_X, dtype=torch.bfloat16)
    x[:n] = inputs["x"][toks]
    rw = torch.full((cap, 1), float("nan"), dtype=torch.float32)
    rw[:n, 0] = inputs["weights"][toks, slots]
    args = {"x": x, "route_weight": rw, "expert_offsets": off}
    for name in WEIGHT_NAMES:
        w = inputs[name][rank * n_local:(rank + 1) * n_local]
        args[name] = w if is_broadcast(w) else w.contiguous()  # placeholders stay views
    args["y"] = torch.full((cap, config.hidden_size), SENTINEL, dtype=torch.bfloat16)
    args["h_mx"] = torch.full((cap, config.moe.intermediate_size), SENTINEL,
                              dtype=torch.bfloat16)  # kernel scratch, not compared
    args["x_mx"] = torch.full((cap, config.hidden_size), SENTINEL, dtype=torch.bfloat16)
    return args


def launch_rank(platform, config, ep, rank: int, args, variant: str = "reference",
                i_tile: int | None = None):
    """Validate one rank's arguments on the host (:func:`validate_launch`), then launch the
    kernel as ``rank`` (``variant`` and ``i_tile``: build options, defaults if None);
    returns the launch result (raises on a failed launch)."""
    from harness.platforms import KernelSpec
    validate_launch(config, args)
    options = build_options(variant, i_tile)
    program = platform.compile(KernelSpec(MODULE, options), config,
                               {"rows": args["x"].shape[0], "ep": ep})
    return platform.launch(program, rank, args).raise_for_error()


def build_options(variant: str = "reference", i_tile: int | None = None) -> dict:
    """The kernel's build options: ``variant`` unless the reference, ``i_tile`` if given."""
    options = {} if variant == "reference" else {"variant": variant}
    if i_tile is not None:
        options["i_tile"] = i_tile
    return options


def packed_bytes(config, experts: int) -> int:
    """Bytes of ``experts`` experts' packed MXFP4 weights and scales."""
    d, i = config.hidden_size, config.moe.intermediate_size
    return experts * (3 * i * d // 2 + 3 * i * d // 32)


def chunk_experts(config, n_local: int) -> int:
    """Local experts per estimate-only launch of a split rank: the size of the fewest
    near-equal chunks (the last may be smaller) whose packed weights each stay within
    :data:`ESTIMATE_RANK_BYTES` (one expert each when the limit is below one expert)."""
    one = packed_bytes(config, 1)
    if ESTIMATE_RANK_BYTES < one:
        return 1
    chunks = -(-packed_bytes(config, n_local) // ESTIMATE_RANK_BYTES)
    while packed_bytes(config, -(-n_local // chunks)) > ESTIMATE_RANK_BYTES:
        chunks += 1
    return -(-n_local // chunks)


def split_rank(platform, config, case) -> bool:
    """True when an estimate-only platform launches a rank's experts in chunks
    (:func:`chunk_experts`): its packed weights exceed :data:`ESTIMATE_RANK_BYTES` (a whole
    FLASH EP4 rank's cost-model task graph does not fit in 24 GiB; an EP8 rank's does).
    Interpreted and card launches take the whole rank."""
    n_local = config.moe.n_routed_experts // ranks(case)
    return (getattr(platform, "estimate_only", False)
            and packed_bytes(config, n_local) > ESTIMATE_RANK_BYTES)


def estimate_rank_in_chunks(platform, config, case, rank: int, args, variant: str = "reference",
                            i_tile: int | None = None, launch=None) -> dict | None:
    """One rank's estimate as launches run one after another: the whole rank in one launch
    when its experts fit :data:`ESTIMATE_RANK_BYTES`, else one launch per chunk of
    :func:`chunk_experts` consecutive local experts that has rows (those experts' rows and
    weights only, offsets rebased; an expert of the chunk without rows reads no weight),
    then one that writes the padding rows (no expert rows: no weight read).  Launches equal
    in shape and metadata are estimated once (the estimate-only memo).  Returns the rank's
    summed cost record; with ``launch`` (the caller's :class:`RankLauncher`, e.g. the MoE
    composition's) the records go to that launcher instead and None is returned."""
    from harness.entries._kernel import sequential_cost
    from harness.entries.attention_kernels import RankLauncher, launch_memo
    validate_launch(config, args)
    options = build_options(variant, i_tile)
    own = launch is None
    if own:
        launch = RankLauncher(platform, config, rank, case.preset, memo=launch_memo(platform))
    off = [int(v) for v in args["expert_offsets"]]
    cap, step = args["x"].shape[0], chunk_experts(config, len(off) - 1)

    def one(first: int, rows: int, offsets: list[int], j: int, count: int) -> None:
        part = {"x": args["x"][first:first + rows].contiguous(),
                "route_weight": args["route_weight"][first:first + rows].contiguous(),
                "expert_offsets": torch.tensor(offsets, dtype=torch.int32)}
        for name in WEIGHT_NAMES:
            part[name] = args[name][j:j + count].contiguous()
        launch(MODULE, {"rows": rows, "local": count}, part, options=options)

    if step >= len(off) - 1:  # the whole rank fits: one launch, padding rows included
        one(0, cap, off, 0, len(off) - 1)
    else:
        for a in range(0, len(off) - 1, step):
            b = min(a + step, len(off) - 1)
            if off[b] > off[a]:
                one(off[a], off[b] - off[a], [o - off[a] for o in off[a:b + 1]], a, b - a)
        if cap > off[-1]:
            one(off[-1], cap - off[-1], [0, 0], 0, 1)
    if not own:
        return None
    return sequential_cost(launch.records) if launch.records else None


def kernel_sut(variant: str = "reference", i_tile: int | None = None):
    """The SUT: host validation of the routing and of every rank's launch arguments, then
    one launch per EP rank (an empty rank too); ``variant``/``i_tile`` as in
    :func:`launch_rank`.  An estimate-only platform splits a rank too large for the cost
    model into chunks of experts (:func:`split_rank`): its figure is their sum."""
    def run(platform, config, case, inputs) -> SutOutput:
        validate_routing(config, case, inputs)
        per_rank = [rank_inputs(config, case, r, inputs) for r in range(ranks(case))]
        for args in per_rank:
            validate_launch(config, args)
        y, records = inputs["y"], []
        if split_rank(platform, config, case):
            for rank, args in enumerate(per_rank):
                record = estimate_rank_in_chunks(platform, config, case, rank, args, variant,
                                                 i_tile)
                if record:
                    records.append({**record, "rank": rank})
            return SutOutput({"y": y}, records)
        for rank, args in enumerate(per_rank):
            result = launch_rank(platform, config, case.ep, rank, args, variant, i_tile)
            y[rank] = result.outputs["y"]
            record = result.cost_record()
            if record:
                records.append(record)
        return SutOutput({"y": y}, records)
    return run


def _expert(inputs, ex: int) -> ExpertWeights:
    return ExpertWeights(*(inputs[name][ex] for name in WEIGHT_NAMES))


def golden(config, case, inputs):
    n_local = config.moe.n_routed_experts // ranks(case)
    y = torch.zeros(inputs["y"].shape, dtype=torch.bfloat16)
    for r in range(ranks(case)):
        toks, slots, off = dispatch(inputs["indices"], r * n_local, n_local)
        for j in range(n_local):
            a, b = int(off[j]), int(off[j + 1])
            if a < b:  # an expert without rows is skipped (its weights unread)
                t, s = toks[a:b], slots[a:b]
                y[r, a:b] = routed_expert(inputs["x"][t], inputs["weights"][t, s],
                                          _expert(inputs, r * n_local + j), config)
    return {"y": y}


def compare(config, case, inputs, gold, actual):
    n_local = config.moe.n_routed_experts // ranks(case)
    cap = inputs["y"].shape[1]
    verdicts = []
    for r in range(ranks(case)):
        n = int(dispatch(inputs["indices"], r * n_local, n_local)[2][-1])
        name = f"y[{r}]"
        if n:
            verdicts += (check_row_bound(name, actual["y"][r], gold["y"][r], rows=slice(0, n))
                         + check_sentinel(name, actual["y"][r], SENTINEL, rows=slice(0, n),
                                          ref=gold["y"][r]))
        verdicts += check_zero_rows(name, actual["y"][r], rows=slice(n, cap))
    return verdicts


def rank_work(config, rows: int, cap: int, experts_used: int) -> tuple[int, int, int]:
    """``(bytes, cube BF16 FLOPs, vector FLOPs)`` one rank's launch needs at least: the
    packed weights and scales of its experts that received rows (read once), its
    dispatched rows and route weights in, every buffer row out; the three products on the
    cube; vector: 2 operations per weight element of a used expert (one decode: nibble
    split and scale, what a device LUT decode costs), 40 per MX-quantized activation
    element (x and h) and 10 per SwiGLU element.  The kernel decodes a weight once per row
    tile of 16 rows, so above 16 rows per expert it does more than this."""
    d, i = config.hidden_size, config.moe.intermediate_size
    packed = 3 * i * d // 2 + 3 * i * d // 32  # w1, w3, w2 payloads and scales
    moved = experts_used * packed + rows * (2 * d + 4) + cap * 2 * d
    cube = 2 * rows * (2 * i * d + d * i)
    vector = 2 * experts_used * 3 * i * d + 40 * rows * (d + i) + 10 * rows * i
    return moved, cube, vector


def work(config, case, inputs):
    """The slowest rank's :func:`rank_work` (the estimate is the slowest rank's; ranks are
    ordered by bytes)."""
    n_local = config.moe.n_routed_experts // ranks(case)
    cap = inputs["y"].shape[1]
    best = (0, 0, 0)
    for r in range(ranks(case)):
        off = dispatch(inputs["indices"], r * n_local, n_local)[2]
        used = int((off[1:] > off[:-1]).sum())
        best = max(best, rank_work(config, int(off[-1]), cap, used), key=lambda v: v[0])
    return Work(best[0], {CUBE_BF16: best[1], VECTOR_FP32: best[2]})


ENTRY = register(Entry(
    name="routed_experts",
    description="one EP rank's local MXFP4 routed experts over its dispatched rows (grouped "
                "by expert): in-kernel FP4 tile decode, MXFP8 activations, clamped SwiGLU, "
                "route weight before W2; padding rows zero",
    support=SUPPORT,
    # the contract's EP4 CI pair by default (the tests add EP4 per rank, empty experts and
    # ranks); one rank, EP2 and EP8 under ``slow`` to keep the default run short
    matrix=(Case(entry="routed_experts", tokens=24, ep=4, tp=2, dp=2),
            Case(entry="routed_experts", tokens=16, ep=4, tp=4, kind="holes")),
    slow_cases=(Case(entry="routed_experts", tokens=21),
                Case(entry="routed_experts", tokens=24, ep=2, dp=2),
                Case(entry="routed_experts", tokens=20, ep=8, tp=4, dp=2, kind="holes")),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut()},
    work=work,
))
