"""Foundation demo: a topic's segment DAG through a split and a merge, stored in GCS KV.

Run with ``./dev.sh demo`` (embedded local Ray) or
``ray job submit --working-dir . -- python examples/demo.py`` against a cluster.
"""

from __future__ import annotations

import json

from runtime import connect
from runtime.layout import SegmentLayout
from runtime.names import TopicName
from runtime.render import render_tree
from storage.metadata import MetadataStore


def main() -> None:
    connect(include_dashboard=False, log_to_driver=False)
    store = MetadataStore()
    topic = TopicName.parse("topic://demo/foundation/events")
    path = f"/demo/{topic.short}"  # a layout of its own, beside the real topics' records
    store.delete_tree(path)

    layout = SegmentLayout.initial(4)
    version = store.put_if_absent(path, layout.to_json().encode())
    print(f"created {topic} with 4 segments\n{render_tree(layout)}\n")

    for step, mutate in (
        ("split segment 1", lambda lay: lay.split_segment(1)),
        ("merge siblings 4 and 5 back", lambda lay: lay.merge_segments(4, 5)),
    ):
        layout = mutate(layout)
        version = store.compare_and_swap(path, version, layout.to_json().encode())
        print(f"{step}: stored at version {version.seq}\n{render_tree(layout)}\n")

    stored = SegmentLayout.from_json(store.get(path).value)
    assert stored == layout, "metadata store round trip changed the layout"
    print("ScalableTopicMetadata JSON:")
    print(json.dumps(json.loads(stored.to_json()), indent=2))
    store.delete_tree(path)


if __name__ == "__main__":
    main()
