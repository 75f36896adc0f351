"""The files of the ``etcd`` section (certificates, key, password), followed while running.

``load_etcd_access`` turns the configured paths into ``ha.store.etcd.EtcdAccess`` for the
store, checking each file as the TLS library will use it, so a bad one stops the start
with a ``ConfigError`` naming its key instead of failing every etcd call later.

The access carries a ``reload`` (``server.tls_reload.Reloading``): when a file changes
(cert-manager renewed the certificate, the Secret's password was changed), the files
are read and checked again within ``CHECK_EVERY_S`` of the next etcd call, and the
store's new channels use them. A replacement that fails the checks leaves the previous
access in force and is logged.
"""

from __future__ import annotations

import dataclasses
import pathlib
import ssl

from ha import ConfigError, EtcdAccess
from server.config import EtcdConfig
from server.tls_files import check_ca_bundle, check_cert_chain
from server.tls_reload import Reloading

__all__ = ["load_etcd_access"]


def load_etcd_access(etcd: EtcdConfig) -> EtcdAccess | None:
    """The TLS and auth settings the store needs, following their files (see module), or
    None when there are none.

    Raises:
        ConfigError: a file is unreadable, not PEM, a key that does not match its
            certificate, or an empty password; the path names the key.
    """
    if etcd.ca_file is None and etcd.username is None:
        return None
    files = (etcd.ca_file, etcd.cert_file, etcd.key_file, etcd.password_file)
    paths = [p for p in files if p is not None]
    # Each access built carries the function that returns the one in force (made
    # below, after the first build).
    made: list[Reloading[EtcdAccess]] = []

    def in_force() -> EtcdAccess:
        return made[0]()

    def build() -> EtcdAccess:
        return dataclasses.replace(_read_access(etcd), reload=in_force)

    made.append(Reloading(paths, build, what="etcd TLS material and password"))
    return made[0]()


def _read_access(etcd: EtcdConfig) -> EtcdAccess:
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
