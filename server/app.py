"""``fairshare serve``: one replica's process, from configuration to clean exit.

Start: load the configuration, bind the gRPC port (TLS / mTLS if configured), open the
node (``ha.node.open_node``: embedded single-node mode without etcd endpoints), add the
servicers, health (per service and overall) and reflection, start the node, the server
and the metrics endpoint, then report SERVING. Two interceptors guard the port: the
per-client call limit (``server.intake``) and the bound on open streams
(``server.streams``).

Health (``server.health``): SERVING once started, also before the node has joined the
cluster; ``fairshare.member`` tells membership apart, and each pool has its own service,
NOT_SERVING while the store refuses this replica's writes for the pool for lack of space.

Stop (SIGTERM or SIGINT), in one fixed order: health NOT_SERVING → ``node.stop_deciding()``
→ ``node.close()`` (final snapshot, release ownership) → ``server.stop(grace)`` → exit 0.
Every step is bounded: the whole stop takes at most ``timing.close_bound_s`` +
``GRACE_S`` + 1 s.

A configuration error, or a start-up error of the state (state dir not a directory, disk
full, a corrupt record, etcd refusing the TLS handshake or the credentials), exits with
status 2 and one line naming the key or the file, without a traceback. An etcd that does
not answer is no such error (see Health).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import logging
import pathlib
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from grpc import aio
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fairshare.wire.credentials import read_token
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha import (
    Allocator,
    ConfigError,
    EtcdAccess,
    GrantKeys,
    KeyFileError,
    MemberStatus,
    NodeId,
    Peers,
    PoolConfig,
    StoreUnavailable,
    Timing,
    open_node,
)
from server.auth import AdminAuth
from server.config import Config, load_config
from server.etcd_access import load_etcd_access
from server.health import (
    ADMIN_SERVICE,
    ALLOCATOR_SERVICE,
    MEMBER_SERVICE,
    pool_health_service,
    start_health,
    watch_health,
)
from server.intake import Intake
from server.metrics import Metrics, event_loop_alive
from server.peers import GrpcPeers
from server.servicer import AdminServicer, AllocatorServicer
from server.status_page import StatusPage
from server.status_report import status_report
from server.streams import StreamLimit
from server.tls_reload import peer_credentials, server_credentials

__all__ = [
    "ADMIN_SERVICE",
    "ALLOCATOR_SERVICE",
    "GRACE_S",
    "MEMBER_SERVICE",
    "Node",
    "NodeFactory",
    "RunningServer",
    "add_serve_arguments",
    "configure_logging",
    "overrides_of",
    "pool_health_service",
    "run",
    "serve",
    "start_server",
]

logger = logging.getLogger(__name__)

HEALTH_SERVICE: Final = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
GRACE_S: Final = 5.0
"""How long in-flight RPCs may finish once the server stops."""
EXIT_CONFIG: Final = 2
SWITCH_INTERVAL_S: Final = 0.001
"""How long a busy thread keeps the interpreter when another thread waits for it."""


class Node(Allocator, Protocol):
    """What the server needs of ``ha.node.Node`` beyond the Allocator."""

    async def start(self) -> None:
        """Starts membership, campaigns and background tasks."""
        ...

    async def stop_deciding(self) -> None:
        """Stops deciding for every owned pool (requests then forward or degrade)."""
        ...

    async def close(self) -> None:
        """Writes the final snapshots and releases ownership."""
        ...

    @property
    def joined(self) -> bool:
        """True once the node has joined the cluster (always, once an embedded node has
        started)."""
        ...

    @property
    def node_id(self) -> str:
        """This replica's node id."""
        ...

    def members(self) -> list[MemberStatus]:
        """The replicas of the cluster view, this one first (the status page)."""
        ...


