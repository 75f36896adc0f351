"""`make fidelity`: seeded traces through vLLM's own v1 scheduler and through one simulated
instance, their event logs compared; writes the "Fidelity" section of docs/simulation.md.

- ``ensure_venv`` installs bench/fidelity-requirements.txt (``--no-deps``) into
  ``build/fidelity/venv`` (git-ignored, never the project's virtualenv) when the stamp it
  wrote after the last install does not match the file.
- The traces (``fairshare.sim.fidelity.trace.generate``, seeds 0 to N-1) go to vLLM's side
  (``bench/fidelity_vllm.py``, run by that virtualenv's python) as JSON, twice: with the
  features the simulator leaves out turned off (the logs compared), and on (chunked
  prefill, prefix caching, asynchronous scheduling: only the priority invariants checked).
- One trace of each shipped scenario (``bench.fidelity_scenarios``) goes through both sides
  too, features off, its logs compared.

Run from the repository root: ``python -m bench.fidelity [--traces 200]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import ROOT, percentile, write_section
from bench.fidelity_scenarios import WINDOW_S, scenario_traces
from fairshare.sim.fidelity.replay import replay
from fairshare.sim.fidelity.trace import EventLog, Figures, Trace, compare, figures, generate

REQUIREMENTS = ROOT / "bench" / "fidelity-requirements.txt"
VENV = ROOT / "build" / "fidelity" / "venv"
STAMP = ".requirements.sha256"
DOC = ROOT / "docs" / "simulation.md"
TITLE = "## Fidelity: the simulated instance against vLLM's own scheduler"
RUN_TIMEOUT_S = 1800.0


def ensure_venv(venv: Path = VENV, requirements: Path = REQUIREMENTS) -> Path:
    """The fidelity virtualenv's python, installed first when the stamp is stale."""
    python = venv / "bin" / "python"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    stamp = venv / STAMP
    if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return python
    print(f"installing {requirements.name} into {venv} (once; a few minutes)", flush=True)
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
    log = venv.parent / "install.log"
    with log.open("ab") as out:
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--no-input",
                "--no-deps",
                "-r",
                str(requirements),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=RUN_TIMEOUT_S,
        )
    stamp.write_text(digest + "\n")
    return python


