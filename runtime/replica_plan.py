"""What a topic's controller does next for one replicated segment, from what its replicas
answered: nothing, tell a replica its role, replace or rebuild a follower, or elect a
leader.

The controller's maintenance round asks each replica of each replicated segment for its
role (``Segment.replica_status``), then calls ``next_steps`` and carries the steps out;
this module decides, without Ray, so every case is a unit test. The record
(``storage.replica_sets.ReplicaSet``) is the authority: a replica whose role differs from
it is told (a host restarted opens its segments with no role; a stale leader that lost an
election is told to follow), and one that does not answer is waited for until ``gone``
says its node is lost (the controller's to decide: Ray reports the node dead, or the
replica stayed silent past a grace period).

Why a leader that restarted is never told to lead again: its log may have lost an
unflushed tail that its followers copied (``storage.replica_log.LeaderReplica``), so it
leads only through an election, at a new epoch, which it wins only if no replica holds
more. Why an election needs ``reports_needed`` answers: ``runtime.replication``.

A replica whose files were removed from its disk while it runs (it says so: ``lost``)
still answers, and still writes to the removed files: it is no candidate in an election
and, as a follower, is rebuilt in place (laid out empty again, it copies the leader's
log); a leader that lost them first loses the lead to a replica that did not.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from runtime.replication import FIRST_EPOCH, Replication


@dataclass(frozen=True)
class RoleAnswer:
    """What a replica said of itself: ``leader``, ``follower`` or ``none`` (opened, told
    nothing yet), the epoch it leads or follows, and whether its files are gone from its
    disk."""

    role: str
    epoch: int
    lost: bool = False


@dataclass(frozen=True)
class HandOver:
    """Move the lead to follower ``to``, in sync and off the controller's node: the
    leader stops taking appends until ``to`` holds its whole log, then an election among
    every replica chooses ``to`` (as up to date as the leader, and not avoided)."""

    to: str


@dataclass(frozen=True)
class Elect:
    """Fence ``candidates`` at the next epoch, choose among their reports, record the
    choice by compare-and-swap, then tell the chosen to lead and the others to follow.
    ``also_fenced``: replicas fenced too but never chosen (they lost their files)."""

    candidates: tuple[str, ...]
    also_fenced: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tell:
    """Tell ``replica`` its role of the current epoch again (``lead`` is never told here:
    see the module's docstring)."""

    replica: str


@dataclass(frozen=True)
class Replace:
    """Follower ``gone`` (its node is lost) is replaced by a new replica on ``new``, which
    copies the leader's log from its start."""

    gone: str
    new: str


@dataclass(frozen=True)
class Rebuild:
    """Follower ``replica`` lost its files: closed, laid out empty on its disk again and
    reopened, it copies the leader's log from its start."""

    replica: str


@dataclass(frozen=True)
class Resize:
    """The policy's factor differs from the segment's: ``factor`` replicas from now on,
    the followers ``new`` added (disks of free nodes; each copies the leader's log from
    its start), or the last followers dropped."""

    factor: int
    new: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unavailable:
    """Nothing can be done until nodes come back: why, for the segment's status."""

    why: str


Step = Elect | HandOver | Tell | Replace | Rebuild | Resize | Unavailable


def next_steps(
    replicas: Sequence[str],
    epoch: int,
    answers: Mapping[str, RoleAnswer | None],
    gone: set[str],
    free_disks: Sequence[str],
    replication: Replication,
) -> list[Step]:
    """The steps for a segment whose record says ``replicas`` (the leader first) at
    ``epoch``: ``answers`` holds each replica's answer (``None``: it did not answer);
    ``gone``: the replicas whose nodes are lost (not only slow); ``free_disks``: live node
    disks holding no replica, the preferred first."""
    leader, followers = replicas[0], replicas[1:]
    said = answers.get(leader)
    if said is None and leader not in gone:
        return []  # slow, not lost: an election now would fail over on every pause
    if said != RoleAnswer("leader", epoch):
        election = _election(replicas, answers, replication)
        if epoch == FIRST_EPOCH and said is not None and isinstance(election, Unavailable):
            return _replace_unelected(followers, gone, free_disks) or [election]
        return [election]
    steps: list[Step] = []
    free = list(free_disks)
    for follower in followers:
        answer = answers.get(follower)
        if answer is not None and answer.lost:
            steps.append(Rebuild(follower))
        elif answer == RoleAnswer("follower", epoch):
            continue
        elif answer is not None:
            steps.append(Tell(follower))
        elif follower in gone and free:
            steps.append(Replace(follower, free.pop(0)))
        elif follower in gone:
            steps.append(Unavailable(f"follower {follower} is lost and no other node is free"))
    return steps


def _replace_unelected(
    followers: Sequence[str], gone: set[str], free_disks: Sequence[str]
) -> list[Step]:
    """Followers of a segment that has had no election, lost before it could have one, each
    replaced by a free disk: a follower copies only from an elected leader, so these hold
    nothing, and without them the first election would wait for nodes that never come
    back (a segment placed on a node that was already lost, before Ray said so). Only
    while its leader answers: that one may hold a copy from before it was replicated."""
    lost = [follower for follower in followers if follower in gone]
    return [Replace(follower, disk) for follower, disk in zip(lost, free_disks, strict=False)]


def _election(
    replicas: Sequence[str], answers: Mapping[str, RoleAnswer | None], replication: Replication
) -> Step:
    answering = tuple(replica for replica in replicas if _candidate(answers.get(replica)))
    if len(answering) < replication.reports_needed:
        missing = ", ".join(
            f"{replica} {'lost its files' if answers.get(replica) else 'does not answer'}"
            for replica in replicas
            if replica not in answering
        )
        return Unavailable(
            f"its leader {replicas[0]} does not lead, and an election needs "
            f"{replication.reports_needed} of {replication.factor} replicas with their "
            f"files; {len(answering)} answer ({missing})"
        )
    lost = tuple(r for r in replicas if (answer := answers.get(r)) is not None and answer.lost)
    return Elect(answering, lost)


def _candidate(answer: RoleAnswer | None) -> bool:
    return answer is not None and not answer.lost


def resize_steps(
    replicas: Sequence[str],
    answering: Sequence[str],
    leader_ack_quorum: int | None,
    free_disks: Sequence[str],
    replication: Replication,
) -> list[Step]:
    """For a segment with nothing else to do (``next_steps`` gave no step: its leader
    leads the record's epoch), what brings it to the policy in force: as many replicas as
    the factor (added while free nodes last, the last followers dropped when fewer are
    asked for), then a leader counting the policy's ack quorum, which takes an election
    (a leader's quorum is fixed when it takes the lead: ``leader_ack_quorum``, ``None``
    when it did not say). ``answering``: the replicas that answered."""
    count = len(replicas)
    if replication.factor < count:
        return [Resize(replication.factor)]
    if replication.factor > count and free_disks:
        new = tuple(free_disks[: replication.factor - count])
        return [Resize(count + len(new), new)]
    if leader_ack_quorum in (None, replication.ack_quorum):
        return []
    if len(answering) < replication.reports_needed:
        return []
    return [Elect(tuple(answering))]


def hand_over_steps(
    replicas: Sequence[str],
    epoch: int,
    answers: Mapping[str, RoleAnswer | None],
    in_sync: Collection[str],
    avoid: Collection[str],
) -> list[Step]:
    """For a segment with nothing else to do, led from a disk in ``avoid`` (the
    controller's node: losing it would take the leader and the controller together, and
    the segment would wait for Ray to restart the controller elsewhere): hand the lead to
    the first follower elsewhere that follows this epoch and is ``in_sync``; none when
    no such follower is there."""
    leader = replicas[0]
    if leader not in avoid or answers.get(leader) != RoleAnswer("leader", epoch):
        return []
    for follower in replicas[1:]:
        following = answers.get(follower) == RoleAnswer("follower", epoch)
        if follower not in avoid and follower in in_sync and following:
            return [HandOver(follower)]
    return []
