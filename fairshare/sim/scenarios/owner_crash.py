"""The owner of the pool crashes mid-run and a new one takes over, against the same runs
without the crash.

``FailoverAllocator`` models the crash, the restore and the adoptions with the core API on
simulated time, so this scenario is in-process only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from fairshare import Class, Pool, degraded_priority
from fairshare.sim.allocators import Allocator, AllocatorFactory, SetupError
from fairshare.sim.engine import Simulator
from fairshare.sim.model import Request
from fairshare.sim.results import SimResult
from fairshare.sim.scenarios.result import Comparison, ScenarioResult, Target, percentile
from fairshare.sim.scenarios.runs import Setup, run
from fairshare.sim.workloads import BATCH, INTERACTIVE, Bursts, Flood, Poisson, Source


class FailoverAllocator:
    """fairshare priorities from an owner that crashes and is replaced mid-run.

    The new owner is built with the core API, as ``ha/`` does (docs/design.md §11):
    a new ``Pool`` with the configured shares; ``set_usage`` from the
    last periodic snapshot, decayed to now; ``add_phantoms(team, in_flight, until=now +
    max_request_s)`` for the in-flight counts of the durable record; releases the
    gateways retried during the outage become ``charge`` + ``drop_phantom``; then the
    gateways re-report their live requests: ``adopt`` + ``drop_phantom``. While no owner
    is reachable, requests are granted fail-open (lowest borrowing priority, degraded).
    With ``resend_degraded`` (what ``fairshare gateway`` does, and the scenario's shipped
    run), the gateways abort the fail-open requests that have not started (no first token
    reached the client, so nothing was ever sent back) and send them again, decided by
    the new owner; those that started are adopted. Each request is re-sent at most once:
    only the adoption, which runs once, re-sends, and a re-sent request is no longer
    degraded. Without it, every fail-open request is adopted with its priority (the
    comparison the scenario prints).
    """

    def __init__(
        self,
        sim: Simulator,
        shares: Mapping[str, float],
        *,
        half_life_s: float,
        fail_at_s: float,
        outage_s: float,
        adopt_after_s: float,
        max_request_s: float,
        snapshot_every_s: float,
        resend_degraded: bool = False,
    ) -> None:
        self._sim = sim
        self._resend_degraded = resend_degraded
        self.resent = 0
        self._shares = dict(shares)
        self._half_life_s = half_life_s
        self._max_request_s = max_request_s
        self._capacity = sim.capacity
        self.epoch = 1
        self.pool: Pool | None = self._new_pool()
        self._snap_t = 0.0
        self._snap_usage: dict[str, float] = {}
        self._in_flight_at_crash: dict[str, int] = {}
        self._retried: list[tuple[Request, float]] = []  # releases waiting for an owner
        self.phantoms_at_restore = 0
        self.phantoms_after_adopt = 0
        self.restored_at_s = fail_at_s + outage_s
        self.adopted_at_s = self.restored_at_s + adopt_after_s

        def snapshot() -> None:
            if self.pool is not None:
                self._snap_t = sim.now
                self._snap_usage = self.pool.usage()[0]
                sim.at(sim.now + snapshot_every_s, snapshot)

        sim.at(snapshot_every_s, snapshot)
        sim.at(fail_at_s, self._crash)
        sim.at(self.restored_at_s, self._restore)
        sim.at(self.adopted_at_s, self._adopt)

    def _new_pool(self) -> Pool:
        sim = self._sim
        return Pool(
            "sim",
            self._capacity,
            self._shares,
            half_life_s=self._half_life_s,
            clock=lambda: sim.now,
        )

    def admit(self, req: Request) -> None:
        if self.pool is None:  # no owner reachable: fail open
            req.priority = degraded_priority(req.cls)
            req.borrowing = True
            req.degraded = True
            req.epoch = 0
            return
        grant = self.pool.acquire(req.team, req.cls, req.est_tokens)
        req.grant = grant
        req.priority = grant.priority
        req.borrowing = grant.borrowing
        req.epoch = self.epoch

    def release(self, req: Request, cost: float) -> None:
        if self.pool is None:
            self._retried.append((req, cost))  # the gateway retries until an owner answers
        elif req.epoch == self.epoch and req.grant is not None:
            req.grant.release(cost)
        else:
            self._release_unknown(req, cost)

    def set_capacity(self, capacity: int) -> None:
        self._capacity = capacity
        if self.pool is not None:
            self.pool.set_capacity(capacity)

    def _release_unknown(self, req: Request, cost: float) -> None:
        """A release for a grant this owner never counted (docs/design.md §11)."""
        assert self.pool is not None
        self.pool.charge(req.team, cost)
        if req.epoch != 0:  # counted by the old owner, so standing as one of its phantoms
            self.pool.drop_phantom(req.team)

    def _crash(self) -> None:
        assert self.pool is not None
        # Within-share grants are durable before they are returned, so the record of
        # in-flight counts is current; usage is only as fresh as the last snapshot.
        self._in_flight_at_crash = self.pool.usage()[1]
        self.pool = None

    def _restore(self) -> None:
        now = self._sim.now
        pool = self._new_pool()
        lam = pool.decay_rate
        for team, usage in self._snap_usage.items():
            pool.set_usage(team, usage * math.exp(-lam * (now - self._snap_t)))
        for team, n in self._in_flight_at_crash.items():
            pool.add_phantoms(team, n, until=now + self._max_request_s)
        self.pool = pool
        self.epoch += 1
        for req, cost in self._retried:
            self._release_unknown(req, cost)
        self._retried = []
        self.phantoms_at_restore = sum(s.phantoms for s in pool.snapshot())

    def _adopt(self) -> None:
        pool = self.pool
        assert pool is not None
        resend = []
        for req in self._sim.in_flight():
            if req.epoch == self.epoch:
                continue
            if req.degraded and self._resend_degraded and req.first_start_s is None:
                resend.append(req)
                continue
            req.grant = pool.adopt(req.team, req.priority, req.borrowing, req.est_tokens)
            if req.epoch != 0:
                pool.drop_phantom(req.team)
            req.epoch = self.epoch
        # After the adoptions, so the new decisions see every request in flight.
        self.resent = sum(1 for req in resend if self._sim.resend(req))
        self.phantoms_after_adopt = sum(s.phantoms for s in pool.snapshot())


def _paired_reserved(
    base: SimResult, run: SimResult, team: str, after_s: float
) -> list[tuple[Request, Request]]:
    """The team's requests the run without failover granted within share, after ``after_s``,
    each with the same request in ``run``.

    The team's source must be open-loop (Poisson or bursts): its k-th request is then the
    same request (same arrival, same size) in both runs.
    """
    mine = [r for r in base.requests if r.team == team]
    theirs = [r for r in run.requests if r.team == team]
    return [
        (x, y)
        for x, y in zip(mine, theirs, strict=False)
        if not x.borrowing and x.arrival_s >= after_s
    ]


SHIPPED = "failover"
"""The label of the checked run: fail-open requests not started are re-sent."""
ADOPTED = "failover, fail-open adopted as is"
"""The label of the comparison run: every fail-open request is adopted with its priority."""

FAILOVER_SEEDS = 4
"""The failover comparison pools this many seeds: the two runs part ways at the crash
(the flood's completions, hence its arrivals, shift), and one seed's p99 moves by about
0.3 s from that alone."""


def _checks(figures: dict[str, float], tolerance: float) -> tuple[list[Target], list[Comparison]]:
    """The targets the checked run must meet, and its figures beside the adopted run's."""
    targets: list[Target] = []
    comparisons: list[Comparison] = []
    for team in ("b", "c"):
        still = f"{team}'s requests reserved without the failover, sent after the window, "
        still += "still granted within share"
        p99 = f"{team}'s reserved requests after the window: p99 wait minus the same without it"
        never = f"{team}'s requests sent in the window never started"
        targets.append(
            Target(
                f"{SHIPPED}: {still}",
                figures[f"{team}_still_within_resent"] * 100,
                98.0,
                at_most=False,
                unit="%",
            )
        )
        targets.append(
            Target(
                f"{SHIPPED}: {p99} (tolerance {tolerance:.2f} s: 10 % of a mean service time)",
                figures[f"{team}_p99_wait_resent_s"] - figures[f"{team}_p99_wait_base_s"],
                tolerance,
                at_most=True,
                unit="s",
            )
        )
        targets.append(
            Target(
                f"{SHIPPED}: {never}",
                figures[f"{team}_window_never_started_resent"],
                0.0,
                at_most=True,
            )
        )
        comparisons += [
            Comparison(
                still,
                figures[f"{team}_still_within_resent"] * 100,
                figures[f"{team}_still_within_adopted"] * 100,
                unit="%",
            ),
            Comparison(
                p99,
                figures[f"{team}_p99_wait_resent_s"] - figures[f"{team}_p99_wait_base_s"],
                figures[f"{team}_p99_wait_adopted_s"] - figures[f"{team}_p99_wait_base_s"],
                unit="s",
            ),
            Comparison(
                never,
                figures[f"{team}_window_never_started_resent"],
                figures[f"{team}_window_never_started_adopted"],
            ),
        ]
    targets.append(
        Target(
            "phantoms left once the gateways re-reported (adopt)",
            figures["phantoms_after_adopt"],
            0.0,
            at_most=True,
        )
    )
    return targets, comparisons


def failover(
    *, seed: int = 1, scale: float = 1.0, fairshare: AllocatorFactory | None = None
) -> ScenarioResult:
    """An owner crash mid-run, against the same runs without it.

    The checked run (``failover``) re-sends the fail-open requests that have not started
    once the new owner answers, as ``fairshare gateway`` does; the run that adopts them
    as they are (``ADOPTED``) is printed beside it as ``comparisons``, not checked.

    In-process only: the crash, the restore and the adoptions are modelled with the core
    API on simulated time, so ``fairshare`` must be None.
    """
    if fairshare is not None:
        raise SetupError(
            "the failover scenario is in-process only: it crashes and rebuilds the owner "
            "itself on simulated time, which a running allocator cannot do; run it "
            "without --allocator"
        )
    capacity = 20
    shares = {"a": 0.5, "b": 0.3, "c": 0.2}
    horizon = 1800.0 * scale
    half_life = 600.0
    fail_at = horizon / 2
    outage = 6.0  # lease TTL 5 s + 1 s (docs/design.md §19: decisions resume <= T + 1 s)
    adopt_after = 1.0
    max_request = 60.0
    sources: list[Source] = [
        Flood("a", outstanding=4 * capacity, shape=BATCH),
        Poisson("b", rate_per_s=0.8, shape=INTERACTIVE),
        Bursts("c", every_s=20.0, size=5, shape=INTERACTIVE),
    ]
    # label -> figure suffix; the first is the run checked, as a ScenarioResult's first run.
    variants = {SHIPPED: "resent", ADOPTED: "adopted"}
    window = (fail_at, fail_at + outage + max_request)

    def one(run_seed: int) -> tuple[dict[str, SimResult], dict[str, FailoverAllocator]]:
        setup = Setup(
            capacity=capacity,
            shares=shares,
            sources=sources,
            horizon_s=horizon,
            seed=run_seed,
            half_life_s=half_life,
            pool="failover",
        )
        allocators: dict[str, FailoverAllocator] = {}

        def build(key: str) -> Callable[[Simulator], Allocator]:
            def make(sim: Simulator) -> FailoverAllocator:
                alloc = FailoverAllocator(
                    sim,
                    shares,
                    half_life_s=half_life,
                    fail_at_s=fail_at,
                    outage_s=outage,
                    adopt_after_s=adopt_after,
                    max_request_s=max_request,
                    snapshot_every_s=2.5,
                    resend_degraded=key == "resent",
                )
                allocators[key] = alloc
                return alloc

            return make

        runs = {label: run(setup, allocator=build(key)) for label, key in variants.items()}
        runs["no failover"] = run(setup)
        return runs, allocators

    seeds = [one(seed + i) for i in range(FAILOVER_SEEDS)]
    runs, first = seeds[0]
    base = runs["no failover"]
    figures: dict[str, float] = {
        "mean_service_s": base.mean_service_s(),
        "phantoms_at_restore": first["resent"].phantoms_at_restore,
        "phantoms_after_adopt": max(
            a.phantoms_after_adopt for _, allocs in seeds for a in allocs.values()
        ),
        "fail_open_resent": sum(allocs["resent"].resent for _, allocs in seeds),
        "window_start_s": window[0],
        "window_end_s": window[1],
        "seeds": FAILOVER_SEEDS,
    }
    tolerance = 0.1 * figures["mean_service_s"]
    figures["p99_tolerance_s"] = tolerance
    for team in ("b", "c"):  # a floods: none of its requests is within share after its start
        for label, key in variants.items():
            pairs = [
                pair
                for seed_runs, _ in seeds
                for pair in _paired_reserved(
                    seed_runs["no failover"], seed_runs[label], team, window[1]
                )
            ]
            base_waits = [x.wait_s(horizon) for x, _ in pairs]
            waits = [y.wait_s(horizon) for _, y in pairs]
            kept = sum(1 for _, y in pairs if not y.borrowing) / len(pairs) if pairs else math.nan
            figures[f"{team}_reserved_after_window"] = len(pairs)
            figures[f"{team}_still_within_{key}"] = kept
            figures[f"{team}_p99_wait_base_s"] = percentile(base_waits, 99)
            figures[f"{team}_p99_wait_{key}_s"] = percentile(waits, 99)
            figures[f"{team}_max_wait_base_s"] = max(base_waits, default=math.nan)
            figures[f"{team}_max_wait_{key}_s"] = max(waits, default=math.nan)
            inside = [
                r
                for seed_runs, _ in seeds
                for r in seed_runs[label].requests
                if r.team == team and window[0] <= r.arrival_s < window[1]
            ]
            figures[f"{team}_window_p99_wait_{key}_s"] = percentile(
                [r.wait_s(horizon) for r in inside], 99
            )
            figures[f"{team}_window_never_started_{key}"] = sum(
                1 for r in inside if r.first_start_s is None
            )
    targets, comparisons = _checks(figures, tolerance)
    description = (
        f"C = {capacity}, shares a 0.5 / b 0.3 / c 0.2. *a* floods with {4 * capacity} "
        "requests outstanding, *b* sends interactive requests (0.8/s), *c* bursts of 5 "
        f"every 20 s on average. At {fail_at:.0f} s the owner crashes; for {outage:.0f} s "
        "no owner answers and requests are granted fail-open (lowest priority, "
        f"{degraded_priority(Class.INTERACTIVE)}/{degraded_priority(Class.BATCH)}). "
        "The new owner restores usage from the last snapshot (every 2.5 s), adds "
        f"phantoms for the in-flight counts (max_request_s = {max_request:.0f} s) and turns "
        "the releases retried during the outage into charge + drop_phantom; "
        f"{adopt_after:.0f} s later the gateways re-report their live requests (adopt + "
        "drop_phantom). As `fairshare gateway` does, the gateways of the checked run "
        "(*failover*) then abort the fail-open requests that have not started (no first "
        "token reached the client) and send each of them again, once, decided by the new "
        "owner; the fail-open requests that started are adopted. The variant "
        f"*{ADOPTED}* adopts every fail-open request with its priority: it is printed as "
        "the comparison below the targets, not checked. The reference is the same "
        "workload without the crash; the waits compared are those of the requests the run "
        "without the crash granted within share, sent after the window "
        f"[{window[0]:.0f} s, {window[1]:.0f} s) (outage + phantom lifetime), pooled over "
        f"{FAILOVER_SEEDS} seeds. The plots show the first seed."
    )
    return ScenarioResult(
        name="failover",
        title="Owner failover mid-run",
        description=description,
        shares=shares,
        runs=runs,
        figures=figures,
        targets=targets,
        marks=[(fail_at, "owner crash"), (first["resent"].restored_at_s, "new owner")],
        window=window,
        wait_series=True,
        compared=ADOPTED,
        comparisons=comparisons,
        notes=(
            "**Why the fail-open requests are re-sent.** Adopted as they are, the fail-open "
            "requests sent during the outage keep the lowest priority; while another team "
            "borrows, vLLM never starts them "
            f"({figures['b_window_never_started_adopted']:.0f} of b's and "
            f"{figures['c_window_never_started_adopted']:.0f} of c's, over "
            f"{FAILOVER_SEEDS} seeds, were still waiting at the end). They are borrowers, "
            "and borrowers no longer use up a reservation (docs/spec.md §4), so they do not "
            "keep their team's reservation taken (under the rule before they did, for as "
            "long as they waited): after the window "
            f"{figures['b_still_within_adopted']:.1%} of the requests b would have had within "
            f"share (c: {figures['c_still_within_adopted']:.1%}) get it even so. Re-sent once "
            f"the new owner answers ({figures['fail_open_resent']:.0f} requests over "
            f"{FAILOVER_SEEDS} seeds), nothing starves and the reserved requests after the "
            "window are served as without the failover "
            f"({figures['b_still_within_resent']:.1%} / {figures['c_still_within_resent']:.1%} "
            "within share). The phantoms themselves behave: "
            f"{figures['phantoms_at_restore']:.0f} at restore, "
            f"{figures['phantoms_after_adopt']:.0f} once the gateways re-reported. The "
            "restored phantoms stand for every request in flight at the crash, of unknown "
            "standing, so they count as within share (the safe side, docs/spec.md §8): "
            "until the gateways re-report, a team that had its reservation or more in "
            "flight at the crash borrows. This models the most cautious restore (a state "
            "written before live rows carried a standing); the allocator restores each "
            "phantom with its request's standing (docs/design.md §11), which gives a team "
            "its slots back as soon as its own within-share requests end."
        ),
    )
