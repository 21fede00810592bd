"""measuring.timer: the order of the callables within a round of `rounds`, and `first_call_seconds`."""
from __future__ import annotations

import time

import pytest

from measuring import timer


def called_order(**options) -> list[str]:
    seen: list[str] = []
    calls = {key: (lambda key=key: seen.append(key)) for key in "abc"}
    samples = timer.rounds(calls, 4, **options)
    assert all(len(s) == 4 for s in samples.values())
    return seen


def test_rounds_keep_the_order_given_by_default():
    assert called_order() == list("abc" * 4)


def test_alternate_reverses_every_other_round():
    assert called_order(alternate=True) == list("abc" "cba" "abc" "cba")


def test_rotate_starts_each_round_at_the_next_callable():
    assert called_order(rotate=True) == list("abc" "bca" "cab" "abc")


def test_orders_are_taken_in_turn():
    assert called_order(orders=["cab", "bac"]) == list("cab" "bac" "cab" "bac")


def test_the_orders_exclude_each_other_and_must_list_every_callable():
    with pytest.raises(ValueError, match="pick one"):
        called_order(alternate=True, rotate=True)
    with pytest.raises(ValueError, match="pick one"):
        called_order(alternate=True, orders=["abc"])
    with pytest.raises(ValueError, match="each callable once"):
        called_order(orders=["abc", "ab"])


def test_first_call_seconds_times_one_call():
    seen: list[str] = []
    seconds = timer.first_call_seconds(lambda: seen.append("call") or time.sleep(0.01))
    assert seen == ["call"] and 0.01 <= seconds < 5
