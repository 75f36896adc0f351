"""The simulator's scheduling rules (vLLM's priority scheduler, step by step in vLLM v1's order)
and short scenario runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fairshare import Class
from fairshare.sim import command, scenarios
from fairshare.sim.allocators import SetupError
from fairshare.sim.engine import Routing, Simulator
from fairshare.sim.model import Hardware, Policy, Request
from fairshare.sim.scenarios import before, many_instances
from fairshare.sim.scenarios.owner_crash import FailoverAllocator
from fairshare.sim.scenarios.result import percentile

pytestmark = pytest.mark.timeout(60)

# 1 ms per prompt token, 10 ms per output token, KV blocks of 16 tokens, no watermark.
HW = Hardware(prefill_s_per_token=0.001, decode_s_per_token=0.01, block_tokens=16, watermark=0.0)
ONE_BLOCK = dataclasses.replace(HW, kv_blocks_per_slot=1)
"""HW with one KV block per slot: a request of a 16-token prompt needs a second block at its
first output token."""


class Fixed:
    """An allocator that gives each team a fixed priority."""

    def __init__(self, priorities: dict[str, int]) -> None:
        self.priorities = priorities

    def admit(self, req: Request) -> None:
        req.priority = self.priorities[req.team]

    def release(self, req: Request, cost: float) -> None:
        pass

    def set_capacity(self, capacity: int) -> None:
        pass


class Recording(Simulator):
    """Records every preemption victim, in order."""

    victims: list[str]

    def preempted(self, req: Request) -> None:
        self.victims.append(req.team)
        super().preempted(req)


def _sim(
    priorities: dict[str, int],
    *,
    capacity: int,
    hardware: Hardware = HW,
    policy: Policy = Policy.PRIORITY,
    horizon_s: float = 100.0,
    instances: int = 1,
    routing: Routing | None = None,
) -> Recording:
    sim = Recording(
        capacity=capacity,
        hardware=hardware,
        allocator=Fixed(priorities),
        policy=policy,
        horizon_s=horizon_s,
        instances=instances,
        routing=routing,
    )
    sim.victims = []
    return sim


def _start_order(policy: Policy) -> list[str]:
    """One slot held by 'hold'; four requests queue behind it; returns the start order."""
    sim = _sim({"hold": 50, "p5": 5, "p1": 1, "p1late": 1, "p3": 3}, capacity=1, policy=policy)
    sim.send("hold", Class.INTERACTIVE, 10, 100)  # runs 1.01 s
    for i, team in enumerate(["p5", "p1", "p3", "p1late"]):
        sim.at(0.1 * (i + 1), lambda team=team: sim.send(team, Class.INTERACTIVE, 10, 10))
    result = sim.run()
    started = sorted(
        (r for r in result.requests if r.first_start_s is not None),
        key=lambda r: r.first_start_s or 0.0,
    )
    return [r.team for r in started]


def test_waiting_requests_start_in_priority_then_arrival_order() -> None:
    assert _start_order(Policy.PRIORITY) == ["hold", "p1", "p1late", "p3", "p5"]


def test_fcfs_mode_ignores_priorities() -> None:
    assert _start_order(Policy.FCFS) == ["hold", "p5", "p1", "p3", "p1late"]


def test_a_waiting_request_never_preempts_a_running_one() -> None:
    sim = _sim({"low": 100, "high": 0}, capacity=1)
    sim.send("low", Class.BATCH, 10, 100)  # 0.01 + 1.0 s
    sim.at(0.5, lambda: sim.send("high", Class.INTERACTIVE, 10, 10))
    result = sim.run()
    low, high = result.requests
    assert low.preemptions == 0
    assert low.finish_s == pytest.approx(1.01)
    assert high.first_start_s == pytest.approx(1.01)
    assert sim.victims == []


def test_kv_exhaustion_preempts_the_largest_priority_then_latest_arrival() -> None:
    # 4 slots of 1 block each: three requests of 16-token prompts hold 3 blocks, and all
    # need a second block at their first output token.
    sim = _sim({"x0": 0, "x1": 10, "x2": 10}, capacity=4, hardware=ONE_BLOCK, horizon_s=5.0)
    for team in ("x0", "x1", "x2"):
        sim.send(team, Class.INTERACTIVE, 16, 40)
    result = sim.run()
    # x0 takes the free block; x1 then preempts x2 (same priority, later arrival); at the
    # next block x0 preempts x1; x0 itself is never the victim while others run.
    assert sim.victims[:2] == ["x2", "x1"]
    x0 = result.requests[0]
    assert x0.preemptions == 0
    assert all(r.finish_s is not None for r in result.requests)
    # A preempted request keeps its tokens: its last run re-prefills the prompt and them
    # (in whole steps), then decodes only the rest, one token a step.
    for x in result.requests[1:]:
        assert x.preemptions >= 1 and x.finish_s is not None and x.start_s is not None
        assert 0 < x.generated < x.output_tokens
        steps = HW.prefill_steps(x.prompt_tokens + x.generated) + x.output_tokens - x.generated
        assert x.finish_s - x.start_s == pytest.approx(steps * HW.step_s)


def test_fcfs_mode_preempts_the_latest_arrival() -> None:
    sim = _sim({"x0": 100, "x1": 0, "x2": 0}, capacity=4, hardware=ONE_BLOCK, policy=Policy.FCFS)
    for team in ("x0", "x1", "x2"):
        sim.send(team, Class.INTERACTIVE, 16, 40)
    sim.run()
    assert sim.victims[:2] == ["x2", "x1"]


class Standing(Fixed):
    """Fixed priorities; a priority of 10 or more borrows, as fairshare's do."""

    def admit(self, req: Request) -> None:
        super().admit(req)
        req.borrowing = req.priority >= 10


