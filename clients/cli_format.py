"""How the ``raytopics`` CLI prints topic stats, storage reports and the auth policy
(the examples print stats the same way).
"""

from __future__ import annotations

from typing import Any

# --- formatting -------------------------------------------------------------------------


def format_tree(meta: dict[str, Any]) -> str:
    from runtime.layout import SegmentLayout
    from runtime.render import render_tree

    return render_tree(SegmentLayout.from_dict(meta))


def format_stats(stats: dict[str, Any]) -> str:
    """A topic's stats as a short report: totals, one line per segment and subscription."""
    lines = [
        f"{stats['topic']} at epoch {stats['epoch']}: {stats['activeSegments']} active / "
        f"{stats['sealedSegments']} sealed segments, {stats['records']} records, "
        f"{_size(stats['sizeBytes'])}",
        "",
        f"{'SEGMENT':<8} {'STATE':<7} {'RANGE':<10} {'RECORDS':>9} {'SIZE':>10}",
    ]
    for seg_id, seg in sorted(stats["segments"].items(), key=lambda item: int(item[0])):
        rng = f"{seg['hashRange']['start']:04x}-{seg['hashRange']['end']:04x}"
        lines.append(
            f"{'#' + seg_id:<8} {seg['state']:<7} {rng:<10} {seg['records']:>9} "
            f"{_size(seg['sizeBytes']):>10}"
        )
    lines.append("")
    if not stats["subscriptions"]:
        return "\n".join([*lines, "no subscriptions"])
    lines.append(f"{'SUBSCRIPTION':<24} {'STATE':<9} {'CONSUMERS':>9} {'BACKLOG':>9}")
    for name, sub in sorted(stats["subscriptions"].items()):
        lines.append(f"{name:<24} {sub['state']:<9} {sub['consumers']:>9} {sub['backlog']:>9}")
    return "\n".join(lines)


def format_storage(report: dict[str, Any]) -> str:
    """The storage check as a table of orphaned (and foreign) incarnations."""
    from storage.topic_storage import written_at

    lines = [f"storage root {report['storageRoot']}: {report['live']} live incarnations"]
    if "disks" in report:  # a disk per node: each scanned on its node
        lines[0] += f" on {len(report['disks'])} node disks"
    for missed in report.get("unscanned", []):
        lines.append(f"NOT SCANNED: node {missed['node']} ({missed['why']}): its disk may "
                     "hold more")  # fmt: skip
    for title, rows in (("orphaned", report["orphaned"]), ("foreign", report["foreign"])):
        if not rows:
            continue
        lines += ["", f"{title} ({len(rows)}):"]
        lines.append(f"{'TOPIC':<40} {'INCARNATION':<26} {'SEGMENTS':>8} {'SIZE':>10}  LAST WRITE")
        for row in rows:
            lines.append(
                f"{row['topic']:<40} {row['incarnation'] or '(none)':<26} {row['segments']:>8} "
                f"{_size(row['sizeBytes']):>10}  {written_at(row['lastWriteMs'])}"
            )
            if "disk" in row:
                lines.append(f"  on node disk {row['disk']}")
            if "reason" in row:
                lines.append(f"  {row['reason']}")
    if report["deleted"]:
        lines += ["", f"deleted {len(report['deleted'])} orphaned incarnations"]
    elif report["orphaned"]:
        lines += [
            "",
            "raytopics storage check --delete removes them; raytopics recover TOPIC "
            "brings back one whose metadata was lost",
        ]
    else:
        lines.append("no orphaned storage")
    return "\n".join(lines)


def format_auth(status: dict[str, Any]) -> str:
    """The cluster's policy: one line per token, by principal and 8 hex digits of its
    SHA-256, with its grants."""
    if not status["enabled"]:
        return "authentication is off (no policy stored): anyone may do anything"
    lines = [f"authentication is on: policy version {status['version']}"]
    width = max(len(p["principal"]) for p in status["principals"])
    for entry in status["principals"]:
        grants = "; ".join(f"{g['namespace']}: {','.join(g['actions'])}" for g in entry["grants"])
        lines.append(f"  {entry['principal']:<{width}}  sha256:{entry['sha256Prefix']}  {grants}")
    return "\n".join(lines)


def _size(num_bytes: int) -> str:
    if num_bytes < 1024:
        return f"{num_bytes} B"
    scaled, unit = float(num_bytes), "B"
    for unit in ("KiB", "MiB", "GiB"):  # noqa: B007 - the last unit is the answer
        scaled /= 1024
        if scaled < 1024:
            break
    return f"{scaled:.1f} {unit}"
