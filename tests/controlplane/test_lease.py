"""`Renewals`: when a runtime's own renewals let it take another's lapsed lease for death."""

from __future__ import annotations

from controlplane.runtime.lease._lease import Renewals

TTL = 3.0


class Clock:
    """A monotonic clock the test moves by hand (the thing under test reads only it)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _renew(renewals: Renewals, clock: Clock, *, takes: float = 0.01, ok: bool = True) -> None:
    sent = renewals.sending()
    clock.now += takes
    if ok:
        renewals.renewed(sent)
    else:
        renewals.failed(sent)


def _steady_renewals(renewals: Renewals, clock: Clock, seconds: float) -> None:
    for _ in range(round(seconds / (TTL / 3))):
        clock.now += TTL / 3
        _renew(renewals, clock)


def test_the_run_starts_at_registration_and_grows_with_each_renewal() -> None:
    clock = Clock()
    renewals = Renewals(TTL, clock=clock)
    assert renewals.steady_for() == 0.0
    assert renewals.last_renewed is None
    _steady_renewals(renewals, clock, TTL)
    assert renewals.steady_for() >= TTL
    assert renewals.last_renewed == clock.now - 0.01


def test_a_failed_renewal_breaks_the_run_until_the_next_success() -> None:
    clock = Clock()
    renewals = Renewals(TTL, clock=clock)
    _steady_renewals(renewals, clock, 2 * TTL)
    _renew(renewals, clock, ok=False)
    assert renewals.steady_for() == 0.0
    clock.now += TTL
    assert renewals.steady_for() == 0.0  # still no success: still no run
    _renew(renewals, clock)
    assert renewals.steady_for() == 0.0
    _steady_renewals(renewals, clock, TTL)
    assert renewals.steady_for() >= TTL - 0.1


def test_a_renewal_the_store_held_for_a_period_breaks_the_run() -> None:
    # A locked or restarting store answers late: the success is no proof it was up.
    clock = Clock()
    renewals = Renewals(TTL, clock=clock)
    _steady_renewals(renewals, clock, 2 * TTL)
    sent = renewals.sending()
    clock.now += TTL / 3 + 0.1
    assert renewals.steady_for() == 0.0  # unanswered for over a period: not now either
    renewals.renewed(sent)
    assert renewals.steady_for() == 0.0
    _steady_renewals(renewals, clock, TTL)
    assert renewals.steady_for() >= TTL - 0.1
    assert renewals.last_renewed is not None


def test_a_gap_longer_than_the_lease_breaks_the_run() -> None:
    # This runtime was not looking (stopped, starved): the store may have been down.
    clock = Clock()
    renewals = Renewals(TTL, clock=clock)
    _steady_renewals(renewals, clock, 2 * TTL)
    clock.now += TTL * 1.5
    assert renewals.steady_for() == 0.0
    _renew(renewals, clock)
    assert renewals.steady_for() == 0.0
