"""apportion: largest-remainder reservations (docs/spec.md §3)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairshare import apportion


@pytest.mark.parametrize(
    ("capacity", "names", "shares", "expected"),
    [
        pytest.param(
            10,
            ["a", "b"],
            {"a": 0.8125, "b": 0.1875},
            {"a": 8, "b": 2},
            id="spec-81.25/18.75-of-10-is-8-and-2",
        ),
        pytest.param(
            3,
            ["a", "b", "c"],
            {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3},
            {"a": 1, "b": 1, "c": 1},
            id="spec-thirds-of-3",
        ),
        pytest.param(
            10,
            ["a", "b"],
            {"a": 0.25, "b": 0.25},
            {"a": 3, "b": 2},
            id="sum-below-1-leaves-slots-free-tie-to-first-name",
        ),
        pytest.param(
            10,
            ["a", "b"],
            {"a": 0.2, "b": 0.1},
            {"a": 2, "b": 1},
            id="sum-below-1-exact",
        ),
        pytest.param(
            10,
            ["a", "b"],
            {"a": 1.5, "b": 0.5},
            {"a": 8, "b": 2},
            id="sum-above-1-scaled-down",
        ),
        pytest.param(
            10,
            ["a", "b"],
            {"a": 3.0, "b": 3.0},
            {"a": 5, "b": 5},
            id="sum-above-1-equal",
        ),
        pytest.param(
            6,
            ["c", "b", "a"],
            {"a": 2.0, "b": 1.0, "c": 1.0},
            {"a": 3, "b": 2, "c": 1},
            id="sum-above-1-remainder-tie-to-first-name",
        ),
        pytest.param(
            10,
            ["a", "b"],
            {"a": 0.0, "b": 0.0},
            {"a": 0, "b": 0},
            id="zero-shares",
        ),
        pytest.param(
            10,
            ["a", "b"],
            {"a": 1.0, "b": 0.0},
            {"a": 10, "b": 0},
            id="one-zero-share",
        ),
        pytest.param(
            0,
            ["a", "b"],
            {"a": 0.5, "b": 0.5},
            {"a": 0, "b": 0},
            id="capacity-0",
        ),
        pytest.param(
            10,
            ["a", "x"],
            {"a": 0.5},
            {"a": 5, "x": 0},
            id="name-without-share-gets-0",
        ),
        pytest.param(
            10,
            ["z", "y", "x"],
            {"x": 1 / 3, "y": 1 / 3, "z": 1 / 3},
            {"x": 4, "y": 3, "z": 3},
            id="tie-goes-to-name-that-sorts-first",
        ),
        pytest.param(
            2,
            ["b", "B", "a"],
            {"a": 1 / 3, "b": 1 / 3, "B": 1 / 3},
            {"B": 1, "a": 1, "b": 0},
            id="tie-uses-plain-string-order",
        ),
        pytest.param(
            10,
            ["a", "b", "c"],
            {"a": 0.45, "b": 0.35, "c": 0.2},
            {"a": 5, "b": 3, "c": 2},
            id="largest-remainder-wins",
        ),
        pytest.param(
            100,
            ["a", "b"],
            {"a": 0.29, "b": 0.71},
            {"a": 29, "b": 71},
            id="float-0.29x100-is-29",
        ),
        pytest.param(
            10,
            ["a", "b"],
            {"a": 0.7, "b": 0.3},
            {"a": 7, "b": 3},
            id="float-0.7x10-is-7",
        ),
        pytest.param(
            100,
            ["a"],
            {"a": 0.29},
            {"a": 29},
            id="float-0.29x100-alone-is-29",
        ),
        pytest.param(
            10,
            ["a"],
            {"a": 0.7},
            {"a": 7},
            id="float-0.7x10-alone-is-7",
        ),
        pytest.param(
            1_781_045_877,
            ["a", "b"],
            {"a": 0.5, "b": 0.5},
            {"a": 890_522_939, "b": 890_522_938},
            id="large-capacity-half-slot-not-lost",
        ),
        pytest.param(
            10,
            [],
            {"a": 1.0},
            {},
            id="no-names",
        ),
        pytest.param(
            10,
            ["a", "a", "b"],
            {"a": 0.5, "b": 0.5},
            {"a": 5, "b": 5},
            id="duplicate-names-once",
        ),
        pytest.param(
            10,
            ["a", "b"],
            {"a": 1, "b": 0},
            {"a": 10, "b": 0},
            id="int-shares",
        ),
    ],
)
def test_apportion(
    capacity: int, names: list[str], shares: dict[str, float], expected: dict[str, int]
) -> None:
    assert apportion(capacity, names, shares) == expected


def test_apportion_accepts_any_iterable_of_names() -> None:
    assert apportion(4, iter(("a", "b")), {"a": 0.5, "b": 0.5}) == {"a": 2, "b": 2}


@pytest.mark.parametrize(
    ("capacity", "shares"),
    [
        pytest.param(10, {"a": math.nan}, id="nan-share"),
        pytest.param(10, {"a": -0.1}, id="negative-share"),
        pytest.param(10, {"a": math.inf}, id="inf-share"),
        pytest.param(10, {"a": -math.inf}, id="minus-inf-share"),
        pytest.param(10, {"a": 0.5, "b": math.nan}, id="nan-share-of-other-name"),
        pytest.param(-1, {"a": 0.5}, id="negative-capacity"),
        pytest.param(2.5, {"a": 0.5}, id="float-capacity"),
        pytest.param(True, {"a": 0.5}, id="bool-capacity"),
    ],
)
def test_apportion_rejects_bad_input(capacity: int, shares: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        apportion(capacity, ["a"], shares)


_share = st.floats(min_value=0.0, max_value=5.0, allow_nan=False, allow_infinity=False)
_names = st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=3), max_size=12, unique=True)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(min_value=0, max_value=10_000), data=st.data())
def test_apportion_never_exceeds_capacity(capacity: int, data: st.DataObject) -> None:
    names = data.draw(_names)
    shares = {n: data.draw(_share) for n in names}
    result = apportion(capacity, names, shares)
    assert set(result) == set(names)
    assert all(v >= 0 for v in result.values())
    assert sum(result.values()) <= capacity
    # Never more than the rounded-up quota of a name, never less than the rounded-down one.
    total = math.fsum(shares.values())
    scale = 1.0 / total if total > 1.0 else 1.0
    for n in names:
        quota = shares[n] * scale * capacity
        assert math.floor(quota) - 1 <= result[n] <= math.ceil(quota) + 1


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(min_value=0, max_value=10_000),
    weights=st.lists(st.integers(min_value=1, max_value=1000), min_size=1, max_size=12),
)
def test_apportion_fills_capacity_when_shares_sum_to_1(capacity: int, weights: list[int]) -> None:
    total = sum(weights)
    names = [f"t{i:02d}" for i in range(len(weights))]
    shares = {n: w / total for n, w in zip(names, weights, strict=True)}
    assert sum(apportion(capacity, names, shares).values()) == capacity


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(min_value=0, max_value=1000),
    percents=st.lists(st.integers(min_value=0, max_value=100), min_size=1, max_size=6),
)
def test_apportion_whole_percent_quotas_are_exact(capacity: int, percents: list[int]) -> None:
    """A share of p/100 of a multiple of 100 is a whole number and loses no slot."""
    c = capacity * 100
    total = sum(percents)
    if total > 100:
        return
    names = [f"t{i}" for i in range(len(percents))]
    shares = {n: p / 100 for n, p in zip(names, percents, strict=True)}
    result = apportion(c, names, shares)
    assert result == {n: p * capacity for n, p in zip(names, percents, strict=True)}


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        pytest.param(3_000_000_002, [1_000_000_001, 1_000_000_001, 1_000_000_000], id="3e9+2"),
        pytest.param(10**12 + 2, [333_333_333_334] * 3, id="1e12+2"),
        pytest.param(
            2**53 + 3,
            [3_002_399_751_580_332, 3_002_399_751_580_332, 3_002_399_751_580_331],
            id="2^53+3",
        ),
    ],
)
def test_apportion_thirds_of_a_huge_capacity_never_exceed_it(
    capacity: int, expected: list[int]
) -> None:
    result = apportion(capacity, ["a", "b", "c"], {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert [result[n] for n in "abc"] == expected
    assert sum(result.values()) == capacity


def test_apportion_whole_huge_capacity_above_float_precision() -> None:
    assert apportion(2**53 + 3, ["a"], {"a": 1.0}) == {"a": 2**53 + 3}


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(min_value=0, max_value=2**62), data=st.data())
def test_apportion_never_exceeds_a_huge_capacity(capacity: int, data: st.DataObject) -> None:
    names = data.draw(_names)
    shares = {n: data.draw(_share) for n in names}
    result = apportion(capacity, names, shares)
    assert all(v >= 0 for v in result.values())
    assert sum(result.values()) <= capacity


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(min_value=0, max_value=10**11),
    weights=st.lists(st.integers(min_value=1, max_value=1000), min_size=1, max_size=12),
)
def test_apportion_fills_a_large_capacity_when_shares_sum_to_1(
    capacity: int, weights: list[int]
) -> None:
    total = sum(weights)
    names = [f"t{i:02d}" for i in range(len(weights))]
    shares = {n: w / total for n, w in zip(names, weights, strict=True)}
    assert sum(apportion(capacity, names, shares).values()) == capacity
