"""Which store a node runs on: etcd when it is given endpoints (replicated), else the file
store in its state dir (embedded).

Guarantees: an etcd that does not answer at start is no error: the store returned then
connects when etcd answers (the node joins in the background); one that refuses this
node's TLS or credentials is (waiting does not cure it). A file store that cannot be
opened says why in one ``StoreUnavailable`` that names the file.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Sequence

from ha.clock import Clock
from ha.store.contract import Store, StoreUnavailable
from ha.store.etcd import AccessRefused, EtcdAccess, connect
from ha.store.file import FileStore

logger = logging.getLogger(__name__)


async def open_store(
    *,
    node_id: str,
    state_dir: pathlib.Path,
    etcd_endpoints: Sequence[str],
    rpc_timeout_s: float,
    etcd_access: EtcdAccess | None,
    clock: Clock,
) -> Store:
    """The store of node ``node_id`` (see module).

    Raises:
        StoreUnavailable: embedded, the state dir is not a directory, its disk is full or
            a record is corrupt (the message names the file).
        AccessRefused: etcd refused the TLS handshake, the password or a permission.
    """
    if not etcd_endpoints:
        # The store first: it names what is wrong with the state dir (not a directory,
        # full, corrupt) in one StoreUnavailable.
        return FileStore(state_dir, clock)
    # Seeded by the node id: replicas start on different members, each on the same one
    # every time it starts.
    try:
        return await connect(
            etcd_endpoints, rpc_timeout_s=rpc_timeout_s, seed=node_id, access=etcd_access
        )
    except AccessRefused:
        raise
    except StoreUnavailable as e:
        # Not there yet (a first install, an outage): the node starts anyway and joins
        # once etcd answers (Node.start).
        logger.warning("node %s: etcd does not answer at start: %s", node_id, e)
        return await connect(
            etcd_endpoints,
            rpc_timeout_s=rpc_timeout_s,
            seed=node_id,
            access=etcd_access,
            lazy=True,
        )
