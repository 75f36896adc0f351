"""Which vLLM server holds each stored Responses API response, and for which team.

vLLM keeps a stored response (a Responses request not saying ``store: false``, on a server
run with ``VLLM_ENABLE_RESPONSES_API_STORE=1``) in the memory of the one server that made
it: ``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel`` and a later request's
``previous_response_id`` find it only there. ``StoredResponses`` remembers, for each id of
a Responses answer this gateway passed on, the route and the server that answered, and
the team it was made for; ``fairshare.gateway.proxy`` sends the retrieval and the cancel
of the id to that server, and a request continuing it there when its placement is on that
route.

Guaranteed: ``find`` gives an id's server only to the team it was made for: for another
team it is as unknown as an id never seen, so a team can neither read, cancel nor continue
another team's response through this gateway, nor learn that the id exists. An id noted
for a second team is forgotten, not handed over. Only ids of ``ID_FORM`` are kept or found
(they go into an upstream path). At most ``capacity`` ids are kept; the least recently
noted or found is forgotten first.

Not guaranteed: ids made through another gateway replica or before this process started
(each replica remembers its own: a client using stored responses keeps to one replica,
by session affinity); that the server still holds the response (vLLM's store is in its
memory: a restart empties it, and the server answers its own 404, passed on).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from fairshare.gateway.config import Route

ID_FORM: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""What a stored response's id may be (vLLM's are ``resp_`` and a hex UUID): nothing that
could change the path it is put in."""


def valid_id(response_id: str) -> bool:
    """Whether ``response_id`` has the form of ``ID_FORM``."""
    return ID_FORM.fullmatch(response_id) is not None


@dataclass(frozen=True)
class Stored:
    """Where one stored response lives, and whose it is."""

    model: str
    route: Route
    url: str
    team: str


class StoredResponses:
    """The ids of the Responses answers this gateway passed on (see the module doc)."""

    def __init__(self, capacity: int) -> None:
        """``capacity``: most ids kept (>= 1)."""
        self.capacity = capacity
        self._ids: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def note(self, response_id: str, stored: Stored) -> None:
        """Remembers that ``response_id`` lives as ``stored`` says; forgets it instead when
        it was noted for another team (neither team finds it), and ignores an id not of
        ``ID_FORM``."""
        if not valid_id(response_id):
            return
        before = self._ids.get(response_id)
        if before is not None and before.team != stored.team:
            del self._ids[response_id]
            return
        self._ids[response_id] = stored
        self._ids.move_to_end(response_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def find(self, response_id: str, team: str) -> Stored | None:
        """Where ``response_id`` lives, if it was made for ``team``; else None."""
        stored = self._ids.get(response_id)
        if stored is None or stored.team != team:
            return None
        self._ids.move_to_end(response_id)
        return stored
