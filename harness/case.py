"""The case model: one point of an entry's validation matrix.

A :class:`Case` names every axis (tp, dp, ep, tokens, active_tokens, dp_tokens, requests,
epochs, wiring, kind, seed, preset, platform).  ``dp_tokens`` (the contract's
``--dp-tokens``) gives each DP group its own group-global valid count; without it every
group has ``active`` rows.  :func:`validate_case` checks a case against the
entry's declared support and the contract's capacities, raising :class:`CaseError` that
names the axis, the value and the bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from goldens.config import (SUPPORTED_EP_SIZES, SUPPORTED_TP_SIZES, ConfigError, Parallel,
                            V41Config, preset)

WIRINGS = ("replicated", "sharded")
PLATFORMS = ("a5sim", "a5")
PHASES = ("decode", "prefill", "none")


class CaseError(ValueError):
    """A case whose axes break a rule of its entry or of the contract."""


@dataclass(frozen=True)
class Support:
    """What an entry accepts on each axis."""

    phase: str = "none"  # decode: tokens <= 192; prefill: tokens <= 4096
    tp_sizes: tuple[int, ...] = (1,)
    dp_sizes: tuple[int, ...] = (1,)
    ep_sizes: tuple[int | None, ...] = (None,)
    wirings: tuple[str, ...] = ("replicated",)
    kinds: tuple[str, ...] = ("mixed",)
    inactive_rows: bool = False  # active_tokens < tokens allowed
    max_epochs: int = 1000
    min_tokens: int = 1
    ep_world: bool = False  # the EP world is the DP groups x TP ranks: ep == tp * dp


@dataclass(frozen=True)
class Case:
    entry: str
    tp: int = 1
    dp: int = 1
    ep: int | None = None
    tokens: int = 8
    active_tokens: int | None = None  # None: all tokens active
    dp_tokens: tuple[int, ...] | None = None  # per-DP-group valid counts (--dp-tokens)
    requests: int = 1
    epochs: int = 1
    wiring: str = "replicated"
    kind: str = "mixed"
    seed: int = 17
    preset: str = "tiny"
    platform: str = "a5sim"

    def __post_init__(self):
        if isinstance(self.dp_tokens, list):  # a case read back from JSON
            object.__setattr__(self, "dp_tokens", tuple(self.dp_tokens))

    @property
    def active(self) -> int:
        """The active rows of a case without ``dp_tokens``; with them, the largest group's
        count (per-group code must ask :meth:`group_active`)."""
        if self.dp_tokens is not None:
            return max(self.dp_tokens)
        return self.tokens if self.active_tokens is None else self.active_tokens

    def group_active(self, g: int) -> int:
        """The group-global valid count of DP group ``g``."""
        if self.dp_tokens is not None:
            return self.dp_tokens[g]
        return self.active

    @property
    def cards(self) -> int:
        """Cards a launch needs: ep for expert-parallel cases, else tp * dp."""
        return self.ep if self.ep is not None else self.tp * self.dp

    @property
    def parallel(self) -> Parallel:
        return Parallel(tp=self.tp, dp=self.dp, ep=self.ep)

    @property
    def config(self) -> V41Config:
        return preset(self.preset)

    @property
    def case_id(self) -> str:
        """Stable, human-readable id naming every axis (node ids and data folders)."""
        ep = f"-ep{self.ep}" if self.ep is not None else ""
        act = f"a{self.active_tokens}" if self.active_tokens is not None else ""
        if self.dp_tokens is not None:
            act += "d" + "_".join(map(str, self.dp_tokens))
        return (f"{self.entry}-tp{self.tp}-dp{self.dp}{ep}-t{self.tokens}{act}-r{self.requests}"
                f"-e{self.epochs}-{self.wiring}-{self.kind}-s{self.seed}-{self.preset}")

    def axes(self) -> dict:
        return asdict(self)

    def with_(self, **changes) -> "Case":
        return replace(self, **changes)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise CaseError(message)


def validate_axis_values(*, tp: int | None = None, dp: int | None = None,
                         ep: int | None = None) -> None:
    """Raise :class:`CaseError` for a parallel-axis value no entry accepts (the contract's
    TP and EP sizes, dp >= 1); front ends check selection flags with it before any work."""
    if tp is not None:
        _check(tp in SUPPORTED_TP_SIZES, f"tp: {tp} is not one of {SUPPORTED_TP_SIZES}")
    if dp is not None:
        _check(dp >= 1, f"dp: {dp} must be >= 1")
    if ep is not None:
        _check(ep in SUPPORTED_EP_SIZES, f"ep: {ep} is not one of {SUPPORTED_EP_SIZES}")


def check_dp_tokens(dp_tokens, dp: int, tokens: int) -> None:
    """Raise :class:`CaseError` unless ``dp_tokens`` holds one int count per DP group, each in
    ``[0, tokens]`` (a count of 0 is an idle group)."""
    _check(isinstance(dp_tokens, (tuple, list)) and all(isinstance(n, int) for n in dp_tokens),
           f"dp_tokens: {dp_tokens!r} must be a list of ints, one per DP group")
    _check(len(dp_tokens) == dp,
           f"dp_tokens: {len(dp_tokens)} counts {tuple(dp_tokens)} for dp={dp} DP groups; "
           f"give one count per DP group")
    for g, n in enumerate(dp_tokens):
        _check(0 <= n <= tokens, f"dp_tokens[{g}]: {n} outside [0, tokens={tokens}]")


def validate_case(case: Case, support: Support, cards_available: int | None = None) -> None:
    """Raise :class:`CaseError` naming the axis and bound of the first broken rule."""
    try:
        cfg = case.config
    except ConfigError as err:
        raise CaseError(str(err)) from None
    _check(case.platform in PLATFORMS, f"platform: {case.platform!r} is not one of {PLATFORMS}")
    validate_axis_values(tp=case.tp)
    _check(case.tp in support.tp_sizes,
           f"tp: {case.tp} is not supported by {case.entry} (supported {support.tp_sizes})")
    _check(case.dp in support.dp_sizes,
           f"dp: {case.dp} is not supported by {case.entry} (supported {support.dp_sizes})")
    _check(case.ep in support.ep_sizes,
           f"ep: {case.ep} is not supported by {case.entry} (supported {support.ep_sizes})")
    validate_axis_values(ep=case.ep)
    _check(not support.ep_world or case.ep == case.tp * case.dp,
           f"ep: {case.ep} must equal tp * dp = {case.tp} * {case.dp} for {case.entry} (the EP world "
           f"is the DP groups x TP ranks)")
    try:
        case.parallel
    except ConfigError as err:
        raise CaseError(str(err)) from None
    _check(cfg.num_heads % case.tp == 0,
           f"tp: num_heads {cfg.num_heads} of preset {case.preset} is not divisible by tp {case.tp}")
    _check(case.wiring in WIRINGS and case.wiring in support.wirings,
           f"wiring: {case.wiring!r} is not supported by {case.entry} (supported {support.wirings})")
    _check(case.kind in support.kinds,
           f"kind: {case.kind!r} is not supported by {case.entry} (supported {support.kinds})")
    cap = {"decode": cfg.cache.decode_max_tokens, "prefill": cfg.cache.prefill_max_tokens}.get(
        support.phase, cfg.cache.prefill_max_tokens)
    _check(support.min_tokens <= case.tokens <= cap,
           f"tokens: {case.tokens} outside [{support.min_tokens}, {cap}] for {support.phase} "
           f"entry {case.entry}")
    if case.active_tokens is not None:
        _check(0 <= case.active_tokens <= case.tokens,
               f"active_tokens: {case.active_tokens} outside [0, tokens={case.tokens}]")
        _check(support.inactive_rows or case.active_tokens == case.tokens,
               f"active_tokens: {case.active_tokens} < tokens {case.tokens} is not supported by "
               f"{case.entry} (compact batches only)")
    if case.dp_tokens is not None:
        check_dp_tokens(case.dp_tokens, case.dp, case.tokens)
        _check(case.active_tokens is None,
               f"active_tokens: {case.active_tokens} given with dp_tokens {case.dp_tokens}; "
               f"give one of them (dp_tokens sets every group's count)")
        _check(support.inactive_rows or all(n == case.tokens for n in case.dp_tokens),
               f"dp_tokens: {case.dp_tokens} below tokens {case.tokens} is not supported by "
               f"{case.entry} (compact batches only)")
    max_req = min(cfg.cache.max_batch_per_dp, case.tokens)
    _check(1 <= case.requests <= max_req,
           f"requests: {case.requests} outside [1, min({cfg.cache.max_batch_per_dp}, "
           f"tokens {case.tokens})]")
    _check(1 <= case.epochs <= support.max_epochs,
           f"epochs: {case.epochs} outside [1, {support.max_epochs}]")
    if cards_available is not None:
        _check(case.cards <= cards_available,
               f"cards: case needs {case.cards} (tp*dp or ep) but {cards_available} are available")


def standard_matrix(entry: str, support: Support, base: Case | None = None,
                    role: str = "single") -> list[Case]:
    """The contract's default CI combinations for an entry.

    ``role`` is ``"single"`` (all of (1,1), (2,2), (4,1) the entry supports), ``"composing"``
    (a decode entry: (1,1) and (4,1)), ``"leaf"`` (the _attn_ leaf it composes: (2,2), or
    (1,1) when the leaf exposes DP1 only), or ``"tp_only"`` (TP1 and TP4).
    """
    base = base or Case(entry=entry)
    combos = {"single": [(1, 1), (2, 2), (4, 1)], "composing": [(1, 1), (4, 1)],
              "leaf": [(2, 2)], "tp_only": [(1, 1), (4, 1)]}[role]
    if role == "leaf" and 2 not in support.dp_sizes:
        combos = [(1, 1)]
    cases = []
    for tp, dp in combos:
        if tp in support.tp_sizes and dp in support.dp_sizes:
            for wiring in support.wirings:
                cases.append(replace(base, entry=entry, tp=tp, dp=dp, wiring=wiring))
    return cases

