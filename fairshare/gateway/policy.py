"""The startup check of each upstream's scheduling policy.

vLLM ignores a request's ``priority`` silently unless it runs with
``--scheduling-policy priority``. A running vLLM tells its policy in one place only:
``GET /server_info?config_format=json`` (``vllm_config.scheduler_config.policy``), which it
serves only when started with ``VLLM_SERVER_DEV_MODE=1``; otherwise that path is 404 and
the policy cannot be read by a client.

``check_policies`` asks every configured upstream once, in the background at startup, and
logs what it learns: a WARNING for an upstream that says it schedules by another policy,
an INFO line for one whose policy cannot be read. The gauge
``fairshare_gateway_upstream_priority_scheduling{upstream}`` says 1 (priority), 0 (another
policy: priorities are ignored there) or -1 (unknown). Not guaranteed: that the policy
stays what it was at startup (an upstream restarted with other flags is not asked again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Final

import aiohttp
from prometheus_client import Gauge

logger = logging.getLogger(__name__)

PRIORITY: Final = "priority"
CHECK_TIMEOUT_S: Final = 5.0
"""How long the question to one upstream may take."""
UNKNOWN: Final = -1


def policy_of(info: object) -> str | None:
    """The scheduling policy in a ``/server_info?config_format=json`` answer, or None."""
    config = info.get("vllm_config") if isinstance(info, Mapping) else None
    scheduler = config.get("scheduler_config") if isinstance(config, Mapping) else None
    policy = scheduler.get("policy") if isinstance(scheduler, Mapping) else None
    return policy if isinstance(policy, str) else None


async def read_policy(session: aiohttp.ClientSession, url: str) -> str | None:
    """The upstream's scheduling policy, or None when it does not say (not in dev mode,
    not vLLM, unreachable)."""
    try:
        async with session.get(
            url + "/server_info",
            params={"config_format": "json"},
            timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S),
        ) as reply:
            if reply.status != 200:  # noqa: PLR2004 (HTTP OK)
                return None
            return policy_of(await reply.json(content_type=None))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def check_policies(
    session: aiohttp.ClientSession, upstreams: Iterable[str], gauge: Gauge
) -> dict[str, str | None]:
    """Asks each upstream its policy, logs and records the answers (see the module doc)."""
    urls = sorted(set(upstreams))
    policies = await asyncio.gather(*(read_policy(session, url) for url in urls))
    for url, policy in zip(urls, policies, strict=True):
        if policy is None:
            gauge.labels(url).set(UNKNOWN)
            logger.info(
                "upstream %s: its scheduling policy cannot be read (vLLM tells it at "
                "/server_info only with VLLM_SERVER_DEV_MODE=1); it must run with "
                "--scheduling-policy priority or the allocator's priorities are ignored",
                url,
            )
        elif policy == PRIORITY:
            gauge.labels(url).set(1)
            logger.info("upstream %s schedules by priority", url)
        else:
            gauge.labels(url).set(0)
            logger.warning(
                "upstream %s schedules by %r: it ignores the allocator's priorities; "
                "start it with --scheduling-policy priority",
                url,
                policy,
            )
    return dict(zip(urls, policies, strict=True))
