"""Time as the replication layer sees it: injected, so tests can run on a fake clock.

Which clock for what:

- ``boottime`` keeps counting while the machine (or VM) is suspended. It bounds the
  self-fencing deadline: the store's lease TTL runs on another machine, which was not
  suspended, so a deadline on a clock that stopped would outlive the lease.
- ``monotonic`` measures durations and ages within this process (group-commit windows,
  retry deadlines, the age of a grant within an epoch). It is never stepped; it may stop
  during a suspend, which only delays timers.
- ``time`` is wall-clock seconds. It may be stepped (NTP, an operator) and is used only
  where two processes must agree: snapshot times, the decay and phantom horizons a
  successor restores, the dates written into the store.

Non-guarantee: clocks are not compared across machines except through wall time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import time
from collections.abc import Mapping
from typing import Protocol

logger = logging.getLogger(__name__)

WALL_OFFSET_ENV = "FAIRSHARE_TEST_WALL_OFFSET_FILE"
"""Test-only: names a file whose float content is added to wall time (see
``WallOffsetClock``)."""


class Clock(Protocol):
    """A source of time and of sleeps."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (it may stop while suspended)."""
        ...

    def boottime(self) -> float:
        """Seconds on a clock that never goes back and counts a suspend too."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch (may be stepped either way)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspends the calling task for ``seconds`` (of ``monotonic``)."""
        ...


def _boottime() -> float:
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)  # Linux only
    if clock_id is None:
        return time.monotonic()
    return time.clock_gettime(clock_id)


class SystemClock:
    """The real clocks of this process.

    ``boottime`` is CLOCK_BOOTTIME on Linux; elsewhere it falls back to the monotonic
    clock (which on macOS and Windows already counts a suspend).
    """

    def monotonic(self) -> float:
        return time.monotonic()

    def boottime(self) -> float:
        return _boottime()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class WallOffsetClock(SystemClock):
    """TEST ONLY: the system clocks, with wall time shifted by a number kept in a file.

    Lets a drill step the wall clock of one real process without touching the machine's
    clock: write a float (seconds, may be negative) to the file and the process's
    ``time()`` moves by that much. The file is looked at (one ``stat``) at most every
    ``check_every_s`` of monotonic time and read again only when its mtime or size
    changed. A missing file means offset 0; an unreadable one (say, caught half-written:
    write a temporary file and rename it over) keeps the last offset. Monotonic and boot
    time are not shifted. Production never builds one: see ``system_clock``.
    """

    def __init__(self, path: str, *, check_every_s: float = 0.05) -> None:
        self._path = path
        self._check_every_s = check_every_s
        self._checked = -float("inf")
        self._seen: tuple[int, int] | None = None
        self._offset = 0.0

    @property
    def offset(self) -> float:
        self._refresh()
        return self._offset

    def time(self) -> float:
        self._refresh()
        return time.time() + self._offset

    def _refresh(self) -> None:
        now = time.monotonic()
        if now < self._checked + self._check_every_s:
            return
        self._checked = now
        try:
            st = os.stat(self._path)
        except OSError:
            self._seen, self._offset = None, 0.0
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return
        try:
            with open(self._path, encoding="ascii") as f:
                offset = float(f.read().strip())
        except (OSError, ValueError) as e:
            # Perhaps caught half-written: keep the offset, look again at the next check.
            logger.warning("test wall offset file %s unreadable (%s); offset kept", self._path, e)
            return
        self._seen = seen
        if offset != self._offset:
            logger.warning("test wall offset is now %+.3fs (from %s)", offset, self._path)
        self._offset = offset


def system_clock(environ: Mapping[str, str] | None = None) -> SystemClock:
    """The clock of a real process: ``SystemClock``, or a ``WallOffsetClock`` when the
    test-only variable ``FAIRSHARE_TEST_WALL_OFFSET_FILE`` names a file. Read once, at
    start-up (``ha.node.open_node``)."""
    env = os.environ if environ is None else environ
    path = env.get(WALL_OFFSET_ENV, "")
    if not path:
        return SystemClock()
    logger.warning(
        "%s is set: wall time is shifted by the number in %s (a test hook; never set it in "
        "production)",
        WALL_OFFSET_ENV,
        path,
    )
    return WallOffsetClock(path)


class EpochTime:
    """Wall time read once, then moved on by the monotonic clock.

    What an owner reads as "now" during one epoch: the ages it measures (grant expiry,
    usage decay, phantom and memory horizons) cannot be cut or stretched by a wall step,
    yet the times it writes into a snapshot are close to wall time, so a successor on
    another machine can compare them with its own wall clock. Not guaranteed: it drifts
    from wall time by any step (and by the length of any suspend) since it was read.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._mono0 = clock.monotonic()
        self._wall0 = clock.time()

    def __call__(self) -> float:
        return self._wall0 + (self._clock.monotonic() - self._mono0)


class FakeClock:
    """A clock that moves only when a test calls ``advance``, ``step_wall`` or ``suspend``.

    Sleepers wake, in deadline order, when ``advance`` passes their deadline; nothing
    sleeps for real, so a test of a 5-second lease takes microseconds. ``advance`` moves
    all three clocks together; ``step_wall`` moves wall time alone (an NTP step);
    ``suspend`` moves boot time and wall time but not monotonic time (a VM suspended and
    resumed), so no sleeper wakes.
    """

    def __init__(self, *, start_wall: float = 1_700_000_000.0) -> None:
        self._mono = 1000.0
        self._boot_offset = 5000.0  # boot time differs from monotonic, as on a real host
        self._wall_offset = start_wall - self._mono
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._mono

    def boottime(self) -> float:
        return self._mono + self._boot_offset

    def time(self) -> float:
        return self._mono + self._wall_offset

    def step_wall(self, seconds: float) -> None:
        """Steps wall time alone by ``seconds`` (either sign)."""
        self._wall_offset += seconds

    def suspend(self, seconds: float) -> None:
        """Models a suspend of ``seconds``: boot and wall time jump, monotonic does not."""
        if seconds < 0:
            raise ValueError("a suspend cannot last a negative time")
        self._boot_offset += seconds
        self._wall_offset += seconds

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), future))
        await future

    async def advance(self, seconds: float, *, step: float = 0.05) -> None:
        """Moves time forward in steps of at most ``step``, letting woken tasks run."""
        target = self._mono + seconds
        while True:
            await settle()
            self._mono = min(target, self._mono + step)
            while self._sleepers and self._sleepers[0][0] <= self._mono:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
            if self._mono >= target:
                break
        await settle()


async def settle(rounds: int = 20) -> None:
    """Lets every ready task run a few times (for tests on a fake clock)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
