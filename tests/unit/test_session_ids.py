"""A holder session's id is derived from its secret (fairshare/sessions.py): a caller that
knows another client's session id (grant ids carry it) cannot present it with a secret of
its own, so it can neither take the session over nor open it first at a pool where it is
not open yet, which would lock its client out there until it lapsed."""

from __future__ import annotations

import pytest

from fairshare.errors import InvalidArgument
from fairshare.sessions import Session, derive_id, new_session, session_id


def test_a_new_session_parses_and_its_id_is_its_secrets() -> None:
    text = new_session()
    session = Session.parse(text)
    assert session.id == session_id(text) == derive_id(text.partition(".")[2])
    assert session.digest not in text  # the owner's digest is not the public id


def test_an_id_with_another_secret_is_refused() -> None:
    victim, intruder = new_session(), new_session()
    squatted = f"{session_id(victim)}.{intruder.partition('.')[2]}"
    with pytest.raises(InvalidArgument) as info:
        Session.parse(squatted)
    assert info.value.field == "fairshare-session"


def test_ids_differ_for_different_secrets() -> None:
    assert len({session_id(new_session()) for _ in range(100)}) == 100
