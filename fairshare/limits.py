"""The limits that keep one replica's memory and work bounded whatever clients send.

Every value here is what a client's message may hold, checked at the door
(``server.servicer``) before anything is stored; what an owner keeps in memory is bounded
where it is kept (``ha.owned.answers``, ``ha.owned.sessions``). docs/ha.md
("Limits") lists each with what a client sees at it.
"""

from __future__ import annotations

from typing import Final

MAX_NAME_BYTES: Final = 256
"""Longest pool, team, holder, request id or node id, in bytes of UTF-8."""
MAX_GRANT_ID_BYTES: Final = 2048
"""Longest grant id, in bytes: one encodes a pool, a team and a holder in base64, with
numbers and room for an authentication tag."""
MAX_ADOPT_GRANTS: Final = 4096
"""Most grants one Adopt may re-report; a holder with more sends several."""
MAX_BATCH_ITEMS: Final = 256
"""Most requests one AcquireMany, or releases one ReleaseMany, may carry."""
MAX_EST_TOKENS: Final = 2**32
"""Largest ``est_tokens`` of one request. Billions of requests at this size still sum
below 2**63, so a team's in-flight tokens always fit the wire's int64."""
MAX_WAIT_S: Final = 3600.0
"""Longest ``wait_s`` of one Acquire: how long an owner may hold a borrower past its pool's
lending limit. An owner also holds one at most its pool's ``max_request_s``."""
