"""Checks of TLS files at start: each is loaded once as the ssl module will load it, so a
bad file stops the start with a ``ConfigError`` naming its configuration key, instead of
failing every handshake later. Used for the gRPC port's files and for etcd's.

Non-guarantee: a file that changes after the check is not checked again.
"""

from __future__ import annotations

import ssl

from ha import ConfigError


def check_cert_chain(key: str, cert_file: str, key_file: str, protocol: ssl._SSLMethod) -> None:
    """Raises ConfigError (at ``key``) unless ``cert_file`` is a readable PEM chain whose
    key is ``key_file``."""
    try:
        ssl.SSLContext(protocol).load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(
            key,
            f"{cert_file} with {key_file}: not a readable PEM certificate chain "
            f"and matching key ({e})",
        ) from e


def check_ca_bundle(key: str, path: str) -> None:
    """Raises ConfigError (at ``key``) unless ``path`` is a readable PEM bundle of CAs."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(path)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(key, f"{path}: not a readable PEM bundle ({e})") from e
