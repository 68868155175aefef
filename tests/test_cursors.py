from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import InvalidArgumentError, SubscriptionNotFoundError
from storage.cursors import Cursor, CursorStore


def test_cumulative_ack_moves_forward_only() -> None:
    cursor = Cursor("sub", mark_delete=5)
    assert cursor.ack_cumulative(9)
    assert cursor.mark_delete == 10
    assert not cursor.ack_cumulative(3)
    assert not cursor.ack_cumulative(9)
    assert cursor.mark_delete == 10
    assert cursor.is_acked(9) and not cursor.is_acked(10)


def test_individual_acks_leave_holes_and_normalize() -> None:
    cursor = Cursor("sub")
    assert cursor.ack([3, 4, 7, 5])
    assert cursor.acked_ranges == ((3, 6), (7, 8))
    assert [cursor.is_acked(o) for o in range(9)] == [
        False, False, False, True, True, True, False, True, False,
    ]  # fmt: skip
    assert cursor.backlog(10) == 6
    assert cursor.first_unacked(0) == 0
    assert cursor.first_unacked(3) == 6
    assert cursor.first_unacked(7) == 8
    assert not cursor.ack([3, 7])

    assert cursor.ack([0, 1, 2])  # fills the first hole: folded into mark_delete
    assert (cursor.mark_delete, cursor.acked_ranges) == (6, ((7, 8),))
    assert cursor.ack([6])
    assert (cursor.mark_delete, cursor.acked_ranges) == (8, ())

    cursor.ack([20, 21])
    cursor.ack_cumulative(19)  # reaches the range: folded too
    assert (cursor.mark_delete, cursor.acked_ranges) == (22, ())


def test_backlog_counts_unacked_below_end() -> None:
    cursor = Cursor("sub", mark_delete=10, acked_ranges=[(12, 15), (20, 30)])
    assert cursor.backlog(5) == 0
    assert cursor.backlog(12) == 2
    assert cursor.backlog(13) == 2
    assert cursor.backlog(25) == 2 + 5
    assert cursor.backlog(40) == 40 - 10 - 3 - 10


def test_constructor_normalizes_and_round_trips() -> None:
    cursor = Cursor("sub", mark_delete=2, acked_ranges=[(5, 6), (0, 3), (6, 8), (9, 9)])
    assert (cursor.mark_delete, cursor.acked_ranges) == (3, ((5, 8),))
    assert Cursor.from_dict(cursor.to_dict()) == cursor
    with pytest.raises(InvalidArgumentError):
        Cursor.from_dict({"name": "sub"})
    with pytest.raises(InvalidArgumentError):
        cursor.ack([-1])
    with pytest.raises(InvalidArgumentError):
        cursor.ack_cumulative(-1)


