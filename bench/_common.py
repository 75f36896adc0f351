"""What the benchmarks share: the machine description, the doc's sections, the servers'
config files, and bounded load loops with percentiles.

Every benchmark writes its own ``## ...`` section of docs/benchmarks.md with
``write_section`` and leaves the others as they are. Benchmarks run from the repository
root as modules (``python -m bench.core``), which puts ``bench`` and ``harness`` on the path.
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import re
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
INTRO = """# Benchmarks

Figures measured on one machine with the commands given in each section. Each section is
written by its own benchmark; rerun the command to refresh it.
"""


# -- the machine and the doc ----------------------------------------------------------------


def machine() -> dict[str, str]:
    """CPU model, CPUs this process may use, Python, OS, and the load average when the
    benchmark started (other work on the machine moves every absolute figure)."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "CPU": model,
        "nproc": str(cpus),
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "OS": f"{platform.system()} {platform.release()}",
        "load average at start (1, 5, 15 min)": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def machine_lines(info: dict[str, str]) -> str:
    """The machine as a markdown list."""
    return "\n".join(f"- {k}: {v}" for k, v in info.items())


def write_section(title: str, text: str, doc: Path = DOC) -> None:
    """Replaces the section headed ``title`` (``## ...``) of ``doc``, keeping every other
    one; appends it when absent."""
    doc.parent.mkdir(parents=True, exist_ok=True)
    current = doc.read_text() if doc.exists() else INTRO
    pattern = re.compile(rf"^{re.escape(title)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(current):
        updated = pattern.sub(lambda _: text.rstrip("\n") + "\n\n", current, count=1)
    else:
        updated = current.rstrip("\n") + "\n\n" + text
    doc.write_text(updated.rstrip("\n") + "\n")


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


# -- statistics -----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by the nearest-rank method; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1e3:.2f}"


# -- load loops -----------------------------------------------------------------------------


@dataclass
class Samples:
    """Latencies by name, recorded only while ``on`` (not during warm-up)."""

    on: bool = False
    data: dict[str, list[float]] = field(default_factory=dict)
    ops: int = 0

    def add(self, name: str, seconds: float) -> None:
        if self.on:
            self.data.setdefault(name, []).append(seconds)

    def get(self, name: str) -> list[float]:
        return self.data.get(name, [])


@dataclass(frozen=True)
class LoadResult:
    ops: int
    seconds: float
    samples: Samples

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


Op = Callable[[Samples], Awaitable[None]]


async def closed_loop(
    op: Op,
    *,
    in_flight: int,
    warmup_s: float,
    duration_s: float,
    max_ops: int,
    stagger_s: float = 0.0,
) -> LoadResult:
    """``in_flight`` workers run ``op`` back to back; counts the ops that complete within
    the measured window (after the warm-up). Bounded by ``max_ops`` per worker and by time.

    ``stagger_s`` spreads the workers' first ops evenly over that many seconds (keep it
    within the warm-up), as independent clients would arrive: ops of one length, started
    together, would otherwise keep arriving in bursts of ``in_flight``."""
    samples = Samples()
    stop = asyncio.Event()

    async def worker(number: int) -> None:
        if stagger_s > 0:
            await asyncio.sleep(stagger_s * number / in_flight)
        for _ in range(max_ops):
            if stop.is_set():
                return
            await op(samples)
            if samples.on:
                samples.ops += 1

    tasks = [asyncio.create_task(worker(number)) for number in range(in_flight)]
    try:
        await asyncio.sleep(warmup_s)
        samples.on = True
        start = time.perf_counter()
        done, _ = await asyncio.wait(tasks, timeout=duration_s)
        samples.on = False
        elapsed = time.perf_counter() - start
        stop.set()
        for task in done:
            task.result()  # a failed op fails the benchmark
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return LoadResult(samples.ops, elapsed, samples)


async def paced_loop(
    op: Op, *, rate: float, count: int, warmup: int, max_in_flight: int = 256
) -> LoadResult:
    """Starts ``op`` at a fixed ``rate`` (open loop) ``count`` times; the first ``warmup``
    are not recorded. An op that would exceed ``max_in_flight`` is skipped and counted
    in ``samples.data['skipped']``."""
    samples = Samples()
    tasks: set[asyncio.Task[None]] = set()
    failures: list[BaseException] = []

    def finished(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())  # type: ignore[arg-type]

    async def counted() -> None:
        await op(samples)
        if samples.on:
            samples.ops += 1

    start = time.perf_counter()
    measured_from = start
    try:
        for i in range(count):
            if i == warmup:
                samples.on = True
                measured_from = time.perf_counter()
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if failures:
                raise failures[0]
            if len(tasks) >= max_in_flight:
                samples.add("skipped", 0.0)
                continue
            task = asyncio.create_task(counted())
            tasks.add(task)
            task.add_done_callback(finished)
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        elapsed = time.perf_counter() - measured_from
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if failures:
        raise failures[0]
    return LoadResult(samples.ops, elapsed, samples)


# -- processes ------------------------------------------------------------------------------
# The processes themselves (allocators, etcd, waits) come from the ``harness`` package.


def pool_yaml(
    pools: list[dict[str, object]],
    timing: dict[str, float] | None = None,
    *,
    grant_keys: Path | None = None,
) -> str:
    """A ``fairshare serve`` config file: the pools, the timings, quiet logs, and the grant
    key file every replica shares (required with etcd endpoints)."""
    doc: dict[str, object] = {"log_level": "WARNING", "pools": pools}
    if timing:
        doc["timing"] = timing
    if grant_keys is not None:
        doc["grants"] = {"key_file": str(grant_keys)}
    return yaml.safe_dump(doc, sort_keys=False)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, in seconds (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def workdir(prefix: str) -> Path:
    """A fresh temporary directory on the default temp file system (a disk here: the
    embedded store's fsync is then a real one)."""
    return Path(tempfile.mkdtemp(prefix=prefix))
