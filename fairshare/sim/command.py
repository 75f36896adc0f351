"""``fairshare simulate``: run scenarios, write plots and a markdown report.

``python -m fairshare.sim --scenario all --out docs/simulation`` writes the PNG files into
``docs/simulation/`` and the report to ``docs/simulation.md`` (``--markdown`` to choose).

With ``--allocator HOST:PORT`` the fairshare run of one scenario takes its priorities from
a running allocator over gRPC instead of an in-process pool (``fairshare.sim.remote``: the
pool it needs, the admin token of ``elastic``, why the figures are not comparable with
the in-process ones). ``failover`` is in-process only.

Exit status: 0; 1 when a target is missed (``--check``) or an allocator call fails; 2 on
a usage error, an allocator whose pool does not fit the scenario, or no matplotlib to draw
the plots with (checked before any scenario runs).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fairshare.errors import AllocatorError
from fairshare.sim.allocators import SetupError
from fairshare.sim.scenarios import SCENARIOS, ScenarioResult

EXIT_FAILED = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairshare simulate",
        description="Simulate vLLM's priority scheduler fed by fairshare priorities.",
    )
    parser.add_argument(
        "--scenario",
        required=True,
        choices=[*SCENARIOS, "all"],
        help="the scenario to run, or all of them",
    )
    parser.add_argument("--out", required=True, type=Path, help="directory for the PNG plots")
    parser.add_argument(
        "--markdown",
        type=Path,
        default=None,
        help="report to write (default: the --out directory's name with .md, beside it)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiplies the simulated horizon (default 1.0)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 if a scenario misses a target",
    )
    remote = parser.add_argument_group(
        "priorities from a running allocator (one scenario, not failover)"
    )
    remote.add_argument(
        "--allocator",
        metavar="HOST:PORT",
        help="take the fairshare run's priorities from this allocator over gRPC",
    )
    remote.add_argument(
        "--pool",
        help="the allocator's pool to use (default: the scenario's name)",
    )
    remote.add_argument(
        "--token-file",
        help="admin bearer token file: needed by scenarios that call set_capacity (elastic)",
    )
    return parser


def _command(args: argparse.Namespace) -> str:
    parts = ["python -m fairshare.sim", f"--scenario {args.scenario}", f"--out {args.out}"]
    if args.seed != 1:
        parts.append(f"--seed {args.seed}")
    if args.scale != 1.0:
        parts.append(f"--scale {args.scale}")
    if args.allocator:
        parts.append(f"--allocator {args.allocator}")
        if args.pool:
            parts.append(f"--pool {args.pool}")
        if args.token_file:
            parts.append("--token-file FILE")
    return " ".join(parts)


def _run_scenario(name: str, args: argparse.Namespace) -> ScenarioResult:
    """Runs one scenario: in-process, or (``--allocator``) against a running allocator."""
    if not args.allocator:
        return SCENARIOS[name](seed=args.seed, scale=args.scale)
    from fairshare.sim.remote import RemoteSession

    with RemoteSession(args.allocator, pool=args.pool, token_file=args.token_file) as session:
        result = SCENARIOS[name](seed=args.seed, scale=args.scale, fairshare=session)
    session.annotate(result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the scenarios; returns the exit status."""
    from fairshare.sim import report
    from fairshare.sim.plots import PlottingUnavailable, require_matplotlib, write_plots

    parser = _parser()
    args = parser.parse_args(argv)
    if not args.allocator and (args.pool or args.token_file):
        parser.error("--pool and --token-file go with --allocator")
    if args.allocator and args.scenario == "all":
        parser.error(
            "--allocator runs one scenario at a time (each needs its own pool on the "
            "allocator, and failover is in-process only)"
        )
    try:
        require_matplotlib()
    except PlottingUnavailable as e:
        print(f"fairshare simulate: {e}", file=sys.stderr)
        return EXIT_USAGE
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    out: Path = args.out
    markdown: Path = args.markdown or out.parent / f"{out.name}.md"
    sections = []
    results: list[ScenarioResult] = []
    plots = 0
    for name in names:
        started = time.perf_counter()
        try:
            result = _run_scenario(name, args)
        except SetupError as e:
            print(f"fairshare simulate: {name}: {e}", file=sys.stderr)
            return EXIT_USAGE
        except AllocatorError as e:
            print(f"fairshare simulate: {name}: allocator call failed: {e}", file=sys.stderr)
            return EXIT_FAILED
        images = write_plots(result, out)
        plots += len(images)
        sections.append(report.section(result, images, markdown.parent))
        results.append(result)
        elapsed = time.perf_counter() - started
        print(f"{name}: {'all targets met' if result.ok else 'TARGET MISSED'} ({elapsed:.1f} s)")
        for target in result.targets:
            op = "<=" if target.at_most else ">="
            flag = "ok  " if target.met else "MISS"
            print(f"  {flag} {target.text}: {target.value:.3f} {op} {target.bound:.3f}")
        if result.comparisons:
            print(f"  compared with {result.compared} (not checked):")
        for c in result.comparisons:
            print(f"       {c.text}: {c.value:.3f} here, {c.other:.3f} there")
    markdown.parent.mkdir(parents=True, exist_ok=True)
    kept = report.kept_sections(markdown.read_text(encoding="utf-8")) if markdown.exists() else ""
    markdown.write_text(report.document(sections, _command(args)) + kept, encoding="utf-8")
    print(f"wrote {markdown} and {plots} plots in {out}")
    if args.check and not all(r.ok for r in results):
        return 1
    return 0
