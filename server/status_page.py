"""The status page on the metrics port: ``GET /`` (one self-contained HTML page) and
``GET /api/status.json`` (``server.status_report``).

The HTTP server answers from its own threads; the report reads the node, whose state only
the event loop may touch. So a request schedules the report on the loop
(``run_coroutine_threadsafe``) and waits at most ``REPORT_TIMEOUT_S`` for it; a loop that
does not answer in time gets a 503, never a half-read state. Reports are kept for
``REPORT_CACHE_S`` (a 503 too): any number of open pages cost the loop (and the owners it
forwards to) at most one report per that period, and requests queued behind a blocked
loop do not each wait the full timeout.

The page has no external asset (it works offline and inside a cluster): inline CSS and a
script that fetches ``api/status.json`` every ``REFRESH_MS`` and redraws. Team names come
from clients: the script writes every value as text, never as markup. Both answers are
read-only and carry what ``/metrics`` already exposes (team names, counts); they are
served with the metrics port's settings (plain HTTP on ``metrics_listen``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final

from server.metrics import Page

logger = logging.getLogger(__name__)

PAGE_PATH: Final = "/"
JSON_PATH: Final = "/api/status.json"
REPORT_TIMEOUT_S: Final = 3.0
"""How long a request waits for the event loop to build the report."""
REPORT_CACHE_S: Final = 1.0
"""A report younger than this is served again instead of building a new one."""
REFRESH_MS: Final = 2000
"""How often the page fetches the report again."""

Report = Callable[[], Coroutine[Any, Any, dict[str, Any]]]


class StatusPage:
    """The two answers, callable from any thread (see module)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        report: Report,
        *,
        timeout_s: float = REPORT_TIMEOUT_S,
        cache_s: float = REPORT_CACHE_S,
    ) -> None:
        """``report`` builds the document on ``loop`` (``server.status_report``)."""
        self._loop = loop
        self._report = report
        self._timeout_s = timeout_s
        self._cache_s = cache_s
        self._lock = threading.Lock()  # one report at a time; the others wait and reuse it
        self._cached: tuple[float, Page] | None = None

    def pages(self) -> dict[str, Callable[[], Page]]:
        """Path -> answer, for ``Metrics.serve``."""
        return {PAGE_PATH: self.html, JSON_PATH: self.json}

    def html(self) -> Page:
        """The page itself (static; its script fetches the report)."""
        return "200 OK", "text/html; charset=utf-8", _HTML

    def json(self) -> Page:
        """The report as JSON; 503 with ``{"error": ...}`` when the loop does not build
        it within the timeout or building it failed."""
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self._cache_s:
                return self._cached[1]
            try:
                answer: Page = ("200 OK", _JSON_TYPE, self._build())
            except Exception as e:  # an HTTP thread must answer, whatever the cause
                if not isinstance(e, TimeoutError):
                    logger.exception("status page: building the report failed")
                error = json.dumps({"error": f"no status: {type(e).__name__}: {e}"}).encode()
                answer = ("503 Service Unavailable", _JSON_TYPE, error)
            # A failure is kept too: requests queued behind a blocked loop answer at once.
            self._cached = (time.monotonic(), answer)
            return answer

    def _build(self) -> bytes:
        future = asyncio.run_coroutine_threadsafe(self._report(), self._loop)
        try:
            report = future.result(self._timeout_s)
        except TimeoutError:  # concurrent.futures' is the built-in one since 3.11
            future.cancel()
            raise TimeoutError(
                f"the event loop did not answer within {self._timeout_s:g}s"
            ) from None
        return json.dumps(report, allow_nan=False, separators=(",", ":")).encode()


_JSON_TYPE: Final = "application/json"

