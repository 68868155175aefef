"""What the topic controller's helpers are given: its parts, never the controller.

Maintenance (retention, tiering, hibernation, autoscaling) and subscription resets
are helpers of ``actors.control.controller``. Each receives the parts it reads
(``TopicParts``) and, for maintenance, the layout commands it may issue
(``LayoutCommands``), so what a helper can touch is spelled out here, and a helper
can be driven in a test by parts of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from actors.control.coordinators import TopicCoordinators
from actors.control.segment_fleet import SegmentFleet
from actors.metrics import ControllerMetrics
from runtime.names import TopicName
from storage.catalog import Catalog
from storage.records import TopicRecord


@dataclass(frozen=True)
class TopicParts:
    """One topic's controller state a helper may read and the fleet it may call."""

    topic: TopicName
    catalog: Catalog
    fleet: SegmentFleet  # every Ray and file call on the topic's segments
    coordinators: TopicCoordinators  # every Ray call on its subscriptions' coordinators
    metrics: ControllerMetrics
    leader_epoch: Callable[[], int]  # the controller's fencing epoch now
    read_record: Callable[[], TopicRecord]  # the topic's record, read as its leader


@dataclass(frozen=True)
class LayoutCommands:
    """The controller's layout operations as maintenance issues them: each takes the
    controller's lock and is checked like any admin call, presenting the cluster's
    internal credential."""

    split: Callable[[int], Awaitable[dict[str, Any]]]
    merge: Callable[[int, int], Awaitable[dict[str, Any]]]
    prune: Callable[[list[int]], Awaitable[list[int]]]
