"""The storage of one topic incarnation, as its owners lay it out, open it and remove
it: the seam between the segments and where their bytes live.

Everything that creates, opens or deletes a segment's storage goes through this
class: the controller's fleet lays out new segments before metadata names them
and removes ended ones, and a segment actor opens its own. Callers name segments,
never directories: a segment's bytes are in a local directory until they move to
an object-store tier, after which the segment is its record in the metadata store
(``storage.tier_records``) and its files in the tier, and callers do not change.
"""

from __future__ import annotations

from pathlib import Path

from runtime.layout import SegmentInfo
from runtime.names import SegmentName, TopicName
from storage.durability import Durability
from storage.segment_store import SegmentStore
from storage.tier_records import TieredRecord, TierRecords, delete_tiered_segment, tier_records
from storage.topic_storage import delete_storage, incarnation_directory, segment_directory


class IncarnationStorage:
    """Segments' storage of ``topic``'s incarnation ``incarnation`` under ``root``."""

    def __init__(
        self,
        root: Path,
        topic: TopicName,
        incarnation: str,
        durability: Durability,
        records: TierRecords | None = None,
    ) -> None:
        """``records``: where tiered segments' records are (this cluster's metadata store
        when not given)."""
        self.root, self.topic, self.incarnation = Path(root), topic, incarnation
        self.durability = durability
        self.records = records or tier_records(topic, incarnation)

    def lay_out(
        self,
        name: SegmentName,
        info: SegmentInfo,
        subscriptions: list[str],
        epoch: int,
        *,
        in_layout: bool = True,
    ) -> None:
        """A new segment's storage, identity and fence first, every cursor at Earliest."""
        store = self.open(name, create=True, info=info, in_layout=in_layout)
        try:
            store.check_epoch(epoch)
            for subscription in subscriptions:
                store.create_subscription(subscription, "earliest", epoch)
        finally:
            store.close()

    def open(
        self,
        name: SegmentName,
        *,
        create: bool = False,
        info: SegmentInfo | None = None,
        in_layout: bool = True,
        ack_timeout_s: float = 30.0,
        background_sync: bool = False,
    ) -> SegmentStore:
        """The segment's storage; only ``create`` may make it (``SegmentStore``)."""
        return SegmentStore(
            name,
            self.root,
            self.durability,
            incarnation=self.incarnation,
            create=create,
            info=info,
            in_layout=in_layout,
            ack_timeout_s=ack_timeout_s,
            background_sync=background_sync,
            records=self.records,
        )

    def delete_segment(self, name: SegmentName) -> None:
        """Remove a segment's storage, tiered or local, whether or not an actor still has
        it open."""
        self.delete_tiered(name)
        delete_storage(segment_directory(self.root, name, self.incarnation))

    def delete_tiered(self, name: SegmentName) -> None:
        """Remove a segment's tiered copy and record, if it has them (its local files, on
        a node's own disk, are that node's to remove)."""
        delete_tiered_segment(self.records, name.segment_id)

    def tiered(self, segment_id: int) -> TieredRecord | None:
        """The segment's record if it moved to the tier (``None``: its storage is local)."""
        return self.records.get(segment_id)

    def delete(self) -> None:
        """Remove what is left of the incarnation (tiered segments no layout names any
        more, its ``topic.json``, empty parents)."""
        for segment_id in self.records.segment_ids():
            delete_tiered_segment(self.records, segment_id)
        delete_storage(incarnation_directory(self.root, self.topic, self.incarnation))
