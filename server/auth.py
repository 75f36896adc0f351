"""Who may call the admin service: a bearer token or an allowed mTLS client identity.

Rules, in order:
1. a client certificate (mutual TLS) whose subject CN or a SAN is in
   ``admin_identities`` is admitted;
2. an ``authorization: Bearer <token>`` header equal to the configured token (compared in
   constant time) is admitted; any other token is ``PERMISSION_DENIED``;
3. a client certificate that is not allowed is ``PERMISSION_DENIED``;
4. no credentials at all is ``UNAUTHENTICATED``.
With neither a token nor identities configured, every admin call is refused.

A token read from a file follows the file (``fairshare.filewatch``, looked at on every
call that presents a token): an operator rotates it by replacing the file (as Kubernetes
does for a mounted Secret), with no restart. A replacement that cannot be read, or is
empty, leaves the previous token in force and is logged.
"""

from __future__ import annotations

import hmac
import logging
import pathlib
from collections.abc import Collection
from typing import Final

import grpc
from grpc import aio

from fairshare.filewatch import Followed
from fairshare.wire.credentials import read_token
from fairshare.wire.metadata import AUTHORIZATION

logger = logging.getLogger(__name__)

_BEARER: Final = "bearer "
# Keys of grpc's auth context that carry the client certificate's identities.
_IDENTITY_KEYS: Final = ("x509_common_name", "x509_subject_alternative_name")


def peer_identities(context: aio.ServicerContext) -> list[str]:
    """The verified client-certificate CNs and SANs of the caller (empty without mTLS)."""
    auth = context.auth_context() or {}
    names: list[str] = []
    for key in _IDENTITY_KEYS:
        for value in auth.get(key, ()):
            names.append(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
    return names


class AdminAuth:
    """Checks the credentials of one admin call (see the module doc for the rules)."""

    def __init__(
        self,
        *,
        token: str | None,
        identities: Collection[str] = (),
        token_file: str | pathlib.Path | None = None,
    ) -> None:
        """Creates the checker.

        Args:
            token: the bearer token admin calls must present; None accepts no token.
            identities: client-certificate CNs/SANs admitted without a token.
            token_file: the file ``token`` was read from, read again whenever it changes.
        """
        self._given = token.encode("utf-8") if token else None
        self._identities = frozenset(identities)
        self._token_file = None if token_file is None else pathlib.Path(token_file)
        # Whether the file was read here: once it has been, every re-read is logged.
        self._reread = False
        self._token = None if self._token_file is None else self._follow(self._token_file)

    def _follow(self, path: pathlib.Path) -> Followed[bytes | None]:
        """The token file, looked at on every call that presents a token."""
        return Followed(
            [path],
            lambda: read_token(path).encode("utf-8"),
            keep_on=(OSError, ValueError),
            # The first look reads the file again, in case it was replaced since the
            # token given was read from it.
            value=self._given,
            stale=True,
            recheck_s=0,
            on_read=self._token_read,
            on_kept=self._token_kept,
        )

    def _token_read(self, previous: bytes | None, token: bytes | None) -> None:
        if self._reread or token != previous:
            logger.info("admin token re-read from %s", self._token_file)
        self._reread = True

    def _token_kept(self, error: Exception) -> None:
        logger.warning("keeping the previous admin token: %s", error)
        self._reread = True

    def _current_token(self) -> bytes | None:
        return self._given if self._token is None else self._token()

    async def check(self, context: aio.ServicerContext) -> None:
        """Returns when the caller may proceed; otherwise aborts the RPC.

        Aborts with UNAUTHENTICATED when the call carries no credentials and
        PERMISSION_DENIED when they are wrong.
        """
        code, message = self.decide(context)
        if code is not None:
            logger.warning("admin call from %s refused: %s", context.peer(), message)
            await context.abort(code, message)

    def decide(self, context: aio.ServicerContext) -> tuple[grpc.StatusCode | None, str]:
        """The refusal for this call, or (None, "") when it is admitted."""
        identities = peer_identities(context)
        if self._identities.intersection(identities):
            return None, ""
        header = next(
            (v for k, v in context.invocation_metadata() or () if k == AUTHORIZATION), None
        )
        if header is not None:
            text = header if isinstance(header, str) else header.decode("utf-8", "replace")
            if not text.lower().startswith(_BEARER):
                return grpc.StatusCode.UNAUTHENTICATED, "authorization must be 'Bearer <token>'"
            given = text[len(_BEARER) :].strip().encode("utf-8")
            token = self._current_token()
            if token is not None and hmac.compare_digest(given, token):
                return None, ""
            return grpc.StatusCode.PERMISSION_DENIED, "wrong admin token"
        if identities:
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"client identity {', '.join(identities)} may not call the admin service",
            )
        return grpc.StatusCode.UNAUTHENTICATED, "admin calls need a bearer token or client cert"
