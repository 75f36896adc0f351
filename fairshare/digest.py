"""What a log line or an error message says of a grant id: a short digest, never the id.

Without peer identities (``tls.peer_identities``) a grant id is a bearer capability:
whoever has it can release the grant (and charge its team) or re-report it. Logs are read
by more people than the gateways, and an error message goes back to whoever sent the
call, so neither carries an id. ``grant_id_digest`` is what they carry instead.

Guarantees: the digest is a pure function of the id's text, the same in every process and
version (``sha256:`` and the first 12 hex digits of the SHA-256 of its UTF-8), so an
operator holding an id finds its lines with
``printf %s "$ID" | sha256sum | cut -c1-12``; and it reveals nothing an id's holder could
use (48 bits of a hash, not reversible to the id's MAC). Not guaranteed: two ids have
different digests (48 bits: a collision among millions of ids is possible, so a digest
correlates lines, it does not identify a grant for sure).
"""

from __future__ import annotations

import hashlib
from typing import Final

DIGEST_HEX: Final = 12
"""Hex digits of SHA-256 a digest keeps."""


def grant_id_digest(grant_id: str) -> str:
    """``sha256:<12 hex>``: the stable digest of ``grant_id`` to log or echo in its place.

    Any text is accepted (a malformed id, lone surrogates included) and its digest is as
    short as any other's.
    """
    data = grant_id.encode("utf-8", "surrogatepass")
    return f"sha256:{hashlib.sha256(data).hexdigest()[:DIGEST_HEX]}"