@pytest.mark.parametrize(
    ("policy", "beside"),
    [
        # priority: the borrower is the victim while it runs; a within-share request only
        # once it has gone.
        pytest.param(Policy.PRIORITY, {}, id="priority-evicts-the-borrower-first"),
        # fcfs: the request admitted last, the within-share one, while the borrower runs.
        pytest.param(Policy.FCFS, {"w1": 1}, id="fcfs-evicts-the-last-admitted"),
    ],
)
def test_preemptions_are_counted_by_standing(policy: Policy, beside: dict[str, int]) -> None:
    sim = _sim(
        {"w0": 0, "b": 10, "w1": 1}, capacity=4, hardware=ONE_BLOCK, policy=policy, horizon_s=5.0
    )
    sim.allocator = Standing({"w0": 0, "b": 10, "w1": 1})
    for team in ("w0", "b", "w1"):
        sim.send(team, Class.INTERACTIVE, 16, 40)
    result = sim.run()
    assert sim.victims[0] == ("b" if policy is Policy.PRIORITY else "w1")
    assert result.within_beside_borrower == beside
    within = {t: n for t, n in result.preemptions.items() if t != "b"}
    assert result.within_preemptions == within
    assert sum(within.values()) >= 1


def test_shrinking_preempts_the_largest_priority_first() -> None:
    sim = _sim({"a": 0, "b": 20, "c": 10}, capacity=3)
    for team in ("a", "b", "c"):
        sim.send(team, Class.INTERACTIVE, 10, 500)
    sim.at(1.0, lambda: sim.set_capacity(1))
    result = sim.run()
    assert sim.victims == ["b", "c"]
    assert result.capacity_log == [(0.0, 3), (1.0, 1)]


def test_the_capacity_is_split_over_the_instances() -> None:
    sim = _sim({}, capacity=10, instances=4)
    assert [inst.slots for inst in sim.instances] == [3, 3, 2, 2]
    sim.set_capacity(5)
    assert [inst.slots for inst in sim.instances] == [2, 1, 1, 1]
    # Fewer slots than instances would leave one with none, where requests wait for ever.
    with pytest.raises(ValueError, match="cannot be split"):
        sim.set_capacity(3)
    assert [inst.slots for inst in sim.instances] == [2, 1, 1, 1]
    with pytest.raises(ValueError, match="cannot be split"):
        _sim({}, capacity=3, instances=4)