def run_vllm(python: Path, traces: list[Trace], *, features: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        source, results = Path(tmp) / "traces.json", Path(tmp) / "results.json"
        source.write_text(json.dumps([t.to_json() for t in traces]))
        subprocess.run(
            [
                str(python),
                str(ROOT / "bench" / "fidelity_vllm.py"),
                str(source),
                str(results),
                "--features",
                "on" if features else "off",
            ],
            check=True,
            timeout=RUN_TIMEOUT_S,
            stderr=subprocess.DEVNULL,
        )
        doc: dict[str, Any] = json.loads(results.read_text())
        return doc


def _pooled(items: list[Figures]) -> dict[str, float]:
    within = [float(w) for f in items for w in f.within_waits]
    borrowing = [float(w) for f in items for w in f.borrowing_waits]
    return {
        "within mean": sum(within) / len(within),
        "within p99": percentile(within, 99),
        "borrowing mean": sum(borrowing) / len(borrowing),
        "borrowing p99": percentile(borrowing, 99),
        "within preempted": float(sum(f.within_preemptions for f in items)),
        "borrowing preempted": float(sum(f.borrowing_preemptions for f in items)),
    }


def compared(traces: list[Trace], results: list[dict[str, Any]]) -> list[str | None]:
    """For each trace, None when its replay through the simulator logs what vLLM's did,
    else where they first differ."""
    differences: list[str | None] = []
    for trace, result in zip(traces, results, strict=True):
        diff = compare(replay(trace), EventLog.from_json(result["log"]))
        differences.append(
            None if diff is None else f"step {diff.step}: {diff.left} / {diff.right}"
        )
    return differences


def scenario_table(traces: list[Trace], differences: list[str | None]) -> str:
    """One row per scenario trace: its size and whether both logs are the same."""
    lines = [
        "| scenario | requests | slots | KV blocks | identical |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for trace, diff in zip(traces, differences, strict=True):
        same = "yes" if diff is None else f"no, {diff}"
        lines.append(
            f"| `{trace.name}` | {len(trace.requests)} | {trace.max_num_seqs} | "
            f"{trace.kv_blocks} | {same} |"
        )
    return "\n".join(lines)


def section(
    count: int,
    version: str,
    same: int,
    differences: list[str],
    sim: dict[str, float],
    real: dict[str, float],
    on: dict[str, Any],
    scenarios: str,
) -> str:
    rows = [
        ("within-share mean wait", "within mean", "steps"),
        ("within-share p99 wait", "within p99", "steps"),
        ("borrowing mean wait", "borrowing mean", "steps"),
        ("borrowing p99 wait", "borrowing p99", "steps"),
        ("within-share requests preempted", "within preempted", ""),
        ("borrowing requests preempted", "borrowing preempted", ""),
    ]
    table = ["| figure (all traces pooled) | simulator | vLLM |", "| --- | ---: | ---: |"]
    for text, key, unit in rows:
        fmt = "{:.0f}" if not unit else "{:.2f}"
        table.append(f"| {text} | {fmt.format(sim[key])} | {fmt.format(real[key])} |")
    violations = [v for r in on["results"] for v in r["violations"]]
    unfinished = sum(not r["complete"] for r in on["results"])
    on_preempted = sum(len(s[2]) for r in on["results"] for s in r["log"]["steps"])
    listed = "" if not violations else " Violations: " + "; ".join(violations[:10])
    diff_text = (
        ""
        if not differences
        else " Traces whose logs differ (first differing step, simulator then vLLM):\n\n"
        + "\n".join(f"- {d}" for d in differences)
    )
    return f"""{TITLE}

Generated by `make fidelity` (`python -m bench.fidelity --traces {count}`); the rest of this
report is `make simulate`'s, which keeps this section.

{count} seeded random traces (`fairshare/sim/fidelity/trace.py`: 2 to 8 slots, 4 to 12 KV
blocks of 16 tokens per slot, 10 to 40 requests arriving in bursts, priorities 0, 1, 10, 20
and 30, prompts of 1 to 400 tokens, outputs of 1 to 120) are replayed step by step through
vLLM {version}'s own v1 `Scheduler` on CPU (`bench/fidelity_vllm.py`, in a virtualenv of its
own: bench/fidelity-requirements.txt) and through one simulated instance
(`fairshare/sim/fidelity/replay.py`: 1 s steps, no prefill time, so step k starts at k
seconds). vLLM's side has no chunked prefill (a token budget as large as the cache), no
prefix caching, the synchronous scheduler, `max_model_len` equal to the cache, and refuses
a request longer than that before `add_request`; a fake model output gives each scheduled
request one token, as vLLM's own scheduler tests do. Each replay logs, per step, the
requests admitted (in order), preempted and finished (a step's preemptions as a set: vLLM
reports them so).

**{same} of {count} event logs are identical.**{diff_text}

Waits are in steps, from arrival to first admission; *within share* is priority 0 or 1,
*borrowing* 10 and above.

{chr(10).join(table)}

**Not modelled**, so turned off above: chunked prefill (the simulator gives a prefill its
time in whole steps, slowing no one; vLLM splits a long prompt over steps under a token
budget), prefix caching (a resumed request recomputes all its tokens in the model; vLLM
finds its blocks again if they were not reused), asynchronous scheduling (vLLM schedules
step k+1 before step k's output is back). **With all three on** (a budget of 64 tokens a
step, prefix caching, `AsyncScheduler`), the same {count} traces through vLLM's scheduler:
{on_preempted} preemptions, {len(violations)} violations of the invariants (no request of
priority 0 or 1 preempted while one of 10 or more runs; every victim has the largest
(priority, arrival) of the requests running when the step began and not preempted with
it), {unfinished} traces not run to the end.{listed}

One trace of each shipped scenario (`bench/fidelity_scenarios.py`): what the first vLLM
instance of the scenario's first run received in its first {WINDOW_S:g} s (its 20 ms steps,
arrivals rounded up to the next one; priorities and lengths as the scenario gave them),
replayed the same way. A scenario's floods send a request when one ends, so the trace is a
fixed workload cut from the scenario, not the scenario itself; a scenario without a KV
budget gets one that never binds.

{scenarios}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    python = ensure_venv()
    traces = [generate(seed) for seed in range(args.traces)]
    off = run_vllm(python, traces, features=False)
    on = run_vllm(python, traces, features=True)
    same = 0
    differences: list[str] = []
    sim_figures: list[Figures] = []
    real_figures: list[Figures] = []
    for trace, result in zip(traces, off["results"], strict=True):
        sim_figures.append(figures(trace, replay(trace)))
        real_figures.append(figures(trace, EventLog.from_json(result["log"])))
    for trace, diff in zip(traces, compared(traces, off["results"]), strict=True):
        if diff is None:
            same += 1
        else:
            differences.append(f"`{trace.name}`, {diff}")
    scenarios = scenario_traces()
    scenario_diffs = compared(scenarios, run_vllm(python, scenarios, features=False)["results"])
    text = section(
        args.traces,
        str(off["vllm"]),
        same,
        differences,
        _pooled(sim_figures),
        _pooled(real_figures),
        on,
        scenario_table(scenarios, scenario_diffs),
    )
    write_section(TITLE, text, args.doc)
    print(f"{same} of {args.traces} event logs identical (vLLM {off['vllm']})")
    alike = sum(diff is None for diff in scenario_diffs)
    print(f"scenarios: {alike} of {len(scenarios)} event logs identical")
    violations = sum(len(r["violations"]) for r in on["results"])
    print(f"features on: {violations} invariant violations ({time.perf_counter() - started:.0f} s)")
    return 0 if violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
