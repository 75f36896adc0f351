"""The Grafana dashboard and the alert rules (deploy/observability), offline.

Every query and expression parses (``promql_check``) and names only metrics a service
exports: the allocator's come from ``server.metrics`` with every family populated,
etcd's from a real etcd's ``/metrics``, the gateway's from the ``Counter``/``Gauge``/
``Histogram`` definitions in ``fairshare/gateway/`` (while that package is absent, gateway panels
and rules are not checked against it). Every alert links a runbook section of
docs/operations.md that exists; the PrometheusRule holds exactly the plain rules file's
groups; the kustomization renders the rule and the ConfigMaps of the plain rules and the
dashboard.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from promql_check import PromQLError, metric_names

from harness.etcd import EtcdProcess
from harness.kubectl import kustomize

REPO = Path(__file__).resolve().parents[2]
OBSERVABILITY = REPO / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"
RULES = OBSERVABILITY / "rules.yaml"
PROMETHEUS_RULE = OBSERVABILITY / "prometheus-rules.yaml"
OPERATIONS = REPO / "docs" / "operations.md"
GATEWAY = REPO / "fairshare" / "gateway"

GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$pool": ".*"}
"""What Grafana substitutes in the dashboard's queries, for the parser."""

SUFFIXES = {
    "Counter": ("_total", "_created"),
    "Gauge": ("",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("", "_sum", "_count", "_created"),
}


def allocator_metrics() -> set[str]:
    """Every sample name ``server.metrics`` exports, with every family populated."""
    from fairshare import TeamStat
    from ha.api import Epoch, NodeId, PoolName, PoolStatus
    from server.metrics import Metrics, Outcome

    status = PoolStatus(
        pool=PoolName("p"),
        owned=True,
        owner=NodeId("allocator-0"),
        epoch=Epoch(7),
        transitions=1,
        fence_left_s=3.0,
        snapshot_age_s=0.5,
        teams=[TeamStat("t", 1.0, 1, 1, 0, 10, 1.0, 1.0, 0, 0)],
        degraded_decisions=0,
        within={"t": 1},
    )
    metrics = Metrics(lambda: [status])
    metrics.count("p", "t", Outcome.WITHIN, 0.001, 0)
    metrics.observe_forward("Acquire", 0.001)
    metrics.count_malformed("Acquire")
    metrics.count_limited("max_teams")
    text = generate_latest(metrics.registry).decode()
    return set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, flags=re.MULTILINE))


def gateway_metrics() -> set[str] | None:
    """Every sample name the gateway's code defines; None while ``fairshare/gateway/`` is absent."""
    if not GATEWAY.is_dir():
        return None
    names = set()
    pattern = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*\"(fairshare_gateway_\w+)\"")
    for source in GATEWAY.rglob("*.py"):
        for kind, name in pattern.findall(source.read_text(encoding="utf-8")):
            names |= {name + suffix for suffix in SUFFIXES[kind]}
    return names