_HTML: Final = (
    """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fairshare status</title>
<style>
:root { --fg:#1d2330; --muted:#667085; --line:#e4e7ec; --bg:#f7f8fa; --card:#fff;
  --within:#2e7d32; --borrow:#ef6c00; --phantom:#9e9e9e; --reserved:#1565c0; --bad:#c62828; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
header { display: flex; gap: 1.5em; align-items: baseline; padding: .8em 1.2em;
  background: #1d2330; color: #fff; }
header h1 { font-size: 1.15em; margin: 0; }
header .meta { color: #c8cdd8; }
#state.stale { color: #ffab91; font-weight: 600; }
main, #pools { display: grid; gap: 1em; }
main { padding: 1em 1.2em; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
  padding: .8em 1em; }
h2 { font-size: 1.05em; margin: 0 0 .4em; }
.facts { display: flex; flex-wrap: wrap; gap: .3em 1.4em; color: var(--muted);
  margin-bottom: .6em; }
.facts b { color: var(--fg); font-weight: 600; }
.warn { color: var(--bad) !important; font-weight: 600; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: right; padding: .25em .6em; border-bottom: 1px solid var(--line);
  white-space: nowrap; font-variant-numeric: tabular-nums; }
th { color: var(--muted); font-weight: 500; }
th:first-child, td:first-child { text-align: left; }
td.bar { width: 30%; text-align: left; }
.track { position: relative; height: 14px; background: #eef0f3; border-radius: 3px; }
.track span { position: absolute; top: 0; height: 100%; }
.track .within { background: var(--within); }
.track .borrow { background: var(--borrow); }
.track .phantom { background: var(--phantom); }
.track .reserved { border: 2px solid var(--reserved); background: transparent;
  border-radius: 3px; }
.legend { display: flex; gap: 1em; color: var(--muted); font-size: .9em; margin-top: .4em; }
.legend i { display: inline-block; width: .9em; height: .9em; margin-right: .3em;
  vertical-align: -.1em; border-radius: 2px; }
.empty { color: var(--muted); }
</style>
</head>
<body data-refreshes="0">
<header><h1>fairshare</h1><span class="meta" id="node"></span>
<span class="meta" id="state">loading</span></header>
<main>
<div id="pools"></div>
<section><h2>Replicas</h2>
<table id="replicas"><thead><tr><th>Node</th><th>Address</th><th>Member for</th>
<th>Owns</th><th>Lease left</th></tr></thead><tbody></tbody></table></section>
</main>
<script>
"use strict";
const REFRESH_MS = """
    + str(REFRESH_MS)
    + """;
const HELD_TITLE = "borrowers the owner holds back by the pool's lending limit, waiting " +
  "for a slot (not in flight); \u2013 when the owner did not say";
const WITHIN_TITLE = "the within-share count of the reservation: within-share grants " +
  "and phantoms counted as within; a new request is within share while it is below " +
  "the reservation, so a busy team holds all its reserved slots";
const TITLES = {"Within share": WITHIN_TITLE, "Held": HELD_TITLE};
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}
function num(x, digits) {
  if (x === null || x === undefined) return "\\u2013";
  if (x === "inf") return "\\u221e";
  return Number(x).toLocaleString("en-US", {maximumFractionDigits: digits});
}
function secs(x) { return x === null || x < 0 ? "\\u2013" : num(x, 1) + " s"; }
function fact(label, value, warn) {
  return el("span", warn ? {"class": "warn"} : {}, label + " ", el("b", {}, value));
}
function bar(team, scale) {
  const pct = n => (100 * n / scale).toFixed(2) + "%";
  const track = el("div", {"class": "track"});
  let at = 0;
  for (const [cls, n] of [["within", team.within_grants], ["borrow", team.borrowing],
                          ["phantom", team.phantoms]]) {
    if (n > 0) {
      const s = el("span", {"class": cls});
      s.style.left = pct(at); s.style.width = pct(n); track.append(s); at += n;
    }
  }
  if (team.reserved > 0) {
    const r = el("span", {"class": "reserved"});
    r.style.left = "0"; r.style.width = pct(team.reserved); track.append(r);
  }
  track.title = team.reserved + " reserved, within-share count " + num(team.within) +
    ", in flight " + team.within_grants + " within share and " + team.borrowing +
    " borrowing, " + team.phantoms + " phantoms";
  return track;
}
function within(team) {
  return (team.within === null ? "\u2013" : team.within) + "/" + team.reserved;
}
function pool(p) {
  const facts = el("div", {"class": "facts"},
    fact("capacity", p.capacity), fact("in flight", p.in_flight),
    fact("owner", p.owner ? p.owner + (p.owned_here ? " (here)" : "") : "none", !p.owner),
    fact("epoch", p.epoch), fact("degraded mode", p.degraded_mode),
    fact("state written", p.snapshot_age_s === null ? "\\u2013" :
         p.snapshot_age_s < 0 ? "not yet" :
         p.snapshot_age_s === 0 ? "current" : secs(p.snapshot_age_s) + " behind",
         p.snapshot_age_s > 5),
    fact("degraded decisions", p.degraded_decisions, p.degraded_decisions > 0),
    fact("figures", p.source === "owner" ? "forwarded from the owner" : p.source,
         p.source === "unavailable"));
  if (p.owned_here) facts.append(fact("fence in", secs(p.fence_left_s), p.fence_left_s < 1));
  if (p.store_full) facts.append(fact("store", "FULL", true));
  if (p.error) facts.append(fact("error", p.error, true));
  const body = el("tbody");
  const used = p.teams.reduce((m, t) => Math.max(m, t.reserved, t.in_flight + t.phantoms), 0);
  const scale = Math.max(p.capacity, used, 1);
  for (const t of p.teams) {
    const row = el("tr", {"data-team": t.team});
    const cells = [["team", t.team], ["share", num(t.share, 3)], ["reserved", t.reserved],
      ["within", within(t)], ["borrowing", t.borrowing],
      ["held", t.held === null ? "\u2013" : t.held], ["phantoms", t.phantoms],
      ["usage", num(t.usage, 1)], ["level_fairshare", num(t.level_fairshare, 3)],
      ["rank", t.rank], ["borrow_priority", t.borrow_priority]];
    for (const [field, value] of cells) row.append(el("td", {"data-field": field}, value));
    row.append(el("td", {"class": "bar"}, bar(t, scale)));
    body.append(row);
  }
  if (!p.teams.length) {
    body.append(el("tr", {}, el("td", {"colspan": "12", "class": "empty"}, "no team yet")));
  }
  const head = el("tr", {}, ...["Team", "Share", "Reserved", "Within share", "Borrowing",
    "Held", "Phantoms", "Usage", "Level fairshare", "Rank", "Borrow priority", "Slots"]
    .map(h => el("th", TITLES[h] ? {"title": TITLES[h]} : {}, h)));
  const legend = el("div", {"class": "legend"},
    el("span", {}, el("i", {"style": "border:2px solid var(--reserved)"}), "reserved"),
    el("span", {}, el("i", {"style": "background:var(--within)"}), "within share"),
    el("span", {}, el("i", {"style": "background:var(--borrow)"}), "borrowing"),
    el("span", {}, el("i", {"style": "background:var(--phantom)"}), "phantoms"));
  return el("section", {"data-pool": p.pool}, el("h2", {}, p.pool), facts,
    el("table", {}, el("thead", {}, head), body), legend);
}
function replica(r) {
  const lease = r.lease_left_s === null ? "(its own)" : secs(r.lease_left_s);
  const row = el("tr", {"data-node": r.node}, el("td", {}, r.node), el("td", {}, r.address),
    el("td", {}, r.member_for_s < 0 ? "not a member" : secs(r.member_for_s)),
    el("td", {}, r.pools.join(", ") || "\\u2013"), el("td", {}, lease));
  if (r.member_for_s < 0 || (r.lease_left_s !== null && r.lease_left_s < 1)) {
    row.className = "warn";
  }
  return row;
}
function render(s) {
  document.getElementById("node").textContent =
    "replica " + s.node + (s.joined ? "" : " (not joined)");
  document.getElementById("pools").replaceChildren(...s.pools.map(pool));
  document.querySelector("#replicas tbody").replaceChildren(...s.replicas.map(replica));
  const state = document.getElementById("state");
  state.className = "";
  state.textContent = "updated " + new Date(s.time * 1000).toLocaleTimeString();
  document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes) + 1);
}
async function refresh() {
  try {
    const reply = await fetch("api/status.json", {cache: "no-store"});
    const s = await reply.json();
    if (!reply.ok) throw new Error(s.error || reply.statusText);
    render(s);
  } catch (e) {
    const state = document.getElementById("state");
    state.className = "stale";
    state.textContent = "stale: " + e.message;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}
refresh();
</script>
</body>
</html>
"""
).encode()
