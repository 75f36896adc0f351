"""Real processes for tests, drills and benchmarks: etcd members and clusters
(``harness.etcd``, ``harness.etcd_cluster``), allocator processes (``harness.serve``),
``fairshare gateway`` processes (``harness.gateway``), TCP proxies that cut and heal
(``harness.proxy``) and loopback ports (``harness.net``).

Not shipped: the wheel leaves this package out, and no shipped package imports it (an
import contract says so). Importable from the repository root: pytest puts the root on
the path (``pythonpath`` in pyproject.toml), and ``python -m bench.<name>`` run from the
root has it there.
"""
