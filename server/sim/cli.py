"""``fairshare simulate``: run scenarios, write plots and a markdown report.

``python -m server.sim --scenario all --out docs/simulation`` writes the PNG files into
``docs/simulation/`` and the report to ``docs/simulation.md`` (``--markdown`` to choose).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from server.sim.scenarios import SCENARIOS, ScenarioResult


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
    return parser


def _command(args: argparse.Namespace) -> str:
    parts = ["python -m server.sim", f"--scenario {args.scenario}", f"--out {args.out}"]
    if args.seed != 1:
        parts.append(f"--seed {args.seed}")
    if args.scale != 1.0:
        parts.append(f"--scale {args.scale}")
    return " ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the scenarios; returns the exit status."""
    from server.sim import report

    args = _parser().parse_args(argv)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    out: Path = args.out
    markdown: Path = args.markdown or out.parent / f"{out.name}.md"
    sections = []
    results: list[ScenarioResult] = []
    for name in names:
        started = time.perf_counter()
        result = SCENARIOS[name](seed=args.seed, scale=args.scale)
        images = report.write_plots(result, out)
        sections.append(report.section(result, images, markdown.parent))
        results.append(result)
        elapsed = time.perf_counter() - started
        print(f"{name}: {'all targets met' if result.ok else 'TARGET MISSED'} ({elapsed:.1f} s)")
        for target in result.targets:
            op = "<=" if target.at_most else ">="
            flag = "ok  " if target.met else "MISS"
            print(f"  {flag} {target.text}: {target.value:.3f} {op} {target.bound:.3f}")
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(report.document(sections, _command(args)), encoding="utf-8")
    print(f"wrote {markdown} and {sum(3 for _ in results)} plots in {out}")
    if args.check and not all(r.ok for r in results):
        return 1
    return 0
