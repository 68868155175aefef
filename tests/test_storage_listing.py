"""The CLI's table of the storage check (``raytopics storage check``), from the report the
admin service returns: with a disk per node each orphan names its disk, and a node that
was not scanned is said loudly (the report is partial); with a shared root, as before."""

from __future__ import annotations

from clients.cli_format import format_storage

ROW = {
    "topic": "topic://acme/orders/lost", "incarnation": "20261206T070000Z-0a1b2c3d",
    "rayNamespace": "ns", "segments": 2, "sizeBytes": 2048, "lastWriteMs": 0,
    "path": "/disks/a/acme/orders/lost/20261206T070000Z-0a1b2c3d",
    "reason": "no metadata names this topic: deleted, or its metadata was lost (recover)",
}  # fmt: skip


def test_a_disk_per_node_names_each_orphans_disk_and_every_node_not_scanned() -> None:
    report = {
        "storageRoot": "/data", "live": 1, "foreign": [], "deleted": [],
        "orphaned": [{**ROW, "disk": "d-a"}, {**ROW, "disk": "d-b"}],
        "disks": [{"disk": "d-a", "node": "n1"}, {"disk": "d-b", "node": "n2"}],
        "unscanned": [{"node": "n3", "why": "no answer within 60 s"}],
    }  # fmt: skip
    text = format_storage(report)
    assert text.splitlines()[0] == "storage root /data: 1 live incarnations on 2 node disks"
    assert "NOT SCANNED: node n3 (no answer within 60 s): its disk may hold more" in text
    assert text.count("topic://acme/orders/lost") == 2
    assert "  on node disk d-a" in text and "  on node disk d-b" in text
    assert "raytopics storage check --delete removes them" in text


def test_a_shared_root_lists_as_before() -> None:
    report = {"storageRoot": "/data", "live": 0, "foreign": [], "deleted": [], "orphaned": [ROW]}
    text = format_storage(report)
    assert text.splitlines()[0] == "storage root /data: 0 live incarnations"
    assert "node disk" not in text and "NOT SCANNED" not in text
    assert ROW["reason"] in text
