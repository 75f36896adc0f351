"""A longer randomized failover drill for operators: `make drill MINUTES=10 SEED=1`.

One cluster (a three-member etcd, three replicas, three gateways under load) suffers
random nemeses (every one of tests/drills/nemeses.py) back to back for the chosen number
of minutes; the invariants are checked at every poll and at the end, and the same report
as the CI drills is printed (one row per event, plus one for the whole run) and written to
build/drills.md. A nemesis that cannot get the cluster back (no owner in its bound) ends
the run with that as a violation. Exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

# Run as a script (beside nemeses.py), outside pytest: the import roots pytest's
# configuration gives the tests, the repository root (harness) and tests/ (the drill_* modules).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nemeses
from drill_harness import DrillCluster
from drill_ledger import DrillResult, write_report


async def run(minutes: float, seed: int) -> list[DrillResult]:
    rng = random.Random(seed)
    cluster = DrillCluster(f"schedule-{seed}")
    events: list[tuple[str, float, float, float]] = []
    failed: list[DrillResult] = []
    try:
        await cluster.start()
        await asyncio.sleep(2.0)
        deadline = time.monotonic() + minutes * 60
        for _ in range(10_000):
            if time.monotonic() >= deadline:
                break
            name = rng.choice(sorted(nemeses.NEMESES))
            print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
            began = time.monotonic()
            try:
                at, end = await nemeses.NEMESES[name](cluster)
            except (AssertionError, RuntimeError) as e:
                row = cluster.window(name, began, time.monotonic(), time.monotonic())
                row.violations.append(f"{name} did not recover: {e}")
                failed.append(row)
                cluster.etcd.heal()
                for replica in cluster.replicas:
                    if not replica.alive:
                        await nemeses.restart(replica)
                break
            if name == "killed-gateway":
                cluster.add_gateway()  # the fleet replaces the dead gateway
            await asyncio.sleep(rng.uniform(2.0, 5.0))
            events.append((name, at, end, time.monotonic()))
        first = events[0][1] if events else time.monotonic()
        last = events[-1][2] if events else time.monotonic()
        whole = await cluster.finish(nemesis_at=first, nemesis_end=last)
        whole.name = f"whole run ({len(events)} events, seed {seed})"
        rows = [cluster.window(name, at, end, until) for name, at, end, until in events]
        return [*rows, *failed, whole]
    finally:
        await cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    results = asyncio.run(run(args.minutes, args.seed))
    report = Path(__file__).resolve().parents[2] / "build" / "drills.md"
    print(write_report(results, report))
    return 1 if any(r.violations for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