@pytest.fixture(scope="module")
def etcd_metrics(etcd_server: EtcdProcess) -> set[str]:
    """Every sample name a real etcd (the version the tests run) exports."""
    with urllib.request.urlopen(f"{etcd_server.client_url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, flags=re.MULTILINE))


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query with Grafana's variables substituted) of every target."""
    found = []
    for panel in panels(dashboard()):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            found.append((panel["title"], expr))
    return found


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def check_names(where: str, expr: str, allocator_and_etcd: set[str]) -> None:
    """Parses ``expr``; fails on a name no service exports (a gateway name is not checked
    while ``fairshare/gateway/`` is absent)."""
    try:
        names = metric_names(expr)
    except PromQLError as e:
        pytest.fail(f"{where}: {e}\n  {expr}")
    assert names, f"{where}: selects no metric: {expr}"
    gateway = gateway_metrics()
    for name in names:
        if name.startswith("fairshare_gateway_"):
            assert gateway is None or name in gateway, f"{where}: the gateway exports no {name}"
        else:
            assert name in allocator_and_etcd, f"{where}: no service exports {name}"


# -- the dashboard -------------------------------------------------------------------------


def test_every_dashboard_query_parses_and_names_exported_metrics(etcd_metrics: set[str]) -> None:
    exported = allocator_metrics() | etcd_metrics
    queries = dashboard_queries()
    assert len(queries) >= 20
    for title, expr in queries:
        check_names(f"panel {title!r}", expr, exported)
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            (name,) = re.findall(r"label_values\((\w+),", variable["definition"])
            assert name in exported


def test_the_dashboard_shows_what_operators_ask_first() -> None:
    """Pools and owners, decisions by standing and priority, degraded decisions,
    phantoms, in flight and within share vs reservation, usage and rank, failovers, etcd
    write latency, and the gateway's request rates and time to first token."""
    used = set().union(*(metric_names(expr) for _, expr in dashboard_queries()))
    assert used >= {
        "fairshare_owner",
        "fairshare_epoch",
        "fairshare_decisions_total",
        "fairshare_decision_priorities_total",
        "fairshare_degraded_decisions_total",
        "fairshare_phantoms",
        "fairshare_in_flight",
        "fairshare_reserved",
        "fairshare_within",
        "fairshare_usage",
        "fairshare_rank",
        "fairshare_ownership_transitions_total",
        "etcd_disk_wal_fsync_duration_seconds_bucket",
        "fairshare_gateway_requests_total",
        "fairshare_gateway_time_to_first_token_seconds_bucket",
    }


def test_the_dashboard_is_well_formed_for_grafana() -> None:
    board = dashboard()
    assert board["uid"] == "fairshare" and board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(board):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            # One data source, the dashboard's variable: importable into any Grafana.
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert {t["refId"] for t in panel["targets"]} == {
                chr(65 + i) for i in range(len(panel["targets"]))
            }


# -- the alert rules -----------------------------------------------------------------------


def test_every_alert_expression_parses_and_names_exported_metrics(
    etcd_metrics: set[str],
) -> None:
    exported = allocator_metrics() | etcd_metrics
    for rule in alerts():
        check_names(f"alert {rule['alert']}", rule["expr"], exported)
        if "for" in rule:
            assert re.fullmatch(r"(\d+[smh])+", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_the_alerts_cover_what_pages_an_operator() -> None:
    names = {rule["alert"] for rule in alerts()}
    assert len(names) == len(alerts()), "alert names must be unique"
    assert names >= {
        "FairsharePoolWithoutOwner",
        "FairshareDegradedDecisions",
        "FairsharePendingReleasesGrowing",
        "FairsharePhantomsNotDraining",
        "FairshareFencingDeadlineClose",
        "FairshareStoreFull",
        "FairshareEtcdErrors",
        "FairshareEtcdNearQuota",
        "FairshareTeamStarved",
    }


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``."""
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_every_alert_links_its_runbook_in_the_operations_guide() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    known = anchors(text)
    for rule in alerts():
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md", f"{rule['alert']}: {url}"
        assert anchor in known, f"{rule['alert']}: docs/operations.md has no #{anchor}"
        # The section names the alert and says what it means and what to do.
        section = text.split(f"### {rule['alert']}\n", 1)[1].split("\n### ", 1)[0]
        for part in ("**Means:**", "**Check:**", "**Do:**"):
            assert part in section, f"runbook of {rule['alert']} lacks {part}"


def test_the_prometheus_rule_holds_the_plain_rules_file() -> None:
    (manifest,) = yaml.safe_load_all(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["metadata"]["name"] == "fairshare"
    assert manifest["metadata"]["labels"]["app.kubernetes.io/part-of"] == "fairshare"
    assert manifest["spec"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in manifest["spec"]["groups"]:
        assert set(group) == {"name", "rules"}
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule


def test_the_kustomization_renders_the_rule_and_the_dashboard() -> None:
    rendered = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for doc in yaml.safe_load_all(kustomize(OBSERVABILITY))
    }
    assert set(rendered) == {
        ("PrometheusRule", "fairshare"),
        ("ConfigMap", "fairshare-grafana-dashboard"),
        ("ConfigMap", "fairshare-prometheus-rules"),
    }
    board = rendered["ConfigMap", "fairshare-grafana-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["grafana-dashboard.json"]) == dashboard()
    plain = rendered["ConfigMap", "fairshare-prometheus-rules"]["data"]["rules.yaml"]
    assert yaml.safe_load(plain) == yaml.safe_load(RULES.read_text(encoding="utf-8"))
    assert {doc["metadata"]["namespace"] for doc in rendered.values()} == {"fairshare"}
