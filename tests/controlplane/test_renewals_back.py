"""The renewals tell the runtime when the store answers again after an outage: a renewal
that succeeds after one or more failed calls ``on_back`` once (the runtime then has its
listeners listen again on new connections: `persistence._listening`); renewals that keep
succeeding never call it."""

from __future__ import annotations

import threading

from controlplane.runtime.lease._lease import Renewals
from controlplane.runtime.lease._own_lease import OwnLease
from controlplane.runtime.lease._renewer import Renewer
from tests.support import WAIT_S

LEASE_S = 0.4  # a renewal every 20 ms, a retry every 10 ms


class Store:
    """A store whose renewals fail while ``down`` is set; counts both."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.ok = 0
        self.failed = 0
        self.changed = threading.Condition()

    def renew(self, _bound_s: float) -> bool:
        with self.changed:
            down = self.down.is_set()
            if down:
                self.failed += 1
            else:
                self.ok += 1
            self.changed.notify_all()
        if down:
            raise OSError("the network is out")
        return True

    def wait_ok(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.ok >= count, WAIT_S)

    def wait_failed(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.failed >= count, WAIT_S)


def _renewing(store: Store, backs: list[int]) -> Renewer:
    renewals = Renewals(LEASE_S)
    lease = OwnLease("rt", LEASE_S, renewals, lambda _why: None, registered_at=0.0)
    renewer = Renewer(
        "rt", LEASE_S, store.renew, renewals, lease, lambda: None,
        on_back=lambda _sent_at: backs.append(store.ok),
    )  # fmt: skip
    renewer.start()
    return renewer


def test_renewals_that_keep_succeeding_never_say_the_store_is_back() -> None:
    store, backs = Store(), []
    renewer = _renewing(store, backs)
    try:
        assert store.wait_ok(10)
    finally:
        assert renewer.stop(WAIT_S)
    assert backs == []


def test_a_renewal_that_succeeds_after_failures_says_the_store_is_back_once() -> None:
    store, backs = Store(), []
    renewer = _renewing(store, backs)
    try:
        assert store.wait_ok(3)
        with store.changed:
            store.down.set()
            back_at = store.ok
        assert store.wait_failed(5)
        store.down.clear()
        assert store.wait_ok(back_at + 5)
    finally:
        assert renewer.stop(WAIT_S)
    assert len(backs) == 1
    assert backs[0] == back_at + 1  # the first success after the failures
