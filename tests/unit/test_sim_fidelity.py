"""The fidelity traces (seeded, JSON) and the comparison of event logs; no vLLM here."""

from __future__ import annotations

import pytest

from fairshare.sim.fidelity.replay import replay
from fairshare.sim.fidelity.trace import (
    PRIORITIES,
    EventLog,
    LogBuilder,
    StepEvents,
    Trace,
    TraceRequest,
    compare,
    figures,
    generate,
)

pytestmark = pytest.mark.timeout(60)


def test_a_seed_gives_the_same_trace() -> None:
    assert generate(7) == generate(7)
    assert generate(7) != generate(8)


@pytest.mark.parametrize("seed", range(20))
def test_generated_traces_are_within_their_ranges(seed: int) -> None:
    trace = generate(seed)
    assert 2 <= trace.max_num_seqs <= 8
    assert trace.kv_blocks % trace.max_num_seqs == 0
    assert [r.rid for r in trace.requests] == list(range(len(trace.requests)))
    assert [r.arrival_step for r in trace.requests] == sorted(
        r.arrival_step for r in trace.requests
    )
    assert all(r.priority in PRIORITIES for r in trace.requests)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in trace.requests)


def test_traces_cover_every_priority() -> None:
    seen = {r.priority for seed in range(10) for r in generate(seed).requests}
    assert seen == set(PRIORITIES)


def test_trace_and_log_round_trip_through_json() -> None:
    trace = generate(3)
    assert Trace.from_json(trace.to_json()) == trace
    log = replay(trace)
    assert EventLog.from_json(log.to_json()) == log


def test_builder_sorts_a_steps_preemptions_and_finishes_not_its_admissions() -> None:
    b = LogBuilder()
    b.admitted(2, 5)
    b.admitted(2, 3)
    b.preempted(4, 9)
    b.preempted(4, 1)
    b.finished(4, 8)
    b.finished(4, 6)
    assert b.log().steps == [StepEvents(2, (5, 3)), StepEvents(4, (), (1, 9), (6, 8))]


@pytest.mark.parametrize(
    ("left", "right", "step"),
    [
        pytest.param([StepEvents(1, (0,))], [StepEvents(1, (0,))], None, id="equal"),
        pytest.param([StepEvents(1, (0,))], [StepEvents(2, (0,))], 1, id="admitted-later"),
        pytest.param([StepEvents(1, (0, 1))], [StepEvents(1, (1, 0))], 1, id="admission-order"),
        pytest.param(
            [StepEvents(1, (0,)), StepEvents(5, finished=(0,))],
            [StepEvents(1, (0,))],
            5,
            id="missing-step",
        ),
    ],
)
def test_compare_names_the_first_differing_step(
    left: list[StepEvents], right: list[StepEvents], step: int | None
) -> None:
    diff = compare(EventLog(left), EventLog(right))
    assert (None if diff is None else diff.step) == step


def test_compare_sees_different_refusals() -> None:
    diff = compare(EventLog(refused=(1,)), EventLog())
    assert diff is not None and diff.step == -1


def test_replay_of_a_small_trace() -> None:
    # One slot, 4 blocks of 16 tokens: request 0 runs steps 0-2; request 1 (priority 0)
    # arrives at step 1 and starts when 0 has finished; request 2 is larger than the cache.
    trace = Trace(
        "hand",
        max_num_seqs=1,
        kv_blocks=4,
        requests=(
            TraceRequest(0, 0, 10, 16, 3),
            TraceRequest(1, 1, 0, 16, 2),
            TraceRequest(2, 1, 0, 60, 10),
        ),
    )
    log = replay(trace)
    assert log.refused == (2,)
    assert log.steps == [
        StepEvents(0, (0,)),
        StepEvents(2, finished=(0,)),
        StepEvents(3, (1,)),
        StepEvents(4, finished=(1,)),
    ]
    fig = figures(trace, log)
    assert fig.within_waits == (2,)
    assert fig.borrowing_waits == (0,)


def test_replay_preempts_the_largest_priority_when_the_cache_fills() -> None:
    # Two slots, 2 blocks: each request's prompt fills a block; the next token needs a
    # second block for each, so the borrower (priority 20) is preempted for the other.
    trace = Trace(
        "kv",
        max_num_seqs=2,
        kv_blocks=2,
        requests=(TraceRequest(0, 0, 20, 16, 4), TraceRequest(1, 0, 0, 16, 4)),
    )
    log = replay(trace)
    assert log.steps[0] == StepEvents(0, (1, 0))
    assert log.steps[1] == StepEvents(1, preempted=(0,))
    fig = figures(trace, log)
    assert (fig.within_preemptions, fig.borrowing_preemptions) == (0, 1)
