"""The answers an owner remembers so that a retried Acquire gets the first one again.

Guarantees: an answer is found again by (holder, request id) until it is pushed out; the
table never holds more than ``MAX_ANSWERS`` answers nor (estimated) ``MAX_ANSWER_BYTES``;
the oldest go first.

Non-guarantees: an answer pushed out is forgotten (a retry after that is a new request);
nothing is persisted (a new owner answers a retry anew).
"""

from __future__ import annotations

from collections import OrderedDict

from fairshare.limits import MAX_ANSWER_BYTES, MAX_ANSWERS

Answer = tuple[bool, str, int, bool, bool]
"""granted, grant id, priority, borrowing, saturated. Plain tuples of atoms, not Decisions:
the garbage collector stops tracking them, so a full table does not make every full
collection scan (and pause for) its entries."""

_ANSWER_OVERHEAD = 400
"""What one remembered answer costs beyond its strings: the key and value tuples, the
dict slot and the ints and bools (measured with tracemalloc: about 330 bytes)."""


class Answers:
    """Answers by (holder, request id), bounded in count and in bytes."""

    def __init__(self) -> None:
        self._answers: OrderedDict[tuple[str, str], Answer] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._answers)

    @property
    def bytes(self) -> int:
        """What the remembered answers hold, estimated from their strings."""
        return self._bytes

    def get(self, key: tuple[str, str]) -> Answer | None:
        """The answer remembered for ``key``; None if there is none (or no more)."""
        return self._answers.get(key)

    def remember(self, key: tuple[str, str], answer: Answer) -> None:
        """Remembers ``answer`` for ``key`` (replacing an earlier one), then drops the
        oldest answers until the table is within its bounds."""
        answers = self._answers
        previous = answers.pop(key, None)
        if previous is not None:
            self._bytes -= _size(key, previous)
        answers[key] = answer
        self._bytes += _size(key, answer)
        while len(answers) > MAX_ANSWERS or self._bytes > MAX_ANSWER_BYTES:
            old_key, old = answers.popitem(last=False)
            self._bytes -= _size(old_key, old)


def _size(key: tuple[str, str], answer: Answer) -> int:
    return len(key[0]) + len(key[1]) + len(answer[1]) + _ANSWER_OVERHEAD
