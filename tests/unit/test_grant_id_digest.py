"""Grant ids stay out of error messages: a malformed id is named by its digest only."""

from __future__ import annotations

import hashlib

import pytest

from fairshare import Class
from fairshare.client import ClientGrant
from fairshare.digest import grant_id_digest
from fairshare.errors import InvalidArgument
from fairshare.ids import GrantRef


def test_the_digest_is_stable_short_and_the_sha256_of_the_id() -> None:
    # A fixed vector: the digest must not change across processes or versions, or the
    # lines of one grant could no longer be found by its id.
    assert grant_id_digest("g3.1.2.abc") == "sha256:6788eb185a87"
    grant_id = "g3.1f.2a.Z3B1LWE.aW5zdC1h.Z3ctMQ.w.0123456789abcdefghijkl"
    expected = hashlib.sha256(grant_id.encode()).hexdigest()[:12]
    assert grant_id_digest(grant_id) == f"sha256:{expected}"
    assert grant_id_digest(grant_id) != grant_id_digest(grant_id + "x")
    assert len(grant_id_digest("x" * 100_000)) == len("sha256:") + 12
    assert grant_id_digest("\ud800").startswith("sha256:")  # any text, even unencodable


@pytest.mark.parametrize(
    "grant_id",
    [
        "a-secret-capability-not-an-id",  # wrong form
        "g3.zz.1.Z3B1LWE.aW5zdC1h.Z3ctMQ.w.secretmac000000000000",  # bad epoch
        "g3.1.1.Z3B1LWE.aW5zdC1h.Z3ctMQ.q.secretmac000000000000",  # bad standing
        "g2.1.1..aW5zdC1h.Z3ctMQ.secretmac000000000000",  # no pool
    ],
)
def test_a_malformed_ids_error_names_its_digest_not_the_id(grant_id: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        GrantRef.decode(grant_id)
    message = str(caught.value)
    assert caught.value.field == "grant_id"
    assert grant_id_digest(grant_id) in message
    assert grant_id not in message and "secret" not in message


def test_a_client_grants_repr_leaves_its_id_out() -> None:
    grant = ClientGrant(
        pool="gpu-a",
        team="inst-a",
        service_class=Class.INTERACTIVE,
        est_tokens=0,
        grant_id="g3.1.1.Z3B1LWE.aW5zdC1h.Z3ctMQ.w.secretmac000000000000",
        priority=1,
        borrowing=False,
        saturated=False,
        degraded=False,
        owner="test-0",
        epoch=1,
    )
    assert "secretmac" not in repr(grant) and "gpu-a" in repr(grant)
