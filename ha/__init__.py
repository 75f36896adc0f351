"""ha: the replication layer (ownership, forwarding, persistence, failover; asyncio).

What the service (``server``) may use, and all it may use (an import contract keeps it to
these names): a replica is made with ``open_node`` and answers through the ``Allocator``
protocol, with the records, ids and errors of ``ha.api``; pools and timings are
``PoolConfig`` and ``Timing`` (``ha.settings``); the cluster's grant keys are read with
``GrantKeys``; etcd access is described by ``EtcdAccess``.

Inside, the rooms stand in layers (another contract): ``ha.node`` on top, then
``ha.routing``, ``ha.stubs``, ``ha.cluster`` (lease, members, ownership, handover),
``ha.owned`` (one owned pool and its tables, its writes and restore), ``ha.store`` (the
store contract and its implementations), and under them all ``ha.grantkeys``,
``ha.settings``, ``ha.clock`` and ``ha.api``.
"""

from ha.api import (
    Allocator,
    AllocatorError,
    Decision,
    MemberStatus,
    NodeId,
    Peers,
    PoolInfo,
    PoolStatus,
    PoolView,
    StoreUnavailable,
)
from ha.grantkeys import GrantKeys, KeyFileError
from ha.node import open_node
from ha.settings import (
    MAX_CAPACITY,
    ConfigError,
    DegradedMode,
    PoolConfig,
    Timing,
    UnknownTeams,
    WaitEnd,
)
from ha.store.etcd import EtcdAccess
from ha.store.etcd.connection import is_tls

__all__ = [
    "MAX_CAPACITY",
    "Allocator",
    "AllocatorError",
    "ConfigError",
    "Decision",
    "DegradedMode",
    "EtcdAccess",
    "GrantKeys",
    "KeyFileError",
    "MemberStatus",
    "NodeId",
    "Peers",
    "PoolConfig",
    "PoolInfo",
    "PoolStatus",
    "PoolView",
    "StoreUnavailable",
    "Timing",
    "UnknownTeams",
    "WaitEnd",
    "is_tls",
    "open_node",
]
