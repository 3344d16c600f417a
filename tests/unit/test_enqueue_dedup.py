"""Dedup on enqueue's decisions (`messenger.jobs.enqueue_dedup`), without a table: the key a push
claims, and what happens to a claim after its send."""

from __future__ import annotations

from typing import Any

import pytest

from messenger.errors import InvalidMessage, PublishFailed
from messenger.jobs.dedup import Claim, Duplicate, Held
from messenger.jobs.enqueue_dedup import EnqueueDedup


class Store:
    """A dedup store that answers from a script and records what it was told."""

    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.answers = answers or {}
        self.claimed: list[tuple[str, str, int, float | None]] = []
        self.released: list[Claim] = []
        self.marked: list[Claim] = []

    def claim(self, channel: str, key: str, window: int, wait_until: float | None) -> Any:
        self.claimed.append((channel, key, window, wait_until))
        answer = self.answers.get(key, Claim(f"{channel}#{key}", "token"))
        if isinstance(answer, Exception):
            raise answer
        return answer

    def release(self, claim: Claim) -> None:
        self.released.append(claim)

    def mark_sent(self, claims: list[Claim]) -> None:
        self.marked += claims


def flow(store: Store, enabled: bool = True, ordered: bool = False) -> EnqueueDedup:
    return EnqueueDedup(store, "jobs", 300, enabled, ordered, retry_budget=5.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(("enabled", "dedup", "dedup_id", "message_id", "expected"), [
    (True, None, None, "order-1", "order-1"),  # standard channel: the caller's id
    (True, None, None, None, None),  # no id named: every push is new
    (False, None, None, "order-1", None),  # dedup off
    (False, True, None, "order-1", "order-1"),  # the push turns it on
    (True, False, None, "order-1", None),  # the push turns it off
    (True, None, "d-1", "order-1", "d-1"),  # ordered: the deduplication id
    (False, None, "d-1", None, None),  # ordered, dedup off: SQS's own only
])
def test_the_key_a_push_claims(enabled, dedup, dedup_id, message_id, expected) -> None:
    assert flow(Store(), enabled).key(dedup_id, message_id, dedup, set()) == expected


def test_a_deduplication_id_repeated_in_one_call_or_sent_lately_is_a_duplicate() -> None:
    dedup = flow(Store(), enabled=False, ordered=True)
    taken: set[str] = set()
    assert dedup.key("d-1", None, None, taken) is None
    assert dedup.key("d-1", None, None, taken) == Duplicate("d-1", 0.0)
    dedup.remember(["d-2", None])
    assert dedup.key("d-2", None, None, set()) == Duplicate("d-2", 0.0)


def test_a_dedup_setting_that_is_not_a_bool_is_named() -> None:
    with pytest.raises(InvalidMessage, match="dedup must be True, False or None, got 'yes'"):
        flow(Store()).key(None, "order-1", "yes", set())  # type: ignore[arg-type]


def test_a_claim_is_marked_after_its_send_and_given_back_when_the_send_fails() -> None:
    store = Store()
    dedup = flow(store)
    claim = dedup.claim_for_push("order-1")
    assert isinstance(claim, Claim) and store.claimed[0][:3] == ("jobs", "order-1", 300)
    assert store.claimed[0][3] is not None  # a push waits on a held id, within its budget
    with dedup.sending(claim):
        pass
    assert (store.marked, store.released) == ([claim], [])
    with pytest.raises(OSError), dedup.sending(claim):
        raise OSError("send failed")
    assert (store.marked, store.released) == ([claim], [claim])


def test_an_id_still_held_elsewhere_fails_the_push_unsent() -> None:
    dedup = flow(Store({"order-1": Held("jobs#order-1", 0.0)}))
    with pytest.raises(PublishFailed, match="being pushed by another producer"):
        dedup.claim_for_push("order-1")


def test_a_batch_sorts_its_items_by_what_their_claims_say() -> None:
    store = Store({"b": Duplicate("jobs#b", 1.0), "c": Held("jobs#c", 9.0),
                   "d": OSError("throttled")})
    dedup = flow(store)
    found = dedup.claim_batch([(0, "a"), (1, "b"), (2, "c"), (3, "d"), (4, None)], None)
    assert found.ready == [0, 4] and list(found.claims) == [0]
    assert found.duplicates == [1] and list(found.held) == [2] and list(found.errors) == [3]
    # Then after the send, a sent item's claim is marked (in batches), an unsent one released
    marks = dedup.marks()
    dedup.settle({0: found.claims[0], 9: Claim("jobs#z", "t")}, {0}, marks)
    marks.flush()
    assert store.marked == [found.claims[0]] and store.released == [Claim("jobs#z", "t")]
