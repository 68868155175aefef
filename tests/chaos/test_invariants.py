"""The checker itself: it must catch what it claims to catch."""

from tests.chaos.invariants import delivery_violations, segment_state_violations


def test_clean_run_has_no_violations() -> None:
    acked = [("a", 0), ("a", 1), ("b", 0)]
    assert delivery_violations(acked, [("b", 0), ("a", 0), ("a", 1)], exactly_once=True) == []


def test_missing_duplicate_and_reorder_are_caught() -> None:
    acked = [("a", 0), ("a", 1), ("a", 2)]
    found = delivery_violations(acked, [("a", 1), ("a", 0), ("a", 1)], exactly_once=True)
    assert any("duplicate" in p for p in found)
    assert any("#0 delivered after #1" in p for p in found)
    assert any("never delivered" in p for p in found)


def test_redelivery_is_fine_at_least_once() -> None:
    delivered = [("a", 0), ("a", 1), ("a", 0), ("a", 1), ("a", 2)]
    assert delivery_violations([("a", 2)], delivered, exactly_once=False) == []


def test_sealed_segment_must_be_terminated() -> None:
    assert segment_state_violations({0: ("SEALED", True), 1: ("ACTIVE", False)}) == []
    assert len(segment_state_violations({0: ("SEALED", False), 1: ("ACTIVE", True)})) == 2
