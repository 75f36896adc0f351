"""A value read from files on disk, read again when they change: a followed file.

Keys, tokens and certificates are rotated by replacing their files (Kubernetes swaps a
mounted Secret's files in one rename); whoever reads them follows the files and uses the
new version without a restart. ``Followed`` is that following, once for all of them. The
caller reads and checks (``read``); this module only looks at the files, with one
``os.stat`` each: a file's stamp is its inode, size and inode change time, and the change
time is set by the kernel on every write, rename and ``chmod``, so no copy or ``touch``
of an old file can bring an old stamp back.

This is the one module of ``fairshare`` that touches the file system, and it only stats:
the decision core does no I/O and must not import it (pyproject.toml's import contracts
say both).

Guarantees:
- Calling a ``Followed`` returns the value in force: the value it started with, replaced
  only by a later read that succeeded (the same object until then).
- The files are looked at during a call, never between calls (no thread, no timer), and
  at most once per ``recheck_s``: a call less than ``recheck_s`` after the last look
  returns the value in force without a system call (0: every call looks).
- A look that finds a stamp other than those of the version in force reads the files
  again. The stamps are taken before the read, so a change made while the files are read
  is seen at the next look.
- A read that raises one of ``keep_on`` leaves the value in force, and the error goes to
  ``on_kept``; a read that succeeds goes to ``on_read(previous, new)``. Either way that
  version of the files is not read again: the next read is at their next change. Any
  other exception of ``read`` reaches the caller of that call (the value in force stays).
- A file that cannot be stat'ed (absent, say) is, by default, no change: the look stops
  there, nothing is read, and a file that comes back is read if its stamp is not the one
  read last. With ``absent_is_change``, its absence is a change like any other: the read
  is tried, and its failure kept and reported as above.

Not guaranteed:
- When a change is seen: at the first call ``recheck_s`` or more after the last look,
  however long after the change that is.
- That the content changed: a file replaced by the same bytes is read again (the value is
  replaced by an equal one, and ``on_read`` is called); a file rewritten in place with
  its size unchanged within one tick of the file system's clock keeps its stamp and is
  not read until its next change.
- Whole files: a file written in place may be read half-written. ``read`` should refuse
  what is incomplete (it is then kept out as any broken version, and the rest of the
  write, a new stamp, is read later); replacing a file by a rename avoids it.
- Threads: no lock is taken. It is meant for one thread or one event loop; calls from
  several threads at once may each read the same change.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Final, Generic, TypeVar

__all__ = ["UNREAD", "Followed", "Stamp", "Unread", "stamp", "stamps"]

T = TypeVar("T")

Stamp = tuple[int, int, int]
"""What tells a replaced or rewritten file apart: inode, size, inode change time (ns)."""

StrPath = str | os.PathLike[str]
"""A file's path, as ``os.stat`` takes it."""


class Unread(Enum):
    """The type of ``UNREAD``."""

    UNREAD = "unread"


UNREAD: Final = Unread.UNREAD
"""The ``value`` of a ``Followed`` when none is given: its files are read at once."""


def stamp(path: StrPath) -> Stamp | None:
    """The stamp of the file at ``path`` (a link followed), or None when it cannot be
    stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_ctime_ns)


def stamps(paths: Sequence[StrPath]) -> tuple[Stamp | None, ...]:
    """The stamp of each of ``paths``, in order (see ``stamp``)."""
    return tuple(stamp(path) for path in paths)


class Followed(Generic[T]):
    """A value read from files, read again when they change (see the module doc)."""

    def __init__(
        self,
        paths: Sequence[StrPath],
        read: Callable[[], T],
        *,
        keep_on: tuple[type[Exception], ...],
        value: T | Unread = UNREAD,
        stale: bool = False,
        recheck_s: float = 1.0,
        absent_is_change: bool = False,
        on_read: Callable[[T, T], object] | None = None,
        on_kept: Callable[[Exception], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Starts following ``paths``.

        Args:
            paths: the files the value is read from.
            read: reads them into a value; raises one of ``keep_on`` when they are not
                usable.
            keep_on: the errors of ``read`` that keep the value in force.
            value: the value the files hold now, read by the caller. When not given
                (``UNREAD``), the files are stamped and then read here, at once.
            stale: ``value`` may be older than the files: the first look reads them
                again, changed or not.
            recheck_s: the least time between two looks at the files.
            absent_is_change: a file that cannot be stat'ed counts as changed.
            on_read: told of each read that succeeded after the first: (previous, new).
            on_kept: told of each error of ``keep_on`` that kept the value in force.
            clock: monotonic seconds.

        Raises:
            Whatever ``read`` raises when it is called here (without ``value``): with no
            value to keep, a first read that fails is the caller's to handle.
        """
        self._paths = tuple(paths)
        self._read = read
        self._keep_on = keep_on
        self._recheck_s = recheck_s
        self._absent_is_change = absent_is_change
        self._on_read = on_read
        self._on_kept = on_kept
        self._clock = clock
        # Stamped before the read, so that a change made during the read is seen later.
        self._seen: tuple[Stamp | None, ...] | None = None if stale else stamps(self._paths)
        self._value = read() if isinstance(value, Unread) else value
        self._looked_at = clock()

    @property
    def value(self) -> T:
        """The value in force, without a look at the files."""
        return self._value

    def __call__(self) -> T:
        """The value in force, after a look at the files if one is due."""
        now = self._clock()
        if self._recheck_s > 0 and now - self._looked_at < self._recheck_s:
            return self._value
        self._looked_at = now
        seen = stamps(self._paths)
        if seen == self._seen or (None in seen and not self._absent_is_change):
            return self._value
        self._seen = seen
        try:
            value = self._read()
        except self._keep_on as e:
            if self._on_kept is not None:
                self._on_kept(e)
            return self._value
        previous, self._value = self._value, value
        if self._on_read is not None:
            self._on_read(previous, value)
        return value
