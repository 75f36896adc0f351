"""PNG plots of scenarios (matplotlib with the Agg backend), one figure per question.

``write_plots`` draws every plot a ``ScenarioResult`` has data for into a directory and
returns the files, which ``fairshare.sim.report`` links into the markdown report. Each
``plot_*`` function draws one figure from the result alone and writes it to the path given.

matplotlib is imported inside the functions that draw, so ``sim`` imports without it; it
comes with the ``sim`` (and ``dev``) extra. Without it, ``require_matplotlib`` and every
plotting function raise ``PlottingUnavailable``, whose message names the extra.

Guaranteed: the same result draws the same figures (nothing random; the styles and colours
follow the order of the teams and runs). Not guaranteed: byte-identical PNG files across
matplotlib versions, or anything drawn on a display (Agg only).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from fairshare.sim.report import fmt
from fairshare.sim.scenarios.result import ScenarioResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 90
_STYLES = ["-", "--", ":"]


class PlottingUnavailable(Exception):
    """matplotlib is not installed, so no plot can be drawn; the message says what to install."""


def _pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlottingUnavailable(
            "the plots need matplotlib, which is not installed: install the sim extra "
            "(pip install 'fairshare[sim]')"
        ) from e
    return plt


def require_matplotlib() -> None:
    """Raises ``PlottingUnavailable`` now if the plots cannot be drawn (before a long run)."""
    _pyplot()


def _figure(width: float = 8.0, height: float = 4.2) -> tuple[Figure, Axes]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(width, height), dpi=DPI)
    return fig, ax


def _save(fig: Figure, path: Path) -> Path:
    plt = _pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _colors(teams: Sequence[str]) -> dict[str, str]:
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    return {team: palette[i % len(palette)] for i, team in enumerate(teams)}


def _decorate_time(ax: Axes, result: ScenarioResult) -> None:
    if result.window is not None:
        ax.axvspan(*result.window, color="0.88", zorder=0, label="failover window")
    for i, (t, label) in enumerate(result.marks):
        ax.axvline(t, color="0.4", linewidth=0.8, linestyle="-.", zorder=1)
        ax.annotate(
            label,
            (t, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12 - 11 * i),
            textcoords="offset points",
            fontsize=8,
            color="0.3",
        )


def plot_served(result: ScenarioResult, path: Path) -> Path:
    """Each team's part of the slot-seconds served over time, for every run.

    Bold: cumulative since the start; faint: per time bin (first run only), which shows
    how borrowed capacity swings between teams as their fairshare order changes.
    """
    teams = list(result.shares)
    colors = _colors(teams)
    fig, ax = _figure()
    first_label, first = next(iter(result.runs.items()))
    bin_s = max(10.0, first.horizon_s / 60)
    for i, (label, run) in enumerate(result.runs.items()):
        mids, series = run.served_series(teams, bin_s)
        totals = [math.fsum(series[t][k] for t in teams) for k in range(len(mids))]
        grand = list(itertools.accumulate(totals))
        for team in teams:
            if i == 0:
                per_bin = [
                    100 * v / tot if tot > 0 else math.nan
                    for v, tot in zip(series[team], totals, strict=True)
                ]
                ax.plot(mids, per_bin, "-", color=colors[team], linewidth=0.7, alpha=0.35)
            cumulative = [
                100 * v / tot if tot > 0 else math.nan
                for v, tot in zip(itertools.accumulate(series[team]), grand, strict=True)
            ]
            ax.plot(
                mids,
                cumulative,
                _STYLES[i % len(_STYLES)],
                color=colors[team],
                linewidth=2.0 if i == 0 else 1.4,
                label=f"{team} ({label})",
            )
    for team in teams:
        ax.axhline(
            100 * result.shares[team],
            color=colors[team],
            linewidth=0.8,
            alpha=0.7,
            linestyle=(0, (1, 3)),
        )
    _decorate_time(ax, result)
    if result.name == "elastic":
        cap = ax.twinx()
        times = [t for t, _ in first.capacity_log] + [first.horizon_s]
        values = [c for _, c in first.capacity_log]
        cap.step(times, [*values, values[-1]], where="post", color="black", linewidth=1.2)
        cap.set_ylabel("capacity C (requests, black step)")
        cap.set_ylim(0, max(values) * 1.6)
    ax.set_title(f"{result.title}: part of the service each team received")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("part of the slot-seconds served (%)")
    ax.set_ylim(0, 119)
    ax.legend(
        fontsize=7,
        ncol=len(result.runs),
        loc="upper right",
        title=(
            f"bold: cumulative since 0 s; faint: {first_label} per {bin_s:.0f} s; dotted: share"
        ),
        title_fontsize=7,
    )
    return _save(fig, path)


def plot_waits(result: ScenarioResult, path: Path) -> Path:
    """Distribution (CDF) of queueing delays per team, fairshare against the comparison."""
    teams = list(result.shares)
    colors = _colors(teams)
    fig, ax = _figure()
    floor = 0.01
    for style, (label, run) in zip(_STYLES, result.runs.items(), strict=False):
        for team in teams:
            waits = sorted(max(floor, w) for w in run.waits(team))
            if not waits:
                continue
            ys = [100 * (i + 1) / len(waits) for i in range(len(waits))]
            ax.step(waits, ys, style, where="post", color=colors[team], label=f"{team} ({label})")
    ax.set_xscale("log")
    ax.set_title(f"{result.title}: queueing delay (arrival to first start)")
    ax.set_xlabel(f"queueing delay (s, log scale; below {floor} s drawn at {floor} s)")
    ax.set_ylabel("requests that waited at most this long (%)")
    ax.set_ylim(0, 101)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    return _save(fig, path)


def plot_wait_series(result: ScenarioResult, path: Path) -> Path:
    """Queueing delay of each request against its arrival time, around the failover."""
    teams = [t for t in result.shares if t != next(iter(result.shares))]
    assert result.window is not None
    lo, hi = result.window[0] - 120.0, result.window[1] + 120.0
    fig, axes = _subplots(len(teams))
    markers = ["o", "x", "."]
    floor = 0.01
    for ax, team in zip(axes, teams, strict=True):
        for marker, (label, run) in zip(markers, result.runs.items(), strict=False):
            points = [
                (r.arrival_s, max(floor, r.wait_s(run.horizon_s)))
                for r in run.requests
                if r.team == team and lo <= r.arrival_s < hi
            ]
            ax.scatter(
                [p[0] for p in points],
                [p[1] for p in points],
                s=10,
                marker=marker,
                alpha=0.7,
                label=label,
            )
        _decorate_time(ax, result)
        ax.set_yscale("log")
        ax.set_title(f"team {team}: queueing delay of each request around the failover")
        ax.set_ylabel("queueing delay (s, log)")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel(
        f"arrival time (s); delays below {floor} s drawn at {floor} s, "
        "never started: wait until the end of the run"
    )
    return _save(fig, path)


def _subplots(n: int) -> tuple[Figure, list[Axes]]:
    plt = _pyplot()
    fig, axes = plt.subplots(n, 1, figsize=(8.0, 3.2 * n), dpi=DPI, sharex=True, squeeze=False)
    return fig, [row[0] for row in axes]


def plot_preemptions(result: ScenarioResult, path: Path) -> Path:
    """Preemptions per team, one bar per run: within-share victims hatched at the bottom,
    borrowers above them; the label is the total."""
    teams = list(result.shares)
    fig, ax = _figure(7.0, 3.8)
    runs = list(result.runs.items())
    width = 0.8 / len(runs)
    for i, (label, run) in enumerate(runs):
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(teams))]
        within = [run.within_preemptions.get(team, 0) for team in teams]
        borrowing = [
            run.preemptions.get(team, 0) - w for team, w in zip(teams, within, strict=True)
        ]
        color = f"C{i % 10}"
        ax.bar(xs, within, width, color=color, hatch="///", edgecolor="white", linewidth=0)
        bars = ax.bar(xs, borrowing, width, bottom=within, color=color, label=label)
        ax.bar_label(
            bars, labels=[str(w + b) for w, b in zip(within, borrowing, strict=True)], fontsize=7
        )
    ax.set_xticks(range(len(teams)), teams)
    ax.set_title(f"{result.title}: KV-cache preemptions per team")
    ax.set_xlabel("team (hatched: victims granted within share; in FCFS runs vLLM ignores it)")
    ax.set_ylabel("preemptions (requests re-prefilled)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _group_key(group: str) -> str:
    """``k = 16`` -> ``k16``: how the figures name a group of series."""
    return group.replace(" ", "").replace("=", "")


def plot_series(result: ScenarioResult, path: Path) -> Path:
    """Distributions (CDF) of ``result.series``, one panel per group.

    A series labelled ``GROUP: NAME`` is drawn in the panel of GROUP; FCFS series (a name
    starting with ``FCFS``) dashed. When the figures hold ``<group>_mean_service_s``
    (``k = 4`` -> ``k4_mean_service_s``), a vertical line marks one mean service time.
    """
    groups: dict[str, list[tuple[str, list[float]]]] = {}
    for label, values in result.series.items():
        group, _, name = label.partition(": ")
        groups.setdefault(group, []).append((name, values))
    fig, axes = _subplots(len(groups))
    floor = 0.01
    for ax, (group, members) in zip(axes, groups.items(), strict=True):
        for i, (name, values) in enumerate(members):
            if not values:
                continue
            waits = sorted(max(floor, w) for w in values)
            ys = [100 * (j + 1) / len(waits) for j in range(len(waits))]
            style = "--" if name.startswith("FCFS") else "-"
            ax.step(waits, ys, style, where="post", color=f"C{i % 10}", label=name)
        mean_s = result.figures.get(f"{_group_key(group)}_mean_service_s")
        if mean_s is not None:
            ax.axvline(mean_s, color="0.3", linewidth=0.9, linestyle="-.")
            ax.annotate(
                "one mean service time",
                (mean_s, 3),
                xytext=(3, 0),
                textcoords="offset points",
                fontsize=7,
                color="0.3",
            )
        ax.set_xscale("log")
        ax.set_ylim(0, 101)
        ax.set_title(f"{group}: small's within-share queueing delay, by router")
        ax.set_ylabel("requests (%)")
        ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel(f"queueing delay (s, log scale; below {floor} s drawn at {floor} s)")
    return _save(fig, path)


ZOOM_S = 60.0
"""The holdings plot draws the first minute of the run beside the whole of it."""


def plot_holdings(result: ScenarioResult, path: Path) -> Path:
    """Each team's within-share requests held over time, one row per team: the whole run
    on the left, its first ``ZOOM_S`` seconds on the right. One line per run of
    ``result.holdings`` (the first solid, the others dashed); the team's requests in
    flight faint; its reservation (``reserved_<team>`` of the figures) dotted."""
    plt = _pyplot()
    teams = list(result.shares)
    fig, axes = plt.subplots(
        len(teams),
        2,
        figsize=(9.0, 2.6 * len(teams) + 0.8),
        dpi=DPI,
        sharey="row",
        squeeze=False,
        gridspec_kw={"width_ratios": [3, 1]},
    )
    every_s = next(iter(result.holdings.values())).every_s
    for (whole, zoom), team in zip(axes, teams, strict=True):
        top = 1
        for i, (label, held) in enumerate(result.holdings.items()):
            style = "-" if i == 0 else "--"
            color = f"C{i % 10}"
            lines = [
                (held.within[team], f"within share: {label}", {}),
                (held.in_flight[team], f"in flight: {label}", {"linewidth": 0.7, "alpha": 0.4}),
            ]
            for ax in (whole, zoom):
                for values, name, thin in lines:
                    ax.step(
                        held.times, values, style, where="post", color=color, label=name, **thin
                    )
            top = max(top, *held.in_flight[team])
        reserved = result.figures.get(f"reserved_{team}")
        for ax in (whole, zoom):
            if reserved is not None:
                ax.axhline(reserved, color="0.3", linewidth=0.9, linestyle=":", label="reservation")
        _decorate_time(whole, result)
        whole.set_ylim(0, top * 1.1)
        zoom.set_xlim(0, ZOOM_S)
        whole.set_title(f"team {team}: requests in flight, and of them within share")
        zoom.set_title("the first minute")
        whole.set_ylabel("requests")
    axes[-1][0].set_xlabel(f"simulated time (s), sampled every {fmt(every_s)} s")
    axes[-1][1].set_xlabel("simulated time (s)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_lend_sweep(result: ScenarioResult, path: Path) -> Path:
    """What a lending limit buys and costs, against the lend fraction (``result.sweep``),
    read from the figures of each run (its prefix) and of the run without a lending limit
    (``unlimited_``). The first team of ``result.shares`` is the one whose lend fraction
    is swept, the second the team that floods.

    Top: the first team's within-share p99 and longest wait, with one scheduler step
    (``step_s``). Bottom: the pool's utilization and the flood's throughput (as a part of
    the one without a lending limit). Dashed: the run without a lending limit.
    """
    arriving, flooding = list(result.shares)[:2]
    figures = result.figures
    xs = [x for x, _ in result.sweep]

    def series(key: str, scale: float = 1.0) -> list[float]:
        return [figures[f"{prefix}{key}"] * scale for _, prefix in result.sweep]

    fig, (waits, costs) = _subplots(2)
    for key, label, style, color in (
        ("within_p99_wait_s", "p99", "-o", "C0"),
        ("within_max_wait_s", "longest", ":s", "C4"),
    ):
        waits.plot(xs, series(key), style, color=color, label=label)
        waits.axhline(
            figures[f"unlimited_{key}"],
            color=color,
            linestyle="--",
            linewidth=0.8,
            label=f"{label}, no lending limit",
        )
    waits.axhline(figures["step_s"], color="0.3", linestyle="-.", linewidth=0.9)
    waits.annotate(
        f"one scheduler step ({1000 * figures['step_s']:.0f} ms)",
        (xs[0], figures["step_s"]),
        xytext=(0, 3),
        textcoords="offset points",
        fontsize=7,
        color="0.3",
    )
    waits.set_title(f"{arriving}'s within-share wait (arrival to first start)")
    waits.set_ylabel("wait (s)")
    waits.set_ylim(bottom=0)
    waits.legend(fontsize=7, loc="upper right")
    throughput = 100 / figures["unlimited_flood_per_min"]
    for i, (key, label, scale) in enumerate(
        (
            ("utilization_pct", "the pool's utilization (% of C)", 1.0),
            ("flood_per_min", f"{flooding}'s throughput (% of no lending limit)", throughput),
        )
    ):
        color = f"C{i + 1}"
        costs.plot(xs, series(key, scale), "-o", color=color, label=label)
        costs.axhline(
            figures[f"unlimited_{key}"] * scale, color=color, linestyle="--", linewidth=0.8
        )
    costs.set_title("what the flood's borrowers lose (dashed: no lending limit)")
    costs.set_ylabel("%")
    costs.set_ylim(0, 105)
    costs.legend(fontsize=7, loc="lower left")
    costs.set_xlabel(f"{arriving}'s lend fraction (of its idle reserved slots lent to borrowers)")
    costs.invert_xaxis()  # sharex: both panels run from lending all to lending none
    return _save(fig, path)


def write_plots(result: ScenarioResult, out_dir: Path) -> list[Path]:
    """Draws every plot of ``result`` into ``out_dir``; returns the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    if result.sweep:
        paths.append(plot_lend_sweep(result, out_dir / f"{result.name}.png"))
    paths.append(plot_served(result, out_dir / f"{result.name}-served.png"))
    if result.series:
        paths.append(plot_series(result, out_dir / f"{result.name}-routers.png"))
    if result.holdings:
        paths.append(plot_holdings(result, out_dir / f"{result.name}-within.png"))
    if result.wait_series:
        paths.append(plot_wait_series(result, out_dir / f"{result.name}-waits.png"))
    else:
        paths.append(plot_waits(result, out_dir / f"{result.name}-waits.png"))
    paths.append(plot_preemptions(result, out_dir / f"{result.name}-preemptions.png"))
    return paths
