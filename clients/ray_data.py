"""Ray Data on topics: a Dataset from a topic's snapshot, and a Datasink into a topic.

Reading plans exactly as ``read_topic`` does (``clients.read_plan.plan_read``): one
read task per offset range of the DAG, each reading its segment (or a tiered
segment's file in the tier) straight into Arrow, and the same completeness rules
(no silent partial results). Writing runs one producer per write task, routing by
key like every producer; a write task that Ray retries may store its rows again
(at-least-once), which ``write_topic`` (Spark) and the streaming sink do not.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import ray
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor, BlockMetadata
from ray.data.datasource import Datasource, ReadTask, WriteResult

from clients._ray import joined
from clients.producer import Producer
from clients.range_reads import OUTPUT_SCHEMA, SegmentRange, read_range
from clients.read_plan import (
    DEFAULT_ROWS_PER_PARTITION,
    ROW_BYTES_ESTIMATE,
    Bound,
    ReadPlan,
    annotate,
    plan_read,
)
from runtime.auth import client_credential
from runtime.errors import InvalidArgumentError

# --- reading -------------------------------------------------------------------------------


class TopicDatasource(Datasource):
    """A planned snapshot as a Ray Data ``Datasource``: one read task per range, each
    presenting ``credential`` to its segment."""

    def __init__(self, plan: ReadPlan, credential: str | None) -> None:
        super().__init__()
        self.plan = plan
        self._credential = credential

    def get_name(self) -> str:
        return "ScalableTopic"

    def estimate_inmemory_data_size(self) -> int | None:
        return self.plan.rows * ROW_BYTES_ESTIMATE

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        timeout_s = self.plan.unavailable_timeout_s
        return [
            ReadTask(
                functools.partial(_read_tables, piece, timeout_s, self._credential),
                BlockMetadata(
                    num_rows=piece.rows,
                    size_bytes=piece.rows * ROW_BYTES_ESTIMATE,
                    exec_stats=None,
                    input_files=None,
                ),
                schema=OUTPUT_SCHEMA,
                per_task_row_limit=per_task_row_limit,
            )
            for piece in self.plan.ranges
        ]


def topic_datasource(plan: ReadPlan, *, token: str | None = None) -> TopicDatasource:
    """The snapshot ``plan`` as a ``Datasource``; ``token`` default ``RAYTOPICS_TOKEN``."""
    return TopicDatasource(plan, client_credential(token))


def _read_tables(
    piece: SegmentRange, timeout_s: float, credential: str | None
) -> Iterator[pa.Table]:
    for batch in read_range(piece, timeout_s, credential):
        yield pa.Table.from_batches([batch])


def read_topic_dataset(
    topic: str,
    *,
    start: Bound = "earliest",
    end: Bound = "latest",
    subscription: str | None = None,
    allow_partial: bool = False,
    unavailable_timeout_s: float | None = None,
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION,
    token: str | None = None,
) -> ray.data.Dataset:
    """The topic's snapshot as a Ray Dataset (``OUTPUT_SCHEMA``), read lazily by Ray tasks.

    Bounds, completeness and ``token`` as in ``read_topic``; the result carries
    ``missing_segments`` and ``read_plan`` (Ray Data transformations do not). Joins Ray
    first when this process is not connected (``RAY_ADDRESS`` or the embedded Ray).
    """
    joined()
    credential = client_credential(token)
    plan = plan_read(
        topic,
        start=start,
        end=end,
        subscription=subscription,
        allow_partial=allow_partial,
        unavailable_timeout_s=unavailable_timeout_s,
        rows_per_partition=rows_per_partition,
        token=credential,
    )
    if plan.ranges:
        dataset = ray.data.read_datasource(
            topic_datasource(plan, token=credential), override_num_blocks=len(plan.ranges)
        )
    else:
        dataset = ray.data.from_arrow(OUTPUT_SCHEMA.empty_table())
    return annotate(dataset, plan)


# --- writing -------------------------------------------------------------------------------


class TopicDatasink(Datasink[int]):
    """``dataset.write_datasink(TopicDatasink(topic))``: every row published to ``topic``.

    ``value_column`` (binary, or string stored as its UTF-8 bytes) is required;
    ``key_column`` (string; routes the row, keeps per-key order within a block)
    and ``properties_column`` (map of string to string) are used when the dataset
    has them. ``rows_written`` holds the total once the write completed.
    """

    def __init__(
        self,
        topic: str,
        *,
        value_column: str = "value",
        key_column: str | None = "key",
        properties_column: str | None = "properties",
        token: str | None = None,
        producer_config: dict[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.columns = (value_column, key_column, properties_column)
        self._credential = client_credential(token)
        self._producer_config = dict(producer_config or {})
        self.rows_written = 0

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """A dataset without the value column, or with columns of the wrong type, is
        refused before any task writes."""
        if schema is not None:
            _check_schema(schema, *self.columns)

    def write(self, blocks: Iterable[Block], ctx: Any) -> int:
        rows, pending = 0, []
        token = self._credential or ""
        with Producer(self.topic, token=token, **self._producer_config) as producer:
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                if table.num_rows == 0:
                    continue
                values, keys, properties = _columns(table, *self.columns)
                pending.append(producer.send_batch(values, keys, properties))
                rows += table.num_rows
            for sent in pending:
                sent.result()
        return rows

    def on_write_complete(self, write_result: WriteResult[int]) -> None:
        self.rows_written = sum(write_result.write_returns)


def write_topic_dataset(dataset: ray.data.Dataset, topic: str, **options: Any) -> int:
    """Publish every row of ``dataset`` to ``topic`` (``TopicDatasink`` options); returns
    how many rows were stored."""
    sink = TopicDatasink(topic, **options)
    dataset.write_datasink(sink)
    return sink.rows_written


def _check_schema(schema: pa.Schema, value: str, key: str | None, properties: str | None) -> None:
    allowed = {
        value: (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_string,
                pa.types.is_large_string),
        key: (pa.types.is_string, pa.types.is_large_string, pa.types.is_null),
        properties: (pa.types.is_map, pa.types.is_null, _is_struct_of_strings),
    }  # fmt: skip
    if value not in schema.names:
        raise InvalidArgumentError(
            f"the dataset has no {value!r} column to publish; it has {schema.names} "
            "(TopicDatasink(value_column=...) names another)"
        )
    for name, checks in allowed.items():
        if name is not None and name in schema.names:
            kind = schema.field(name).type
            if not any(check(kind) for check in checks):
                raise InvalidArgumentError(
                    f"column {name!r} is {kind}: values are binary or string, keys string, "
                    "properties map<string, string> (or a struct of strings)"
                )


def _is_struct_of_strings(kind: pa.DataType) -> bool:
    """What Ray Data infers from rows whose properties are dicts of strings."""
    return pa.types.is_struct(kind) and all(pa.types.is_string(f.type) for f in kind)


def _as_map(column: pa.ChunkedArray) -> pa.Array:
    if not pa.types.is_struct(column.type):
        return column
    rows = [
        None if row is None else {k: v for k, v in row.items() if v is not None}
        for row in column.to_pylist()
    ]
    return pa.array(rows, type=pa.map_(pa.string(), pa.string()))


def _columns(
    table: pa.Table, value: str, key: str | None, properties: str | None
) -> tuple[Any, Any, Any]:
    def optional(name: str | None) -> Any:
        return table.column(name) if name is not None and name in table.column_names else None

    values = table.column(value)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.binary())  # a string's UTF-8 bytes, as a producer stores it
    found = optional(properties)
    return values, optional(key), None if found is None else _as_map(found)
