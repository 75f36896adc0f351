"""The files of the ``etcd`` section (certificates, key, password), read once at start.

``load_etcd_access`` turns the configured paths into ``ha.etcd.EtcdAccess`` for the
store, checking each file as the TLS library will use it, so a bad one stops the start
with a ``ConfigError`` naming its key instead of failing every etcd call later.

Non-guarantee: nothing is read again; a rotated certificate or password takes effect at
the next start.
"""

from __future__ import annotations

import pathlib
import ssl

from ha.etcd import EtcdAccess
from ha.settings import ConfigError
from server.config import EtcdConfig
from server.tls_files import check_ca_bundle, check_cert_chain

__all__ = ["load_etcd_access"]


def load_etcd_access(etcd: EtcdConfig) -> EtcdAccess | None:
    """The TLS and auth settings the store needs, or None when there are none.

    Raises:
        ConfigError: a file is unreadable, not PEM, a key that does not match its
            certificate, or an empty password; the path names the key.
    """
    if etcd.ca_file is None and etcd.username is None:
        return None
    cert_pem = key_pem = None
    if etcd.cert_file is not None and etcd.key_file is not None:
        check_cert_chain("etcd.cert_file", etcd.cert_file, etcd.key_file, ssl.PROTOCOL_TLS_CLIENT)
        cert_pem = _read("etcd.cert_file", etcd.cert_file)
        key_pem = _read("etcd.key_file", etcd.key_file)
    ca_pem = None
    if etcd.ca_file is not None:
        check_ca_bundle("etcd.ca_file", etcd.ca_file)
        ca_pem = _read("etcd.ca_file", etcd.ca_file)
    password = None
    if etcd.password_file is not None:
        text = _read("etcd.password_file", etcd.password_file).decode("utf-8", "replace")
        password = text.rstrip("\r\n")
        if not password:
            raise ConfigError("etcd.password_file", f"{etcd.password_file} is empty")
    return EtcdAccess(
        ca_pem=ca_pem,
        cert_pem=cert_pem,
        key_pem=key_pem,
        username=etcd.username,
        password=password,
    )


def _read(key: str, path: str) -> bytes:
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from e
