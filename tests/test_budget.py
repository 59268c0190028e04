"""Meter: budget checks against usage, calls in flight and the final-answer reserve."""

from __future__ import annotations

import pytest

from corag.budget import BudgetExceeded, Meter
from corag.types import Usage


def test_without_a_budget_everything_fits():
    meter = Meter()
    meter.check(10**9)
    assert meter.fits(10**9) and meter.left is None


def test_reserve_is_only_for_final_calls():
    meter = Meter(budget=100, reserve=30)
    meter.charge(Usage(60, 0, 1))
    with pytest.raises(BudgetExceeded):
        meter.check(11)
    meter.check(10)
    meter.check(40, final=True)
    with pytest.raises(BudgetExceeded):
        meter.check(41, final=True)
    assert meter.left == 40


def test_calls_in_flight_count_against_the_budget():
    meter = Meter(budget=100)
    meter.pending = 50
    meter.check(50)
    with pytest.raises(BudgetExceeded, match="in flight"):
        meter.check(51)
    assert meter.fits(50) and not meter.fits(51)


def test_charges_add_up():
    meter = Meter(budget=100)
    meter.charge(Usage(10, 5, 1))
    meter.charge(Usage(1, 2, 1))
    assert meter.usage == Usage(11, 7, 2) and meter.usage.total == 18 and meter.left == 82