@pytest.mark.parametrize(
    ("router", "high_starts_at"),
    [
        # Round-robin sends it to the busy instance: it waits for the low-priority request
        # there (a waiting request never preempts), while the other instance is idle.
        pytest.param("round-robin", 1.01, id="round-robin-waits-behind-a-running-borrower"),
        pytest.param("fewest-ahead", 0.5, id="fewest-ahead-finds-the-idle-instance"),
    ],
)
def test_priorities_apply_per_instance(router: str, high_starts_at: float) -> None:
    sim = _sim(
        {"low": 100, "short": 100, "high": 0},
        capacity=2,
        instances=2,
        routing=Routing(router=router, gateways=1),
    )
    sim.send("low", Class.BATCH, 10, 100)  # instance 0, runs until 1.01 s
    sim.send("short", Class.BATCH, 10, 5)  # instance 1, done at 0.06 s
    sim.at(0.5, lambda: sim.send("high", Class.INTERACTIVE, 10, 10))
    result = sim.run()
    high = result.requests[2]
    assert high.first_start_s == pytest.approx(high_starts_at)
    assert sim.victims == []


def test_a_run_is_deterministic_for_a_seed() -> None:
    first = scenarios.two_institutions(seed=7, scale=0.1).figures
    again = scenarios.two_institutions(seed=7, scale=0.1).figures
    assert first == again


# -- short scenario runs meet their targets ---------------------------------------------


def _missed(result: scenarios.ScenarioResult) -> list[str]:
    return [f"{t.text}: {t.value:.3f} vs {t.bound:.3f}" for t in result.targets if not t.met]


def test_two_institutions_meets_its_targets() -> None:
    result = scenarios.two_institutions(scale=0.3)
    assert result.ok, _missed(result)
    # small's within-share requests are never evicted; its borrowers may be, now that
    # large keeps its 13 reserved slots within share under the flood.
    assert result.figures["preemptions_small_within"] == 0
    assert result.figures["within_preempted_beside_borrower"] == 0
    # The rule before runs beside it: there large's reservation eroded and small's
    # borrowers ran in large's reserved slots, so none of small's requests was preempted.
    assert result.compared == before.LABEL
    assert result.figures["preemptions_small_before"] == 0


def test_three_teams_converges_to_two_to_one() -> None:
    # The full scale (3600 s, half-life 300 s), the report's: shorter runs settle 2 to 3
    # points short of 2 : 1 since preempted requests keep their tokens.
    result = scenarios.three_teams(scale=1.0)
    assert result.ok, _missed(result)
    assert result.figures["a_of_a_plus_b_fcfs"] == pytest.approx(0.5, abs=0.05)


def test_elastic_keeps_reserved_requests_prompt_in_every_phase() -> None:
    result = scenarios.elastic(scale=0.3)
    assert result.ok, _missed(result)


def test_failover_with_fail_open_requests_re_sent_matches_no_failover() -> None:
    result = scenarios.failover(scale=0.3)
    assert next(iter(result.runs)) == "failover"  # the checked run is the re-send one
    assert result.ok, _missed(result)
    assert result.figures["phantoms_after_adopt"] == 0
    assert result.figures["fail_open_resent"] > 0
    # The comparison printed beside it: adopted as they are, fail-open requests starve.
    assert result.compared == "failover, fail-open adopted as is"
    assert result.compared in result.runs
    never = [c for c in result.comparisons if "never started" in c.text]
    assert never and all(c.value == 0 for c in never)
    assert sum(c.other for c in never) > 0


