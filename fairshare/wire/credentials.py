"""The bearer token a caller presents: read from a file, sent as ``authorization``.

Both sides use it: the server reads its admin token with it, and the command line and the
simulator's remote mode read the token they send. Sending it is ``fairshare.wire.metadata.bearer``.
"""

from __future__ import annotations

import pathlib


def read_token(path: str | pathlib.Path) -> str:
    """Reads a token file: its content without surrounding whitespace.

    Raises:
        ValueError: the file is empty.
        OSError: it cannot be read.
    """
    token = pathlib.Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token
