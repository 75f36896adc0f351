"""The store contract over etcd 3.4, with the ``aetcd`` asyncio client (replicated mode).

Guarantees (beyond those of ``ha.store.contract``):

- Every call has one deadline, enforced both as the gRPC deadline and around the awaited
  call: ``rpc_timeout_s``, or the caller's ``timeout_s`` for ``put_fenced`` and
  ``delete_fenced``. A transaction that got no answer may or may not have been applied,
  so it raises ``StoreUnavailable`` and the caller re-reads (a blind retry of a lost
  ``create`` could report a race lost to itself). The one write sent again is
  ``put_fenced``: within its budget, after its endpoint failed (connection lost, no
  leader, or no answer to one attempt while other endpoints remain), since the same
  value under the same fence leaves the same state however often it is applied.
- etcd and gRPC errors are translated in one table (``ha.store.etcd.errors``): connection
  refused, no leader, deadline exceeded → ``StoreUnavailable``; NOSPACE ("database space
  exceeded") → ``StoreFull``; lease not found → ``LeaseNotFound``; a request etcd calls
  malformed → ``ValueError`` (a bug here).
- Every call requires a leader (etcd's ``hasleader`` metadata): a member cut off from its
  quorum refuses calls at once, and ends the watches open on it after three election
  timeouts without a leader; both move the store to the next endpoint.
- Endpoints are tried at ``connect`` in an order shuffled by the caller's seed, so
  replicas spread over the members. Later, a connection error, a deadline or "no leader"
  moves the store to the next endpoint for the calls that follow. Idempotent calls
  (reads, keepalive, revoke) try the next endpoint within the same deadline; writes
  raise (``put_fenced`` excepted, see above). With one endpoint gRPC reconnects the same
  channel, its backoff bounded at 1 s.
- A watch resumes by itself after its stream is lost: it watches again from the
  revision after the last event it delivered, so etcd replays what was missed. Only when
  that revision has been compacted does it emit a ``RESET`` with the prefix as listed at
  a fresh revision, then continue from there. Resumes back off from 50 ms to 1 s.
- Lease TTLs are whole seconds in etcd: ``grant_lease`` rounds up, minimum 1 s (etcd
  may raise it to its own minimum, 1.5 election timeouts).

- ``https://`` endpoints are TLS, with a client certificate if one is given; with a
  username the store authenticates, and fetches a new token when etcd refuses the old
  one (simple tokens expire), then sends the refused call again (``ha.store.etcd.client``).

- Rotated certificates, key or password reach the calls that follow when the access
  carries a ``reload`` (the server's follows the files, ``server.etcd_access``).

Non-guarantees: a watch on a
member that is paused but keeps its TCP connection open notices only through gRPC
keepalive pings (every 10 s, the fastest etcd's default server policy accepts).

Modules: ``store`` (``EtcdStore`` and ``connect``: what each operation sends),
``connection`` (endpoints, deadlines and failover), ``client`` (aetcd's client over a
channel built here: TLS, require-leader metadata, auth tokens),
``watch`` (the watch that resumes on another member), ``errors`` (the translation table),
``messages`` (etcd's messages to and from the store's values). Import from here.
"""

from ha.store.etcd.client import EtcdAccess
from ha.store.etcd.connection import parse_endpoint
from ha.store.etcd.errors import AccessRefused
from ha.store.etcd.store import EtcdStore, connect

__all__ = ["AccessRefused", "EtcdAccess", "EtcdStore", "connect", "parse_endpoint"]
