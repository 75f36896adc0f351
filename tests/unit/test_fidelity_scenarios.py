"""One trace of each shipped scenario for ``make fidelity`` (bench/fidelity_scenarios.py):
what the first instance received in the window, numbered in arrival order, and the
simulator left as it was."""

from __future__ import annotations

from bench.fidelity_scenarios import WINDOW_S, record
from fairshare.sim.fidelity.replay import replay
from fairshare.sim.instance import Instance
from fairshare.sim.scenarios import SCENARIOS


def test_a_scenario_trace_is_its_first_instance_window_in_arrival_order() -> None:
    enqueue = Instance.enqueue
    trace = record("two-institutions", SCENARIOS["two-institutions"])
    assert Instance.enqueue is enqueue  # the recording is undone
    requests = trace.requests
    assert requests, "the window holds requests"
    assert [r.rid for r in requests] == list(range(len(requests)))
    steps = [r.arrival_step for r in requests]
    assert steps == sorted(steps)
    assert steps[-1] <= round(WINDOW_S / 0.02)  # the scenario's 20 ms steps
    assert {r.priority for r in requests} & {0, 1}, "within-share requests are in it"
    assert trace.kv_blocks % trace.max_num_seqs == 0
    assert all(trace.fits(r) for r in requests)
    assert record("two-institutions", SCENARIOS["two-institutions"]) == trace  # seeded
    log = replay(trace)
    assert log is not None
