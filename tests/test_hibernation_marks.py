"""Which segments a controller's maintenance rounds skip looking up (``runtime.hibernation.
HibernationMarks``), under the interleavings a loaded cluster makes rare: a reader's wake
starts a tiered segment in a worker thread while a round looks it up. A round whose
lookup found no process while a start was under way, or before one that finished, must
not mark it, or no round would observe it running again and it would never end when
idle (the cause of a CI failure of test_tiering). On real Ray: test_tiering's readers
that pause past ``idleS``."""

from __future__ import annotations

from runtime.hibernation import HibernationMarks

SEGMENT = "segment:ns/t/0000-3fff-3"


def round_finds_no_process(marks: HibernationMarks, starts: int) -> None:
    """A maintenance round's lookup, after it read ``starts``, found no process."""
    if not marks.marked(SEGMENT):
        marks.found_without_process(SEGMENT, starts)


def test_a_segment_found_without_a_process_is_marked_until_started() -> None:
    marks = HibernationMarks()
    round_finds_no_process(marks, marks.starts(SEGMENT))
    assert marks.marked(SEGMENT)
    marks.starting(SEGMENT)  # a reader wakes it
    assert not marks.marked(SEGMENT)
    marks.started(SEGMENT)
    assert not marks.marked(SEGMENT)


def test_a_lookup_made_while_a_start_runs_marks_nothing() -> None:
    marks = HibernationMarks()
    marks.starting(SEGMENT)
    starts = marks.starts(SEGMENT)  # the round reads, then looks up before registration
    round_finds_no_process(marks, starts)
    assert marks.marked(SEGMENT)  # for now: the start has not ended yet
    marks.started(SEGMENT)
    assert not marks.marked(SEGMENT)  # undone when the start ends


def test_a_lookup_that_preceded_a_finished_start_marks_nothing() -> None:
    marks = HibernationMarks()
    starts = marks.starts(SEGMENT)
    marks.starting(SEGMENT)  # the start begins and ends between the lookup and the mark
    marks.started(SEGMENT)
    round_finds_no_process(marks, starts)
    assert not marks.marked(SEGMENT)


def test_an_ended_segment_is_marked_until_started_again() -> None:
    marks = HibernationMarks()
    marks.ended(SEGMENT)
    assert marks.marked(SEGMENT)
    marks.starting(SEGMENT)
    marks.started(SEGMENT)
    assert not marks.marked(SEGMENT)
    assert not marks.marked("segment:ns/t/4000-7fff-4")  # marks are per segment
