"""Human-readable views of a layout (for the demo, the CLI and logs)."""

from __future__ import annotations

from runtime.layout import SegmentInfo, SegmentLayout


def render_tree(layout: SegmentLayout) -> str:
    """The DAG as an indented tree; a merged child under its second parent points back."""
    lines = [
        f"epoch {layout.epoch}, next segment id {layout.next_segment_id}, "
        f"{len(layout.active_segments)} active / {len(layout.all_segments)} total"
    ]
    shown: set[int] = set()
    roots = [s for s in layout.all_segments.values() if not s.parent_ids]
    for i, root in enumerate(sorted(roots, key=lambda s: s.hash_range.start)):
        _walk(layout, root, "", i == len(roots) - 1, shown, lines)
    return "\n".join(lines)


def describe_segment(segment: SegmentInfo) -> str:
    rng = segment.hash_range
    when = f"created@{segment.created_at_epoch}"
    if not segment.is_active:
        when += f" sealed@{segment.sealed_at_epoch}"
    return f"#{segment.segment_id} [{rng.start:04x}-{rng.end:04x}] {segment.state.value} {when}"


def _walk(
    layout: SegmentLayout,
    segment: SegmentInfo,
    indent: str,
    last: bool,
    shown: set[int],
    lines: list[str],
) -> None:
    branch = "└── " if last else "├── "
    if segment.segment_id in shown:
        lines.append(f"{indent}{branch}#{segment.segment_id} (merged, shown above)")
        return
    shown.add(segment.segment_id)
    lines.append(f"{indent}{branch}{describe_segment(segment)}")
    children = [layout.all_segments[c] for c in segment.child_ids if c in layout.all_segments]
    for i, child in enumerate(children):
        _walk(
            layout,
            child,
            indent + ("    " if last else "│   "),
            i == len(children) - 1,
            shown,
            lines,
        )