def test_failover_re_sends_only_fail_open_requests_that_never_started() -> None:
    sim = _sim({}, capacity=1)
    alloc = FailoverAllocator(
        sim,
        {"a": 0.5, "b": 0.5},
        half_life_s=60.0,
        fail_at_s=1.0,
        outage_s=2.0,
        adopt_after_s=1.0,
        max_request_s=60.0,
        snapshot_every_s=0.5,
        resend_degraded=True,
    )
    sim.allocator = alloc
    sent: list[Request] = []
    # During the outage: the first starts at once (one slot), the second waits behind it.
    sim.at(1.5, lambda: sent.append(sim.send("a", Class.INTERACTIVE, 10, 1000)))
    sim.at(1.6, lambda: sent.append(sim.send("b", Class.INTERACTIVE, 10, 10)))
    result = sim.run()
    started, waiting = sent
    assert alloc.resent == 1
    assert started.first_start_s == 1.5 and started.grant is not None  # adopted, not re-sent
    assert started.epoch == alloc.epoch == 2
    assert not waiting.degraded and waiting.priority < 100  # decided again by the new owner
    assert waiting.queued_s == alloc.adopted_at_s
    assert waiting.arrival_s == 1.6  # its wait still counts from when the client sent it
    assert len(result.requests) == 2


@pytest.mark.parametrize(("k", "horizon_s"), [(4, 300.0), (16, 100.0)])
def test_a_pool_of_instances_keeps_small_within_share_waits_under_a_service_time(
    k: int, horizon_s: float
) -> None:
    """A short run of the multi-instance scenario's shipped router against FCFS."""
    assert k in many_instances.POOLS
    fair = many_instances.run_pool(k, many_instances.SHIPPED, horizon_s=horizon_s, seed=1)
    fcfs = many_instances.run_pool(
        k,
        many_instances.Variant("least-outstanding"),
        policy=Policy.FCFS,
        horizon_s=horizon_s,
        seed=1,
    )
    p99 = percentile(fair.waits("small", within_share=True), 99)
    assert p99 <= fair.mean_service_s()
    assert percentile(fcfs.waits("small", within_share=True), 99) >= 10 * p99
    assert {r.instance for r in fair.requests} == set(range(k))
    assert {r.gateway for r in fair.requests} == set(range(many_instances.GATEWAYS))


def test_the_multi_instance_scenario_is_in_process_only() -> None:
    assert scenarios.SCENARIOS["multi-instance"] is scenarios.multi_instance
    with pytest.raises(SetupError, match="in-process only"):
        scenarios.multi_instance(fairshare=lambda spec, sim: sim.allocator)


def test_cli_writes_the_report_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "simulation"
    status = command.main(["--scenario", "two-institutions", "--out", str(out), "--scale", "0.1"])
    assert status == 0
    text = (tmp_path / "simulation.md").read_text(encoding="utf-8")
    assert "](simulation/two-institutions-served.png)" in text
    assert sorted(p.name for p in out.iterdir()) == [
        "two-institutions-preemptions.png",
        "two-institutions-served.png",
        "two-institutions-waits.png",
    ]


# -- steps in vLLM v1's order: free the finished, grow the running, then admit ----------

# One step a second, no prefill time, one KV block of 16 tokens per slot: step k starts at
# k seconds while the instance is busy.
STEPS = Hardware(
    prefill_s_per_token=0.0, decode_s_per_token=1.0, block_tokens=16, kv_blocks_per_slot=1
)
ROOMY = dataclasses.replace(STEPS, kv_blocks_per_slot=8)
"""STEPS with room for the requests' growth: no preemption."""


def _starts(requests: list[Request]) -> dict[str, float | None]:
    return {r.team: r.first_start_s for r in requests}


def test_requests_sent_at_one_instant_start_by_priority_not_by_arrival() -> None:
    sim = _sim({"low": 10, "high": 1}, capacity=1, hardware=ROOMY)
    sim.send("low", Class.BATCH, 16, 3)
    sim.send("high", Class.INTERACTIVE, 16, 3)
    # Both are queued before the step at 0 runs: high starts, low once it has finished.
    assert _starts(sim.run().requests) == {"low": 3.0, "high": 0.0}


