"""The controller's background loop: metrics, automatic scaling, retention, tiering.

Each round reads the topic record and every segment's stats once, then
publishes gauges, asks ``runtime.autoscale`` whether to split or merge, and
asks ``runtime.retention`` what to prune. All decisions are pure functions;
this loop only gathers facts and calls the controller's ordinary (locked,
fenced, checked) operations as the system (the cluster's internal credential),
so automatic and manual changes share one path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors.control.tiering import TierMover
from actors.control.topic_parts import LayoutCommands, TopicParts
from runtime.autoscale import AckCounter, Decision, LoadTracker, decide
from runtime.backlog import BacklogAges
from runtime.config import env_float
from runtime.errors import (
    ConflictError,
    InsufficientCapacityError,
    ScalableTopicsError,
    StaleEpochError,
    TopicNotFoundError,
)
from runtime.hibernation import idle_drained, idle_tiered
from runtime.layout import SegmentInfo, SegmentLayout, SegmentState
from runtime.operations import OperationKind
from runtime.policy import AutoscalePolicy, RetentionPolicy, TopicPolicy
from runtime.retention import SealedSegmentState, prunable
from storage.records import SubscriptionKind
from storage.segment_stats import hibernated_stats
from storage.segment_store import SealedBy
from storage.tier_records import TieredRecord

if TYPE_CHECKING:
    from storage.records import TopicRecord

log = logging.getLogger(__name__)
INTERVAL_ENV = "RAYTOPICS_MAINTENANCE_INTERVAL_S"
DEFAULT_INTERVAL_S = 5.0
# A segment that does not answer in time (restarting, or ending) sits the round out.
STATS_WAIT_S = 5.0
# Between two exports of Ray's metrics (``metrics_report_interval_ms``), an age is
# taken again at least twice.
AGE_EXPORT_S = 0.4


class TopicMaintenance:
    def __init__(self, parts: TopicParts, commands: LayoutCommands) -> None:
        self._ctl = parts
        self._commands = commands
        self._tracker = LoadTracker()
        self._acks = AckCounter()
        self._consumers: tuple[float, int] = (float("-inf"), 0)  # (read at, count)
        self._active_ids: frozenset[int] = frozenset()
        self._last_change: float | None = None
        self.held_back: dict[str, Any] | None = None
        # The last round that left the layout as it was for the consumers' sake.
        self.rebucket: dict[str, Any] | None = None
        self._tier = TierMover(parts.topic, parts.metrics, parts.fleet.offload)
        # Tiered segments' records, read once each: a hibernating segment cannot change
        # its own, and the fleet says when it changed one (``records_changed``).
        self._records: dict[int, TieredRecord] = {}
        self._records_changed = -1
        # Sleeping segments' kept stats, read once: they change only when one wakes.
        self._asleep: dict[int, dict[str, Any] | None] = {}
        self._ages = BacklogAges()
        self._ages_growing = asyncio.Event()  # a round observed something unacknowledged

    def start(self) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self._run_forever())

    def stop(self) -> None:
        """Stop the tier moves under way (the loop's task is its starter's to cancel)."""
        self._tier.cancel()

    async def _run_forever(self) -> None:
        ages = asyncio.get_running_loop().create_task(self._export_ages_forever())
        try:
            await self._rounds()
        finally:
            ages.cancel()

    async def _export_ages_forever(self) -> None:
        """Backlog ages grow with the clock between rounds: while anything is
        unacknowledged they are re-exported every ``AGE_EXPORT_S`` from the last round's
        oldest unacknowledged times, so a scrape is never a round behind; with nothing
        owed the exported ages hold, and this waits for a round that sees a backlog."""
        while True:
            if not self._ages.growing():  # nothing owed: the exported ages hold
                await self._ages_growing.wait()
                self._ages_growing.clear()
            await asyncio.sleep(AGE_EXPORT_S)
            self._export_ages()

    def _export_ages(self) -> None:
        now_ms = time.time_ns() // 1_000_000
        self._ctl.metrics.backlog_ages(
            self._ages.subscription_ages(now_ms), self._ages.segment_ages(now_ms)
        )

    async def _rounds(self) -> None:
        while True:
            policy = TopicPolicy()
            try:
                policy = await self.tick()
            except StaleEpochError:
                log.info("%s: a newer controller leads; maintenance stops", self._ctl.topic)
                return
            except Exception:  # one bad round must not end maintenance for good
                log.exception("%s: maintenance round failed", self._ctl.topic)
            await self._pause(_interval(policy))

    async def _pause(self, seconds: float) -> None:
        """Until the next round: ``seconds``, or less when one is due at once (segments
        created, the policy changed)."""
        due = self._ctl.fleet.replicas.due
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(due.wait(), seconds)
        due.clear()

    async def tick(self) -> TopicPolicy:
        """One round; returns the policy in force (it sets the pace of the next round)."""
        ctl = self._ctl
        record = ctl.catalog.topic(ctl.topic)
        if record is None:
            return TopicPolicy()
        default = ctl.catalog.namespace_policy(ctl.topic.namespace_path)
        policy = (record.policy or TopicPolicy()).over(default)
        # Replicas are kept during layout operations too, but not while the topic is
        # being created: its segments' replicas are still being laid out, and a round
        # would start (or rebuild) ones whose files are not there yet.
        creating = record.pending_operation is not None and (
            record.pending_operation.kind == OperationKind.CREATE
        )
        if ctl.fleet.node_local and not creating:
            serving, tiered = self._sealed(record)
            await ctl.fleet.replicas.round(record.layout.active_segments, policy.replicas, serving)
            if tiered:
                await ctl.fleet.replicas.retire(tiered)
        observed = await self._observe(record)
        if observed is None:
            return policy
        stats = observed
        await self._reseal(record.layout, stats)
        self._publish(record.layout, stats)
        if policy.retention is not None:
            await self._retain(record.layout, stats, policy.retention)
        if policy.autoscale is not None:
            await self._autoscale(record.layout, stats, policy.autoscale)
        if policy.tiering is not None:
            hibernate = self._hibernate(record.layout)
            for segment_id in idle_tiered(stats, policy.tiering.idle_s):
                hibernate(segment_id)
            self._tier.round(
                record.layout, stats, policy.tiering, self._handle_of(record.layout), hibernate
            )
        if policy.hibernation is not None:
            for segment_id in idle_drained(stats, policy.hibernation.idle_s):
                await self._put_to_sleep(record.layout.get(segment_id), stats[segment_id])
        return policy

    async def _reseal(self, layout: SegmentLayout, stats: dict[int, dict[str, Any]]) -> None:
        """Seal again a segment the layout says is sealed whose serving replica does not
        know it: its leader was sealed and lost before its followers learned of it, and
        one of them leads now. The layout is the authority; until the seal, the segment's
        readers would wait at its end for good, and its children would never be read."""
        for segment_id, st in stats.items():
            info = layout.all_segments.get(segment_id)
            if info is None or info.is_active or st.get("terminated", True):
                continue
            log.warning("%s: segment %d is sealed in the layout, not at its leader: sealing it",
                        self._ctl.topic, segment_id)  # fmt: skip
            sealed = SealedBy(info.child_ids, info.sealed_at_epoch)
            name, epoch = info.name(self._ctl.topic), self._ctl.leader_epoch()
            try:
                await self._ctl.fleet.terminate(name, epoch, sealed)
            except ScalableTopicsError as err:  # the next round asks again
                log.warning("%s: sealing segment %d failed: %s", self._ctl.topic, segment_id, err)
                continue
            st["terminated"] = True

    def _handle_of(self, layout: SegmentLayout) -> Callable[[int], Any]:
        """A segment's actor for the mover: running, or woken if it sleeps drained (its
        move is due); None when it runs nowhere now."""
        fleet, topic = self._ctl.fleet, self._ctl.topic

        def handle_of(segment_id: int) -> Any:
            name = layout.get(segment_id).name(topic)
            if segment_id in self._asleep and fleet.wake(name):
                self._asleep.pop(segment_id, None)
                return fleet.handle(name)
            return fleet.watched(name)

        return handle_of

    async def _put_to_sleep(self, info: SegmentInfo, stats: dict[str, Any]) -> None:
        name = info.name(self._ctl.topic)
        log.info("%s: segment %d is sealed, drained and idle: its actor exits",
                 self._ctl.topic, info.segment_id)  # fmt: skip
        await self._ctl.fleet.put_to_sleep(name, stats)
        self._asleep.pop(info.segment_id, None)

    def _hibernate(self, layout: SegmentLayout) -> Callable[[int], None]:
        """End a tiered segment's actor (moved, or idle for the policy's ``idleS``)."""
        fleet, topic = self._ctl.fleet, self._ctl.topic

        def hibernate(segment_id: int) -> None:
            log.info("%s: segment %d is tiered and idle: its actor exits", topic, segment_id)
            fleet.hibernate(layout.get(segment_id).name(topic))
            self._records.pop(segment_id, None)  # its cursors may have moved meanwhile

        return hibernate

    def _sealed(self, record: TopicRecord) -> tuple[dict[int, SegmentInfo], dict[int, SegmentInfo]]:
        """Sealed segments whose replicas serve their readers (not moved to the tier, which
        serves them then, and not asleep: no replica runs), and those moved to the tier."""
        fleet = self._ctl.fleet
        tiered = set(fleet.storage().records.segment_ids())
        resting = tiered | set(fleet.sleeping().segment_ids())
        sealed = {
            segment_id: info
            for segment_id, info in record.layout.all_segments.items()
            if info.state is SegmentState.SEALED
        }
        serving = {i: info for i, info in sealed.items() if i not in resting}
        return serving, {i: info for i, info in sealed.items() if i in tiered}

    async def _observe(self, record: TopicRecord) -> dict[int, dict[str, Any]] | None:
        """The stats of every segment that answers, hibernating ones' from their records;
        None while an operation is in progress (its layout is about to change)."""
        ctl = self._ctl
        if record.pending_operation is not None:
            return None
        names = {s.segment_id: s.name(ctl.topic) for s in record.layout.all_segments.values()}
        tiered = set(ctl.fleet.storage().records.segment_ids())
        asleep = set(ctl.fleet.sleeping().segment_ids())
        stats = await ctl.fleet.observe(names, tiered | asleep, STATS_WAIT_S)
        for segment_id in stats:  # awake: its record may change
            self._records.pop(segment_id, None)
            self._asleep.pop(segment_id, None)
        for segment_id in tiered & names.keys() - stats.keys():
            if ctl.fleet.hibernating(names[segment_id]):
                stored = self._record(segment_id)
                if stored is not None:
                    stats[segment_id] = hibernated_stats(names[segment_id], stored)
        for segment_id in asleep & names.keys() - stats.keys() - tiered:
            if ctl.fleet.hibernating(names[segment_id]):
                if segment_id not in self._asleep:
                    self._asleep[segment_id] = ctl.fleet.sleeping().get(segment_id)
                if self._asleep[segment_id] is not None:
                    stats[segment_id] = self._asleep[segment_id]
        return stats

    def _record(self, segment_id: int) -> TieredRecord | None:
        fleet = self._ctl.fleet
        if fleet.records_changed != self._records_changed:
            self._records.clear()
            self._records_changed = fleet.records_changed
        if segment_id not in self._records:
            stored = fleet.storage().tiered(segment_id)
            if stored is None:
                return None
            self._records[segment_id] = stored
        return self._records[segment_id]

    async def _retain_active(self, layout: SegmentLayout, retention: RetentionPolicy) -> None:
        """Time and size retention of the active segments (whole batches from the head)."""
        if retention.time_s is None and retention.size_bytes is None:
            return
        oldest_ms = None
        if retention.time_s is not None:
            oldest_ms = time.time_ns() // 1_000_000 - int(retention.time_s * 1000)
        names = [s.name(self._ctl.topic) for s in layout.active_segments.values()]
        await self._ctl.fleet.retain(names, oldest_ms, retention.size_bytes)

    def _publish(self, layout: SegmentLayout, stats: dict[int, dict[str, Any]]) -> None:
        metrics = self._ctl.metrics
        metrics.leader(self._ctl.leader_epoch())
        active = len(layout.active_segments)
        metrics.layout(active, len(layout.all_segments) - active)
        catalog, topic = self._ctl.catalog, self._ctl.topic
        backlog: dict[str, int] = {name: 0 for name in catalog.subscriptions(topic)}
        for st in stats.values():
            for name, cursor in st["subscriptions"].items():
                backlog[name] = backlog.get(name, 0) + cursor["backlog"]
        for name, total in backlog.items():
            metrics.subscription(name, total, len(catalog.consumers(topic, name)))
        # metrics tag a segment by its descriptor (0000-7fff-3), as the segments do
        descriptors = {i: layout.all_segments[i].name(topic).descriptor for i in stats}
        self._ages.observe({descriptors[i]: st for i, st in stats.items()}, backlog)
        self._export_ages()
        if self._ages.growing():
            self._ages_growing.set()
        tiered = sum(1 for st in stats.values() if st.get("tiered"))
        metrics.storage(len(stats) - tiered, tiered)

    async def _retain(
        self, layout: SegmentLayout, stats: dict[int, dict[str, Any]], retention: RetentionPolicy
    ) -> None:
        states = {
            segment_id: SealedSegmentState(
                terminated=st["terminated"],
                drained=all(c["backlog"] == 0 for c in st["subscriptions"].values()),
                last_publish_ms=st["lastPublishTimeMs"],
            )
            for segment_id, st in stats.items()
        }
        doomed = prunable(layout, states, retention, time.time_ns() // 1_000_000)
        if doomed:
            await self._commands.prune(doomed)
        await self._retain_active(layout, retention)

    async def _autoscale(
        self, layout: SegmentLayout, stats: dict[int, dict[str, Any]], policy: AutoscalePolicy
    ) -> None:
        now = time.monotonic()
        active = frozenset(layout.active_segments)
        if active != self._active_ids:  # any change, manual ones too, starts a cool-down
            self._active_ids, self._last_change = active, now
        measured = [i for i in active if i in stats]
        acked = self._acks.observe(
            {
                i: {sub: c["markDelete"] for sub, c in stats[i]["subscriptions"].items()}
                for i in measured
            }
        )
        totals = {i: (stats[i]["endOffset"], stats[i]["sizeBytes"], acked[i]) for i in measured}
        self._tracker.observe(now, totals)
        rates = self._tracker.rates(now, policy.window_s)
        consumers = self._stream_consumers()
        decision = decide(policy, layout, rates, now, self._last_change, consumers)
        if decision is not None and decision.kind == "rebucket":
            self.rebucket = {"reason": decision.reason, "atMs": time.time_ns() // 1_000_000}
        elif decision is not None:
            await self._apply(decision)

    def _stream_consumers(self) -> int:
        """The most consumers a stream subscription of the topic has registered, read from
        the metadata at most every ``_CONSUMERS_FRESH_S``, not every round."""
        if time.monotonic() - self._consumers[0] >= _CONSUMERS_FRESH_S:
            self._consumers = (time.monotonic(), self._count_stream_consumers())
        return self._consumers[1]

    def _count_stream_consumers(self) -> int:
        catalog, topic = self._ctl.catalog, self._ctl.topic
        counts = [
            len(catalog.registrations(topic, sub))
            for sub in catalog.subscriptions(topic)
            if (meta := catalog.subscription(topic, sub)) is not None
            and meta.kind == SubscriptionKind.SUBSCRIPTION
        ]
        return max(counts, default=0)

    async def _apply(self, decision: Decision) -> None:
        log.info("%s: autoscale %s %s (%s)", self._ctl.topic, decision.kind, decision.segment_ids,
                 decision.reason)  # fmt: skip
        try:
            if decision.kind == "split":
                await self._commands.split(*decision.segment_ids)
            else:
                await self._commands.merge(*decision.segment_ids)
            self.held_back = None
        except InsufficientCapacityError as err:
            self._hold_back(decision, err)
        except (ConflictError, TopicNotFoundError) as err:  # a manual change won the race
            if isinstance(err, StaleEpochError):
                raise
            log.info("%s: autoscale %s skipped: %s", self._ctl.topic, decision.kind, err)
        self._last_change = time.monotonic()

    def _hold_back(self, decision: Decision, err: InsufficientCapacityError) -> None:
        """The cluster has no room for what the policy asks: the topic stays as it is,
        and stats (``autoscale.heldBack``) and metrics say what was wanted and why not."""
        log.warning("%s: autoscale %s held back: %s", self._ctl.topic, decision.kind, err)
        self._ctl.metrics.held_back(decision.kind, err.code)
        self.held_back = {
            "kind": decision.kind,
            "segmentIds": list(decision.segment_ids),
            "reason": decision.reason,
            "code": err.code,
            "message": err.message,
            "atMs": time.time_ns() // 1_000_000,
        }


_CONSUMERS_FRESH_S = 2.0


def _interval(policy: TopicPolicy) -> float:
    """Autoscaling samples a few times per window, retention looks every second; a topic
    without a policy only refreshes its gauges, at a relaxed pace."""
    if policy.autoscale is not None:
        return min(1.0, policy.autoscale.window_s / 4)
    if policy.retention is not None or policy.tiering is not None:
        return 1.0
    if policy.replicas.factor > 1:  # a lost leader is replaced within about a round
        return 1.0
    return env_float(INTERVAL_ENV, DEFAULT_INTERVAL_S)
