"""What a drill cluster is made of: its timings, its pools and the replicas' config.

The timings are short, as docs/design.md §18 allows for tests; ``STALL_BUDGET_S`` is the
etcd stall an owner must survive with the same epoch. Every drill module takes these values
from here, so the nemeses, the ledger's checks and the replicas' config agree.
"""

from __future__ import annotations

from pathlib import Path

from fairshare import apportion

LEASE_TTL_S = 2.0
HALF_LIFE_S = 30 * 24 * 3600.0
MAX_REQUEST_S = 6.0
SESSION_TTL_S = 4.0
"""Below MAX_REQUEST_S, so a dead gateway's grants (and, after a failover, its phantoms)
end when its holder session lapses, sooner than max_request_s; the least a config allows
with these timings is 3 x forward_deadline_s = 3 s."""
FENCE_MARGIN_S = 0.5
RPC_TIMEOUT_S = 0.25
KEEPALIVE_INTERVAL_S = 0.5
STALL_BUDGET_S = LEASE_TTL_S - FENCE_MARGIN_S - KEEPALIVE_INTERVAL_S
"""The etcd stall an owner must survive with the same epoch whatever its phase (docs/ha.md,
"Stall budget"): the last acknowledged renewal was sent up to one renewal interval before
the stall began, and the owner may decide for ``T - margin`` after that."""

"""The replicas' test-only wall-clock hook: a file holding seconds added to wall time."""

POOLS: dict[str, dict[str, float]] = {
    "gpu-a": {"inst-a": 0.8125, "inst-b": 0.1875},
    "gpu-b": {"research": 0.5, "product": 0.25, "eval": 0.25},
}
CAPACITY = {"gpu-a": 10, "gpu-b": 8}
RESERVED = {p: apportion(CAPACITY[p], s.keys(), s) for p, s in POOLS.items()}


ADMIN_TOKEN = "drill-admin-token"
GRANT_KEY = "drill-grant-key-shared-by-every-replica"


def drill_config(
    token_file: Path, key_file: Path, *, max_request_s: float = MAX_REQUEST_S
) -> dict[str, object]:
    """The replicas' YAML config: short timings, as docs/design.md §18 allows for tests."""
    return {
        "admin": {"token_file": str(token_file)},
        "grants": {"key_file": str(key_file)},
        "timing": {
            "lease_ttl_s": LEASE_TTL_S,
            "keepalive_interval_s": KEEPALIVE_INTERVAL_S,
            "rpc_timeout_s": RPC_TIMEOUT_S,
            "fence_margin_s": FENCE_MARGIN_S,
            "snapshot_interval_s": 0.5,
            "commit_window_s": 0.001,
            "campaign_delay_s": 0.3,
            "degraded_after_s": 0.2,
            "forward_deadline_s": 1.0,
            "release_memory_s": 600.0,
            "session_ttl_s": SESSION_TTL_S,
        },
        "pools": [
            {
                "name": name,
                "capacity": CAPACITY[name],
                "shares": shares,
                "half_life_s": HALF_LIFE_S,
                "max_request_s": max_request_s,
                "degraded_mode": "fail_open",
            }
            for name, shares in POOLS.items()
        ],
    }