def test_a_busy_instance_admits_at_its_next_step_by_priority() -> None:
    sim = _sim({"hold": 0, "low": 10, "high": 1}, capacity=2, hardware=ROOMY)
    sim.send("hold", Class.BATCH, 16, 10)
    sim.at(0.2, lambda: sim.send("low", Class.BATCH, 16, 3))
    sim.at(0.7, lambda: sim.send("high", Class.INTERACTIVE, 16, 3))
    # One slot is free from 0.2 s, but admission happens at the step at 1 s, where high
    # (priority 1) is ahead of low (priority 10), which arrived first.
    assert _starts(sim.run().requests) == {"hold": 0.0, "low": 4.0, "high": 1.0}


def test_a_step_that_preempted_admits_nothing() -> None:
    # Three blocks: a and b start at 0 with one block each; at step 1 both need a second
    # one. a takes the last, b (the largest priority) preempts itself, freeing its block.
    sim = _sim({"a": 0, "b": 10, "c": 0}, capacity=3, hardware=STEPS)
    sim.send("a", Class.INTERACTIVE, 16, 8)
    sim.send("b", Class.INTERACTIVE, 16, 8)
    sim.at(0.5, lambda: sim.send("c", Class.INTERACTIVE, 16, 1))
    starts = _starts(sim.run().requests)
    assert sim.victims == ["b"]
    # c fits in b's freed block at step 1, but that step preempted: it starts at step 2.
    assert starts["c"] == 2.0


def test_requests_that_finished_free_their_blocks_before_running_ones_grow() -> None:
    # Two blocks. b (admitted first) needs its second block at step 1, the step at which
    # a's last token (it has one) has been produced: a leaves first, b takes its block.
    sim = _sim({"b": 0, "a": 10}, capacity=2, hardware=STEPS)
    sim.send("b", Class.INTERACTIVE, 16, 5)
    sim.send("a", Class.INTERACTIVE, 16, 1)
    result = sim.run()
    assert sim.victims == []
    a, b = sorted(result.requests, key=lambda r: r.team)
    assert (a.finish_s, b.finish_s) == (1.0, 5.0)
    assert a.preemptions == b.preemptions == 0


def test_the_watermark_is_vllm_v1s_default_none() -> None:
    assert Hardware().watermark == 0.0


@pytest.mark.parametrize(
    ("watermark", "second_starts_at"),
    [
        pytest.param(0.0, 0.0, id="default-fills-the-cache"),
        pytest.param(0.01, 1.0, id="one-percent-kept-free-while-a-request-runs"),
    ],
)
def test_admission_keeps_the_watermark_free_only_while_a_request_runs(
    watermark: float, second_starts_at: float
) -> None:
    # 100 blocks; each request needs 50 for its 800-token prompt and ends with its first
    # token, so neither ever grows.
    hw = dataclasses.replace(STEPS, kv_blocks_per_slot=50, watermark=watermark)
    sim = _sim({"first": 0, "second": 1}, capacity=2, hardware=hw)
    sim.send("first", Class.BATCH, 800, 1)
    sim.send("second", Class.BATCH, 800, 1)
    assert _starts(sim.run().requests) == {"first": 0.0, "second": second_starts_at}


def test_a_request_larger_than_the_whole_cache_is_refused_and_blocks_no_one() -> None:
    hw = dataclasses.replace(STEPS, kv_blocks_per_slot=4)  # 64 tokens on one slot
    sim = _sim({"huge": 0, "next": 10}, capacity=1, hardware=hw)
    huge = sim.send("huge", Class.BATCH, 60, 10)
    sim.send("next", Class.BATCH, 16, 3)
    result = sim.run()
    assert huge.refused and huge.first_start_s is None and huge.finish_s is None
    assert _starts(result.requests) == {"huge": None, "next": 0.0}
    assert sim.in_flight() == []
