"""a5sim's estimate-only level (``cost``: compile + cost model, no interpreter): the
estimate equals the validated run's, nothing is compared or saved, and the level is never
taken from ``V41_VERIFY`` (a verdict read at it would be a pass nobody checked)."""

import pytest

from harness.case import Case
from harness.platforms import verify
from harness.platforms.a5sim import A5SimPlatform
from harness.platforms.base import PlatformError
from harness.runner import run_case

# one elementwise kernel, one with runtime slot branches, one gather-heavy kernel
CASES = (Case(entry="rmsnorm", tokens=33, kind="zero"),
         Case(entry="window_publish", tokens=40, active_tokens=33, requests=3),
         Case(entry="sparse_attention", tokens=6, tp=2, kind="sink", seed=5))


@pytest.fixture(scope="module")
def estimator():
    platform = A5SimPlatform(verify=verify.ESTIMATE_LEVEL)
    yield platform
    platform.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.entry)
def test_estimate_only_gives_the_validated_estimate(a5sim, estimator, case):
    checked = run_case(case, platform=a5sim)
    assert checked.status == "pass", checked.failure_text()
    est = run_case(case, platform=estimator)
    assert est.status == "estimate" and est.verdicts == [] and est.verify_level == "cost"
    assert "nothing compared" in est.reason
    assert est.estimated_a5_us() is not None
    assert est.estimated_a5_us() == checked.estimated_a5_us()
    assert [c["rank"] for c in est.costs] == [c["rank"] for c in checked.costs]


def test_estimate_only_outputs_are_not_computed(estimator):
    """The interpreter really is off: a launch's output keeps the value it was given."""
    import torch

    from harness import registry

    case = Case(entry="rmsnorm", tokens=1)
    entry = registry.get("rmsnorm")
    inputs = entry.build_inputs(case.config, case)
    out = entry.sut_for("a5sim")[1](estimator, case.config, case, inputs).outputs
    golden = entry.golden(case.config, case, entry.build_inputs(case.config, case))
    name = next(iter(golden))
    assert not torch.allclose(out[name].float(), golden[name].float(), atol=1e-2)


def test_estimate_only_run_refuses_to_save(estimator, tmp_path):
    with pytest.raises(ValueError, match="save_root: an estimate-only platform"):
        run_case(Case(entry="rmsnorm", tokens=1), platform=estimator, save_root=str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_cost_level_is_not_accepted_from_the_environment(monkeypatch):
    monkeypatch.setenv(verify.ENV_VERIFY, "cost")
    with pytest.raises(PlatformError, match="V41_VERIFY: 'cost' is not one of"):
        A5SimPlatform()
    with pytest.raises(PlatformError, match="verify: 'bogus' is not one of"):
        A5SimPlatform(verify="bogus")


@pytest.mark.parametrize("pair", [
    (Case(entry="window_publish", tokens=40, active_tokens=33, requests=3, seed=17),
     Case(entry="window_publish", tokens=40, active_tokens=33, requests=3, seed=5)),
    (Case(entry="sparse_attention", tokens=6, tp=2, kind="sink", seed=5),
     Case(entry="sparse_attention", tokens=6, tp=2, kind="mixed", seed=11))],
    ids=lambda p: p[0].entry)
def test_the_estimate_depends_on_shapes_not_payload(estimator, pair):
    """Other activations, weights and caches at the same shapes cost the same: what lets
    the decode leaves reuse an estimate-only launch whose shapes and integer metadata match
    (``LaunchMemo(by_shape=True)``; valid counts held in tensors do change the estimate, so
    the metadata stays in the key)."""
    a, b = (run_case(c, platform=estimator) for c in pair)
    assert a.status == b.status == "estimate"
    assert a.estimated_a5_us() == b.estimated_a5_us()


@pytest.mark.parametrize("name", ["routed_experts", "moe"])
def test_placeholder_expert_weights_give_the_real_weights_estimate(estimator, name):
    """What lets ``bench --estimate-only`` build FLASH MoE fixtures without quantizing 384
    experts: constant placeholder weights cost the same as the real ones (a fresh platform
    for the placeholder run, so no launch is reused from the first run's memo)."""
    from harness import registry
    from harness.fixtures import weight_placeholders

    case = registry.get(name).matrix[0]
    real = run_case(case, platform=estimator)
    fresh = A5SimPlatform(verify=verify.ESTIMATE_LEVEL)
    try:
        with weight_placeholders():
            placeholder = run_case(case, platform=fresh)
    finally:
        fresh.close()
    assert real.status == placeholder.status == "estimate", (real.reason, placeholder.reason)
    assert real.estimated_a5_us() is not None
    assert placeholder.estimated_a5_us() == real.estimated_a5_us()
    assert ([c["aicore_e2e_us"] for c in placeholder.costs]
            == [c["aicore_e2e_us"] for c in real.costs])


def test_sparse_attention_compiles_at_flash_tp2(estimator):
    """32 heads a rank (TP2 FLASH, as decode_layer and the prefill leaves run it): the
    three-term P.V sum once took a (3, 32, 512) FP32 vector tile, over the A5's UB, and
    pypto's schedule pass refused the kernel; only the FLASH bench showed it."""
    r = run_case(Case(entry="sparse_attention", tp=2, tokens=2, preset="flash"),
                 platform=estimator)
    assert r.status == "estimate", r.failure_text()
    assert r.estimated_a5_us() is not None


def test_moe_estimates_a_large_rank_expert_by_expert(estimator, monkeypatch):
    """A FLASH EP4 rank's experts do not fit one cost-model task graph in 24 GiB: the MoE
    composition then estimates them in chunks of experts, like the ``routed_experts``
    entry (TINY ranks forced to split one expert per launch here)."""
    from harness import registry
    from harness.entries import routed_experts

    case = registry.get("moe").matrix[0]
    whole = run_case(case, platform=estimator)
    monkeypatch.setattr(routed_experts, "ESTIMATE_RANK_BYTES", 0)
    fresh = A5SimPlatform(verify=verify.ESTIMATE_LEVEL)
    try:
        split = run_case(case, platform=fresh)
    finally:
        fresh.close()
    assert whole.status == split.status == "estimate", (whole.reason, split.reason)
    assert split.estimated_a5_us() > 0
    assert [c["rank"] for c in split.costs] == [c["rank"] for c in whole.costs]
    assert sum(c["launches"] for c in split.costs) > sum(c["launches"] for c in whole.costs)