def test_store_creates_earliest_and_latest(tmp_path: Path) -> None:
    store = CursorStore(tmp_path, fsync=False)
    assert store.create("early", "earliest", start_offset=5, end_offset=50).mark_delete == 5
    assert store.create("late", "latest", start_offset=5, end_offset=50).mark_delete == 50
    store.ack_cumulative("early", 9)
    again = store.create("early", "latest", start_offset=0, end_offset=100)
    assert again.mark_delete == 10  # idempotent: the existing cursor is untouched
    assert store.names() == ["early", "late"]
    with pytest.raises(InvalidArgumentError):
        store.create("x", "middle", 0, 0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        store.create("x", "earliest", 5, 1)


def test_store_persists_across_reopen(tmp_path: Path) -> None:
    store = CursorStore(tmp_path, fsync=True)
    store.create("queue", "earliest", 0, 100)
    store.ack("queue", [5, 6, 9])
    store.ack_cumulative("queue", 2)
    store.create("gone", "earliest", 0, 100)
    store.delete("gone")
    store.delete("gone")
    snapshot = store.get("queue")
    snapshot.ack_cumulative(50)  # a snapshot: the store is not changed by this
    assert store.get("queue").mark_delete == 3

    (tmp_path / "cursors" / ".queue.json.tmp").write_text("{torn")
    reopened = CursorStore(tmp_path, fsync=False)
    assert reopened.names() == ["queue"]
    cursor = reopened.get("queue")
    assert (cursor.mark_delete, cursor.acked_ranges) == (3, ((5, 7), (9, 10)))
    assert sorted(p.name for p in (tmp_path / "cursors").iterdir()) == ["queue.json"]
    stored = json.loads((tmp_path / "cursors" / "queue.json").read_text())
    assert stored == cursor.to_dict()


def test_store_missing_subscription(tmp_path: Path) -> None:
    store = CursorStore(tmp_path, fsync=False)
    with pytest.raises(SubscriptionNotFoundError):
        store.get("nope")
    with pytest.raises(SubscriptionNotFoundError):
        store.ack("nope", [1])
    with pytest.raises(SubscriptionNotFoundError):
        store.ack_cumulative("nope", 1)


@pytest.mark.parametrize("name", ["", "a/b", "../x", "a b", "x" * 129, "sub\n", None])
def test_invalid_names_are_refused(tmp_path: Path, name: str) -> None:
    store = CursorStore(tmp_path, fsync=False)
    with pytest.raises(InvalidArgumentError):
        store.create(name, "earliest", 0, 0)
    with pytest.raises(InvalidArgumentError):
        store.delete(name)


def test_valid_names_cover_the_whole_alphabet(tmp_path: Path) -> None:
    store = CursorStore(tmp_path, fsync=False)
    for name in ["a", "A.b_c=d-e", "9" * 128, "x.json"]:
        store.create(name, "earliest", 0, 0)
    assert CursorStore(tmp_path, fsync=False).names() == sorted(
        ["a", "A.b_c=d-e", "9" * 128, "x.json"]
    )


# --- property: the cursor behaves like a set of acked offsets ----------------------

actions = st.lists(
    st.one_of(
        st.tuples(st.just("cumulative"), st.integers(0, 60)),
        st.tuples(st.just("ack"), st.lists(st.integers(0, 60), max_size=8)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10), actions)
def test_cursor_matches_set_model(start: int, steps: list[tuple[str, object]]) -> None:
    cursor = Cursor("model", mark_delete=start)
    acked = set(range(start))
    for kind, argument in steps:
        if kind == "cumulative":
            assert isinstance(argument, int)
            cursor.ack_cumulative(argument)
            acked |= set(range(argument + 1))
        else:
            assert isinstance(argument, list)
            cursor.ack(argument)
            acked |= set(argument)
        first_hole = min(set(range(70)) - acked)
        assert cursor.mark_delete == first_hole
        ranges = cursor.acked_ranges
        assert all(start > cursor.mark_delete for start, _ in ranges)
        assert all(left[1] < right[0] for left, right in zip(ranges, ranges[1:], strict=False))
        for offset in range(70):
            assert cursor.is_acked(offset) == (offset in acked)
            assert cursor.backlog(offset) == offset - len({o for o in acked if o < offset})
            assert cursor.first_unacked(offset) == min(
                o for o in range(offset, 80) if o not in acked
            )
        assert Cursor.from_dict(cursor.to_dict()) == cursor


def _on_disk(tmp_path: Path, name: str) -> int:
    return json.loads((tmp_path / "cursors" / f"{name}.json").read_text())["mark_delete"]


def test_an_ack_saved_later_is_in_memory_at_once_and_on_disk_when_saved(tmp_path: Path) -> None:
    store = CursorStore(tmp_path, fsync=False)
    store.create("s", "earliest", 0, 100)
    assert store.ack_cumulative("s", 9, save_later=True) is True  # a save is owed
    assert store.ack_cumulative("s", 4, save_later=True) is False  # backwards: nothing moved
    assert store.get("s").mark_delete == 10
    assert _on_disk(tmp_path, "s") == 0
    assert CursorStore(tmp_path, fsync=False).get("s").mark_delete == 0  # a crash now
    store.save_unsaved()
    assert _on_disk(tmp_path, "s") == 10
    assert store.ack_cumulative("s", 20) is False  # saved on the call: nothing owed
    assert _on_disk(tmp_path, "s") == 21


def test_a_save_later_never_undoes_a_reset_or_a_delete(tmp_path: Path) -> None:
    store = CursorStore(tmp_path, fsync=False)
    store.create("reset", "earliest", 0, 100)
    store.create("gone", "earliest", 0, 100)
    store.ack_cumulative("reset", 50, save_later=True)
    store.ack_cumulative("gone", 50, save_later=True)
    store.move("reset", 5)  # saved at once; the deferred ack is superseded
    store.delete("gone")
    store.save_unsaved()
    assert _on_disk(tmp_path, "reset") == 5
    assert not (tmp_path / "cursors" / "gone.json").exists()
    assert CursorStore(tmp_path, fsync=False).names() == ["reset"]


def test_abandoned_acks_are_not_saved(tmp_path: Path) -> None:
    store = CursorStore(tmp_path, fsync=False)
    store.create("s", "earliest", 0, 100)
    store.ack_cumulative("s", 7, save_later=True)
    store.abandon_unsaved()
    store.save_unsaved()
    assert _on_disk(tmp_path, "s") == 0


def test_a_follower_holds_exactly_the_cursors_its_leader_exported(tmp_path: Path) -> None:
    """``export``/``adopt``: how a replicated segment's cursors reach its followers. Every
    change raises the version (deferred acks too, before they are saved); what a follower
    adopts is saved, replaces what it held, and is there after a restart."""
    leader = CursorStore(tmp_path / "leader")
    follower = CursorStore(tmp_path / "follower")
    follower.create("gone", "earliest", 0, 0)  # held from an older export
    versions = [leader.version]
    leader.create("s", "earliest", 0, 100)
    leader.create("q", "latest", 0, 100)
    versions.append(leader.version)
    leader.ack_cumulative("s", 9, save_later=True)
    versions.append(leader.version)
    leader.ack("q", [101, 103])
    versions.append(leader.version)
    assert versions == sorted(set(versions))  # each change a newer version
    version, exported = leader.export()
    assert version == leader.version
    follower.adopt(exported)
    assert {c.name: c for c in follower.snapshot()} == {c.name: c for c in leader.snapshot()}
    assert follower.get("s").mark_delete == 10  # the ack the leader had not saved yet
    restarted = CursorStore(tmp_path / "follower")
    assert sorted(restarted.names()) == ["q", "s"]
    assert restarted.get("q").acked_ranges == ((101, 102), (103, 104))
    # A store restarted does not repeat a version a follower may hold
    assert CursorStore(tmp_path / "leader").version != version
    for garbage in (b"{", b'{"s": 1}', b'[{"name": "s"}]', b"[1]"):
        with pytest.raises(InvalidArgumentError):
            restarted.adopt(garbage)
    assert sorted(restarted.names()) == ["q", "s"]
