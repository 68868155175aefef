"""Ray Data on topics: a Dataset written into a topic with ``TopicDatasink`` reads back
whole with ``read_topic_dataset``, each key in order; a dataset without a value
column is refused before anything is written."""

from __future__ import annotations

from collections import defaultdict

import pytest
import ray

from clients import ScalableTopicsAdmin
from clients.ray_data import TopicDatasink, read_topic_dataset, write_topic_dataset


def test_a_dataset_written_to_a_topic_reads_back_whole_in_key_order(
    admin: ScalableTopicsAdmin, unique: str
) -> None:
    topic = f"topic://raydata/ns/sink-{unique}"
    admin.create_scalable_topic(topic, 3)
    rows = [
        {"key": f"k{i % 13}", "value": f"v{i}".encode(), "properties": {"n": str(i)}}
        for i in range(3000)
    ]
    dataset = ray.data.from_items(rows, override_num_blocks=1)
    assert write_topic_dataset(dataset, topic) == 3000
    sink = TopicDatasink(topic, key_column=None, properties_column=None)
    ray.data.from_items([{"value": "plain"}] * 10).write_datasink(sink)  # strings, unkeyed
    assert sink.rows_written == 10

    back = read_topic_dataset(topic).take_all()
    assert len(back) == 3010
    by_key: dict[str | None, list[int]] = defaultdict(list)
    for row in sorted(back, key=lambda r: (r["segment_id"], r["offset"])):
        if row["key"] is not None:
            by_key[row["key"]].append(int(row["value"][1:]))
            assert dict(row["properties"]) == {"n": row["value"][1:].decode()}
    assert all(seq == sorted(seq) for seq in by_key.values())
    assert sorted(n for seq in by_key.values() for n in seq) == list(range(3000))
    assert sum(1 for row in back if row["key"] is None and row["value"] == b"plain") == 10

    with pytest.raises(Exception, match="has no 'value' column"):
        ray.data.from_items([{"payload": b"x"}]).write_datasink(TopicDatasink(topic))
    with pytest.raises(Exception, match="column 'key' is int64"):
        ray.data.from_items([{"value": b"x", "key": 5}]).write_datasink(TopicDatasink(topic))
    assert len(read_topic_dataset(topic).take_all()) == 3010  # nothing of either was stored
    admin.delete_scalable_topic(topic)
