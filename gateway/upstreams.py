"""Which vLLM server of a route gets the next request.

``Upstreams.choose`` picks the server with the fewest requests outstanding from this
gateway; among equals it goes in turn (a rotating start), so an idle set is used evenly.
A caller that could not connect asks again with the servers it tried excluded: a refused
connection goes to another server before the request has started anywhere.

Guarantees: ``outstanding`` counts each ``lease`` from its start to its end, whatever way
it ends. Not guaranteed: balance across several gateways (each counts its own requests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence


class Upstreams:
    """The servers of one route, with the requests this gateway has outstanding on each."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("a route needs at least one upstream")
        self.urls = list(urls)
        self.outstanding = dict.fromkeys(self.urls, 0)
        self._turn = 0

    def choose(self, exclude: frozenset[str] | set[str] = frozenset()) -> str | None:
        """The server to use next, or None when every one is excluded."""
        best: str | None = None
        n = len(self.urls)
        start = self._turn
        for i in range(n):
            url = self.urls[(start + i) % n]
            if url in exclude:
                continue
            if best is None or self.outstanding[url] < self.outstanding[best]:
                best = url
        if best is not None:
            self._turn = (self.urls.index(best) + 1) % n
        return best

    @contextlib.contextmanager
    def lease(self, url: str) -> Iterator[None]:
        """Counts one request outstanding on ``url`` while the block runs."""
        self.outstanding[url] += 1
        try:
            yield
        finally:
            self.outstanding[url] -= 1