class NodeFactory(Protocol):
    """The signature of ``ha.node.open_node``."""

    def __call__(
        self,
        *,
        node_id: NodeId,
        advertise: str,
        pools: Sequence[PoolConfig],
        timing: Timing,
        state_dir: pathlib.Path,
        etcd_endpoints: Sequence[str],
        etcd_access: EtcdAccess | None,
        prefix: str,
        peers: Peers,
        grant_keys: GrantKeys | None,
    ) -> Awaitable[Node]: ...


@dataclass
class RunningServer:
    """A started replica: its gRPC server, node and metrics."""

    server: aio.Server
    servicer: AllocatorServicer
    port: int
    node: Node
    health: grpc_health.aio.HealthServicer
    metrics: Metrics
    peers: GrpcPeers
    stop_metrics: Callable[[], None] | None = None
    metrics_port: int | None = None
    close_bound_s: float = 10.0
    """The longest ``node.close()`` may take (``timing.close_bound_s``)."""
    health_task: asyncio.Task[None] | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``: where a local client reaches the server."""
        return f"127.0.0.1:{self.port}"

    async def shutdown(self, grace_s: float = GRACE_S) -> None:
        """Stops in the fixed order of docs/design.md §16; safe to call twice.

        Health NOT_SERVING first, so load balancers and clients move away while the node
        can still answer, and the acquire streams end (their clients send their next
        Acquires elsewhere); then the node stops deciding, writes its final snapshot and
        releases ownership; then the server stops, letting in-flight calls finish for
        ``grace_s``.
        """
        if self._stopped:
            return
        self._stopped = True
        logger.info("shutting down: health NOT_SERVING")
        if self.health_task is not None:
            self.health_task.cancel()  # it must not turn a pool SERVING again
        await self.health.enter_graceful_shutdown()
        self.servicer.end_streams()
        try:
            await self.node.stop_deciding()
            logger.info("shutting down: stopped deciding; writing final snapshots")
            # Bounded twice: the node bounds each step itself, and this bounds the node.
            async with asyncio.timeout(self.close_bound_s):
                await asyncio.shield(self.node.close())
        except TimeoutError:
            logger.error(
                "shutting down: the node did not close within %gs; its lease will expire",
                self.close_bound_s,
            )
        except Exception:
            # The server must still stop; a node that cannot close has already lost or
            # will lose ownership when its lease expires.
            logger.exception("shutting down: closing the node failed")
        finally:
            await self.server.stop(grace_s)
            try:
                async with asyncio.timeout(1.0):
                    await self.peers.close()
            except TimeoutError:
                logger.warning("shutting down: closing the peer channels took over 1s")
            if self.stop_metrics is not None:
                self.stop_metrics()
            logger.info("shut down")


def _advertised(config: Config, port: int) -> str:
    """The advertised address with the bound port when port 0 was configured."""
    host, _, configured = config.advertise.rpartition(":")
    return f"{host}:{port}" if configured == "0" else config.advertise


def _admin_token(config: Config) -> str | None:
    """The admin bearer token from ``admin.token_file``, if one is configured.

    Raises:
        ConfigError: the file cannot be read or holds no token.
    """
    if config.admin.token_file is None:
        return None
    try:
        return read_token(config.admin.token_file)
    except (OSError, ValueError) as e:
        raise ConfigError("admin.token_file", str(e)) from e


def _bind(server: aio.Server, config: Config) -> int:
    """Adds the listening port (TLS when configured, following its files: see
    ``server.tls_reload``); returns the port bound.

    Raises:
        ConfigError: a TLS file cannot be read or is not valid, or ``listen`` cannot be
            bound.
    """
    try:
        credentials = server_credentials(config)
    except OSError as e:
        raise ConfigError("tls", f"cannot read a TLS file: {e}") from e
    try:
        if credentials is not None:
            port: int = server.add_secure_port(config.listen, credentials)
        else:
            port = server.add_insecure_port(config.listen)
    except RuntimeError as e:
        raise ConfigError("listen", f"cannot listen on {config.listen}: {e}") from e
    return port


async def _open_node(config: Config, port: int, peers: Peers, factory: NodeFactory) -> Node:
    """Opens the node with the configured grant keys, advertising the bound ``port``.

    Raises:
        ConfigError: the grant key file, or a file of the etcd section, cannot be read
            or is not valid.
    """
    etcd_access = load_etcd_access(config.etcd)
    grant_keys = None
    if config.grants.key_file is not None:
        try:
            grant_keys = GrantKeys.from_file(config.grants.key_file)
        except (OSError, KeyFileError) as e:
            raise ConfigError("grants.key_file", str(e)) from e
    try:
        return await factory(
            node_id=config.node_id,
            advertise=_advertised(config, port),
            pools=config.pools,
            timing=config.timing,
            state_dir=config.state_dir,
            etcd_endpoints=config.etcd.endpoints,
            etcd_access=etcd_access,
            prefix=config.etcd.prefix,
            peers=peers,
            grant_keys=grant_keys,
        )
    except KeyFileError as e:
        raise ConfigError("grants.key_file", str(e)) from e


async def start_server(
    config: Config,
    *,
    node: Node | None = None,
    node_factory: NodeFactory | None = None,
    serve_metrics: bool = True,
) -> RunningServer:
    """Binds, opens the node and starts serving.

    Args:
        config: the loaded configuration.
        node: an already opened node (tests); otherwise ``node_factory`` opens one.
        node_factory: ``ha.node.open_node`` by default.
        serve_metrics: serve ``/metrics``, ``/healthz`` and the status page
            (``server.status_page``) on ``config.metrics_listen`` (if set).

    Returns:
        The running server; call ``shutdown`` to stop it.

    Raises:
        ConfigError: a configured file cannot be read or the port cannot be bound.
    """
    metrics = Metrics(teams={pool.name: pool.shares.keys() for pool in config.pools})
    token = _admin_token(config)
    peers = GrpcPeers(
        credentials=peer_credentials(config),
        admin_token=token,
        observe=metrics.observe_forward,
    )
    intake = Intake(
        on_malformed=metrics.count_malformed,
        on_refused=lambda method: metrics.count_limited("max_calls_per_client"),
    )
    streams = StreamLimit(on_refused=metrics.count_limited)
    metrics.watch_streams(streams.open_streams)
    server = aio.server(
        interceptors=[intake, streams],
        options=[("grpc.so_reuseport", 0), *config.grpc.server_options()],
    )
    port = _bind(server, config)
    if node is None:
        factory = node_factory if node_factory is not None else open_node
        node = await _open_node(config, port, peers, factory)
    metrics.watch(node.status)
    auth = AdminAuth(
        token=token, identities=config.tls.admin_identities, token_file=config.admin.token_file
    )
    servicer = AllocatorServicer(
        node,
        pools=config.pools,
        metrics=metrics,
        peer_identities=config.tls.peer_identities,
        refuse_malformed=intake.refuse_malformed,
    )
    pb_grpc.add_AllocatorServicer_to_server(servicer, server)
    pb_grpc.add_AdminServicer_to_server(AdminServicer(node, auth=auth), server)
    health = grpc_health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (ALLOCATOR_SERVICE, ADMIN_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), server
    )
    running = RunningServer(
        server=server,
        servicer=servicer,
        port=port,
        node=node,
        health=health,
        metrics=metrics,
        peers=peers,
        close_bound_s=config.timing.close_bound_s,
    )
    await node.start()
    await server.start()
    if serve_metrics and config.metrics_listen:
        loop = asyncio.get_running_loop()
        page = StatusPage(loop, functools.partial(status_report, node, config.pools))
        try:
            running.stop_metrics = metrics.serve(
                config.metrics_listen, alive=event_loop_alive(loop), pages=page.pages()
            )
        except OSError as e:
            await running.shutdown(0)
            raise ConfigError(
                "metrics_listen", f"cannot listen on {config.metrics_listen}: {e}"
            ) from e
    await start_health(health, joined=node.joined)
    running.health_task = asyncio.create_task(watch_health(health, node), name="pool-health")
    logger.info(
        "serving %d pools on %s as %s (%s)",
        len(config.pools),
        config.listen if not config.listen.endswith(":0") else f"port {port}",
        config.node_id,
        "embedded" if config.etcd.embedded else f"etcd {','.join(config.etcd.endpoints)}",
    )
    if not node.joined:
        logger.warning("not a member of the cluster yet: answering degraded until etcd answers")
    return running


async def serve(config: Config, *, node_factory: NodeFactory | None = None) -> int:
    """Serves until SIGTERM or SIGINT, then shuts down in order; returns the exit status."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        running = await start_server(config, node_factory=node_factory)
        # What start-up made (modules, descriptors, the grpc machinery) lives as long as the
        # process: leave it out of the collector's full scans, which otherwise pause every
        # call in flight for milliseconds several times a minute under load.
        gc.freeze()
        # Threads that wait for the interpreter while the event loop is busy (grpc's poller;
        # the append thread when the disk is slow) get it within 1 ms, not Python's default
        # 5: their waits end up in the latency of the calls they serve.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            await stop.wait()
            logger.info("signal received; shutting down")
        finally:
            await running.shutdown()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``fairshare serve``."""
    parser.add_argument("--config", required=True, help="YAML configuration file")
    parser.add_argument("--listen", help="gRPC HOST:PORT (default 127.0.0.1:50051)")
    parser.add_argument("--metrics-listen", help="Prometheus HOST:PORT; '' disables")
    parser.add_argument("--state-dir", help="directory of the local state (default ./state)")
    parser.add_argument("--etcd", help="etcd endpoints URL[,URL]; none = embedded mode")
    parser.add_argument("--node-id", help="this replica's id (default: host name)")
    parser.add_argument("--advertise", help="HOST:PORT peers and clients dial")
    parser.add_argument("--prefix", help="etcd key prefix (default /fairshare)")
    parser.add_argument("--etcd-ca-file", help="CA of etcd's certificate (https:// endpoints)")
    parser.add_argument("--etcd-cert-file", help="client certificate presented to etcd")
    parser.add_argument("--etcd-key-file", help="key of --etcd-cert-file")
    parser.add_argument("--etcd-username", help="etcd user (etcd auth enabled)")
    parser.add_argument("--etcd-password-file", help="file holding the etcd user's password")


def overrides_of(args: argparse.Namespace) -> Mapping[str, object]:
    """The configuration overrides given on the command line."""
    return {
        "listen": args.listen,
        "metrics_listen": args.metrics_listen,
        "state_dir": args.state_dir,
        "etcd.endpoints": args.etcd,
        "node_id": args.node_id,
        "advertise": args.advertise,
        "etcd.prefix": args.prefix,
        "etcd.ca_file": args.etcd_ca_file,
        "etcd.cert_file": args.etcd_cert_file,
        "etcd.key_file": args.etcd_key_file,
        "etcd.username": args.etcd_username,
        "etcd.password_file": args.etcd_password_file,
    }


def configure_logging(level: str) -> None:
    """The process's one logging configuration."""
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run(args: argparse.Namespace) -> int:
    """``fairshare serve``: exit 0 after a clean shutdown, 2 on a configuration error."""
    try:
        config = load_config(args.config, overrides=overrides_of(args))
        if not config.pools:
            raise ConfigError("pools", "at least one pool is required")
    except ConfigError as e:
        print(f"fairshare: configuration error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(config.log_level)
    try:
        return asyncio.run(serve(config))
    except ConfigError as e:
        print(f"fairshare: configuration error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreUnavailable as e:
        # The state dir is not a directory, the disk is full, a record is corrupt, or the
        # store cannot be reached: one line naming the file, no traceback.
        print(f"fairshare: cannot start: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except RuntimeError as e:
        logger.error("cannot start: %s", e)
        return 1
