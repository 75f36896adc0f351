"""The startup check of the upstreams' scheduling policy: a warning for one that does not
schedule by priority, and a gauge that says what each upstream told (or that it could not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairshare.gateway.policy import policy_of
from harness.standin import Standin

from .conftest import MODEL, eventually, start_stack

pytestmark = pytest.mark.timeout(120)


def test_policy_of() -> None:
    info = {"vllm_config": {"scheduler_config": {"policy": "fcfs"}}}
    assert policy_of(info) == "fcfs"
    assert policy_of({"vllm_config": "model='m', scheduler_config=..."}) is None
    assert policy_of([]) is None


async def test_each_upstream_is_asked_its_policy_at_startup(tmp_path: Path) -> None:
    def models(s: dict[str, Standin]) -> list[dict[str, object]]:
        return [{"name": MODEL, "pool": "gpu-a", "upstreams": [s[n].url for n in sorted(s)]}]

    async with start_stack(
        tmp_path,
        pools={"gpu-a": {}},
        standins={
            "fcfs": {"policy": "fcfs", "dev_mode": True},
            "priority": {"policy": "priority", "dev_mode": True},
            "silent": {"policy": "priority"},
        },
        models=models,
    ) as stack:
        gauge = "fairshare_gateway_upstream_priority_scheduling"
        told = {name: standin.url for name, standin in stack.standins.items()}

        async def told_all() -> bool:
            return (
                await stack.metric(gauge, upstream=told["fcfs"]) == 0
                and await stack.metric(gauge, upstream=told["priority"]) == 1
                and await stack.metric(gauge, upstream=told["silent"]) == -1
            )

        await eventually(told_all)
        log = stack.gateway.log_text()
        assert (
            f"WARNING fairshare.gateway.policy: upstream {told['fcfs']} schedules by 'fcfs'" in log
        )
        assert f"upstream {told['priority']} schedules by priority" in log
        assert f"upstream {told['silent']}: its scheduling policy cannot be read" in log
