"""fairshare.filewatch: a value read from files, read again when they change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fairshare.filewatch import Followed, stamp, stamps


class Broken(ValueError):
    """What the reader below raises for a file it cannot use."""


class Reader:
    """Reads the files it is given: their texts joined; counts its reads."""

    def __init__(self, *paths: Path) -> None:
        self.paths = paths
        self.reads = 0

    def __call__(self) -> str:
        self.reads += 1
        texts = [path.read_text() for path in self.paths]
        if any(text.startswith("broken") for text in texts):
            raise Broken("broken file")
        return "+".join(texts)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def replace(path: Path, text: str) -> None:
    """Replaces ``path`` as Kubernetes does: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "key"
    path.write_text("one")
    return path


def test_a_stamp_tells_a_replaced_file_apart(key: Path) -> None:
    before = stamp(key)
    assert before is not None
    assert stamp(key) == before, "an unchanged file keeps its stamp"
    replace(key, "one")
    assert stamp(key) != before, "the same bytes in a new file: a new stamp"
    assert stamp(key.with_name("absent")) is None
    assert stamps([key, key.with_name("absent")]) == (stamp(key), None)


def test_the_files_are_read_at_start_and_again_when_they_change(key: Path) -> None:
    read = Reader(key)
    seen: list[tuple[str, str]] = []
    followed = Followed(
        [key],
        read,
        keep_on=(Broken,),
        recheck_s=0,
        on_read=lambda previous, new: seen.append((previous, new)),
    )
    assert (followed(), read.reads) == ("one", 1), "unchanged: not read again"
    replace(key, "two")
    assert followed() == "two"
    assert followed() == "two"
    key.write_text("three, in place")
    assert followed() == "three, in place"
    assert read.reads == 3
    assert seen == [("one", "two"), ("two", "three, in place")], "the first read is not told"


def test_a_first_read_that_fails_is_the_callers(key: Path) -> None:
    key.write_text("broken")
    with pytest.raises(Broken):
        Followed([key], Reader(key), keep_on=(Broken,))


def test_a_broken_version_keeps_the_value_and_is_not_read_again(key: Path) -> None:
    read = Reader(key)
    kept: list[Exception] = []
    followed = Followed([key], read, keep_on=(Broken,), recheck_s=0, on_kept=kept.append)
    first = followed()
    replace(key, "broken")
    assert followed() is first, "the same object stays in force"
    assert followed() is first
    assert read.reads == 2, "the broken version is read once"
    assert [str(e) for e in kept] == ["broken file"]
    replace(key, "fixed")
    assert followed() == "fixed"


def test_an_error_not_kept_reaches_the_caller_once(key: Path) -> None:
    read = Reader(key)
    followed = Followed([key], read, keep_on=(OSError,), recheck_s=0)
    replace(key, "broken")
    with pytest.raises(Broken):
        followed()
    assert followed() == "one", "the value in force stays; that version is not read again"
    assert read.reads == 2


def test_the_files_are_looked_at_once_per_recheck(key: Path) -> None:
    clock = Clock()
    followed = Followed([key], Reader(key), keep_on=(Broken,), recheck_s=5.0, clock=clock)
    replace(key, "two")
    clock.now += 4.9
    assert followed() == "one", "within recheck_s: not looked at"
    clock.now += 0.1
    assert followed() == "two"
    replace(key, "three")
    clock.now += 4.9
    assert followed() == "two", "recheck_s counts from the last look"


def test_a_value_given_is_in_force_until_the_files_change(key: Path) -> None:
    read = Reader(key)
    followed = Followed([key], read, keep_on=(Broken,), value="given", recheck_s=0)
    assert (followed(), read.reads) == ("given", 0)
    replace(key, "two")
    assert followed() == "two"


def test_a_stale_value_is_read_again_at_the_first_look(key: Path) -> None:
    read = Reader(key)
    followed = Followed([key], read, keep_on=(Broken,), value="given", stale=True, recheck_s=0)
    assert followed.value == "given", "the value in force, without a look"
    assert (followed(), read.reads) == ("one", 1)
    assert (followed(), read.reads) == ("one", 1)


def test_an_absent_file_is_no_change_by_default(key: Path) -> None:
    read = Reader(key)
    kept: list[Exception] = []
    followed = Followed([key], read, keep_on=(Broken,), recheck_s=0, on_kept=kept.append)
    key.unlink()
    assert (followed(), read.reads, kept) == ("one", 1, [])
    key.write_text("back")
    assert followed() == "back"


def test_an_absent_file_can_count_as_a_change(key: Path) -> None:
    read = Reader(key)
    kept: list[Exception] = []
    followed = Followed(
        [key],
        read,
        keep_on=(Broken, OSError),
        recheck_s=0,
        absent_is_change=True,
        on_kept=kept.append,
    )
    key.unlink()
    assert (followed(), read.reads) == ("one", 2)
    assert [type(e) for e in kept] == [FileNotFoundError]
    assert (followed(), read.reads) == ("one", 2), "still absent: no change"
    key.write_text("back")
    assert followed() == "back"


def test_a_change_of_any_file_reads_them_all(tmp_path: Path, key: Path) -> None:
    other = tmp_path / "other"
    other.write_text("a")
    followed = Followed([key, other], Reader(key, other), keep_on=(Broken,), recheck_s=0)
    assert followed() == "one+a"
    replace(other, "b")
    assert followed() == "one+b"
