"""The answers an owner remembers so that a retried Acquire gets the first one again.

Guarantees: an answer is found again by (holder, request id) until it is pushed out; the
table never holds more than ``MAX_ANSWERS`` answers nor (estimated) ``MAX_ANSWER_BYTES``;
the oldest go first.

Non-guarantees: an answer pushed out is forgotten (a retry after that is a new request);
nothing is persisted (a new owner answers a retry anew).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, NamedTuple

from ha.api import Decision, Epoch, NodeId

MAX_ANSWER_BYTES: Final = 32 * 2**20
"""Bytes of remembered answers (request-id dedupe) one pool keeps; the oldest go first."""
MAX_ANSWERS: Final = 100_000
"""Most remembered answers one pool keeps, whatever their size."""


class Answer(NamedTuple):
    """The first answer to an Acquire, which a retry of it gets again."""

    granted: bool
    grant_id: str
    priority: int
    borrowing: bool
    saturated: bool

    def decision(self, owner: NodeId, epoch: Epoch) -> Decision:
        """The answer as the owner at ``epoch`` gives it (never degraded)."""
        return Decision(
            granted=self.granted,
            grant_id=self.grant_id,
            priority=self.priority,
            borrowing=self.borrowing,
            saturated=self.saturated,
            degraded=False,
            owner=owner,
            epoch=epoch,
        )


_Row = tuple[bool, str, int, bool, bool]
"""An ``Answer`` as the table keeps it: a plain tuple of atoms, not the ``Answer`` (nor a
Decision): the garbage collector stops tracking plain tuples of atoms (not instances of
their subclasses), so a full table does not make every full collection scan (and pause
for) its entries."""

_ANSWER_OVERHEAD = 400
"""What one remembered answer costs beyond its strings: the key and value tuples, the
dict slot and the ints and bools (measured with tracemalloc: about 330 bytes)."""


class Answers:
    """Answers by (holder, request id), bounded in count and in bytes."""

    def __init__(self) -> None:
        self._answers: OrderedDict[tuple[str, str], _Row] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._answers)

    @property
    def bytes(self) -> int:
        """What the remembered answers hold, estimated from their strings."""
        return self._bytes

    def get(self, key: tuple[str, str]) -> Answer | None:
        """The answer remembered for ``key``; None if there is none (or no more)."""
        row = self._answers.get(key)
        return None if row is None else Answer._make(row)

    def remember(self, key: tuple[str, str], answer: Answer) -> None:
        """Remembers ``answer`` for ``key`` (replacing an earlier one), then drops the
        oldest answers until the table is within its bounds."""
        answers = self._answers
        previous = answers.pop(key, None)
        if previous is not None:
            self._bytes -= _size(key, Answer._make(previous))
        answers[key] = (
            answer.granted,
            answer.grant_id,
            answer.priority,
            answer.borrowing,
            answer.saturated,
        )
        self._bytes += _size(key, answer)
        while len(answers) > MAX_ANSWERS or self._bytes > MAX_ANSWER_BYTES:
            old_key, old = answers.popitem(last=False)
            self._bytes -= _size(old_key, Answer._make(old))


def _size(key: tuple[str, str], answer: Answer) -> int:
    return len(key[0]) + len(key[1]) + len(answer.grant_id) + _ANSWER_OVERHEAD
