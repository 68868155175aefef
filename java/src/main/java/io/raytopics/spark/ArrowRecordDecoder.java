package io.raytopics.spark;

import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.TimeStampMilliTZVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.MapVector;
import org.apache.arrow.vector.complex.StructVector;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A segment's delivery batch (Arrow IPC stream: key, value, properties, offset,
 * publish_time) as Spark rows in {@link RecordSchema}. Values are copied out of Arrow's
 * buffers, so the rows outlive the allocator's memory, which is freed per answer.
 */
final class ArrowRecordDecoder {
    private ArrowRecordDecoder() {}

    /** In a read's schema metadata (Python's {@code runtime.batch}): see {@link Decoded}. */
    static final String STARTED_KEY = "raytopics.started";
    static final String FOLLOWING_KEY = "raytopics.following";

    /**
     * The records of {@code ipc} with offsets below {@code to}.
     *
     * @param firstOffset the first record's offset (even one at or past {@code to}), -1 if none
     * @param started where the read started when retention had dropped the offset asked for
     *     (records lost), -1 otherwise: a read may also start further on than asked because it
     *     stepped over records no reader gets (a transaction's markers, aborted records)
     * @param statedAfter with {@code following}: a read that ends at {@code statedAfter} (after
     *     its last record, or where it started if it has none) is followed by one at
     *     {@code following}, past records no reader gets; both -1 when the next read starts
     *     right after the last record
     */
    record Decoded(List<InternalRow> rows, long firstOffset, long started, long statedAfter,
            long following) {}

    static Decoded decode(InputStream ipc, BufferAllocator allocator, long segmentId, long to)
            throws IOException {
        List<InternalRow> rows = new ArrayList<>();
        long firstOffset = -1;
        try (ArrowStreamReader reader = new ArrowStreamReader(ipc, allocator)) {
            VectorSchemaRoot root = reader.getVectorSchemaRoot();
            Map<String, String> stated = root.getSchema().getCustomMetadata();
            long started = stated == null ? -1 : number(stated.get(STARTED_KEY), -1);
            long[] following = stated == null ? new long[] {-1, -1} : pair(stated.get(FOLLOWING_KEY));
            while (reader.loadNextBatch()) {
                VarCharVector keys = optional(root, "key", VarCharVector.class);
                VarBinaryVector values = required(root, "value", VarBinaryVector.class);
                MapVector properties = optional(root, "properties", MapVector.class);
                BigIntVector offsets = required(root, "offset", BigIntVector.class);
                TimeStampMilliTZVector times = required(root, "publish_time", TimeStampMilliTZVector.class);
                for (int i = 0; i < root.getRowCount(); i++) {
                    long offset = offsets.get(i);
                    if (firstOffset < 0) {
                        firstOffset = offset;
                    }
                    if (offset >= to) {
                        return new Decoded(rows, firstOffset, started, -1, -1);
                    }
                    Object[] row = new Object[RecordSchema.SCHEMA.size()];
                    if (keys != null && !keys.isNull(i)) {
                        byte[] key = keys.get(i);
                        row[RecordSchema.KEY] = UTF8String.fromBytes(key);
                        row[RecordSchema.HASH] = Murmur3.keyHash(key);
                    }
                    row[RecordSchema.VALUE] = values.get(i);
                    row[RecordSchema.SEGMENT_ID] = segmentId;
                    row[RecordSchema.OFFSET] = offset;
                    row[RecordSchema.PUBLISH_TIME] = Math.multiplyExact(times.get(i), 1000L);
                    if (properties != null && !properties.isNull(i)) {
                        row[RecordSchema.PROPERTIES] = map(properties, i);
                    }
                    rows.add(new GenericInternalRow(row));
                }
            }
            return new Decoded(rows, firstOffset, started, following[0], following[1]);
        }
    }

    private static long number(String text, long absent) {
        if (text == null) {
            return absent;
        }
        try {
            return Long.parseLong(text.trim());
        } catch (NumberFormatException e) {
            throw new RayTopicsException("invalid_response", "the segment's read metadata is not a number: "
                    + text);
        }
    }

    /** "{after} {following}" as {after, following}; {-1, -1} when absent. */
    private static long[] pair(String text) {
        if (text == null) {
            return new long[] {-1, -1};
        }
        String[] parts = text.trim().split(" ");
        if (parts.length != 2) {
            throw new RayTopicsException("invalid_response", "the segment's read metadata is malformed: "
                    + text);
        }
        return new long[] {number(parts[0], -1), number(parts[1], -1)};
    }

    private static ArrayBasedMapData map(MapVector vector, int row) {
        StructVector entries = (StructVector) vector.getDataVector();
        VarCharVector keys = (VarCharVector) entries.getChildByOrdinal(0);
        VarCharVector values = (VarCharVector) entries.getChildByOrdinal(1);
        int start = vector.getElementStartIndex(row);
        int size = vector.getElementEndIndex(row) - start;
        Object[] k = new Object[size];
        Object[] v = new Object[size];
        for (int j = 0; j < size; j++) {
            k[j] = UTF8String.fromBytes(keys.get(start + j));
            v[j] = values.isNull(start + j) ? null : UTF8String.fromBytes(values.get(start + j));
        }
        return new ArrayBasedMapData(new GenericArrayData(k), new GenericArrayData(v));
    }

    private static <T extends FieldVector> T required(VectorSchemaRoot root, String name, Class<T> type) {
        T vector = optional(root, name, type);
        if (vector == null) {
            throw new RayTopicsException(
                    "invalid_response", "the segment's records have no " + name + " column");
        }
        return vector;
    }

    /** Null when absent: a column of nothing but nulls may be left out of the stream. */
    private static <T extends FieldVector> T optional(VectorSchemaRoot root, String name, Class<T> type) {
        FieldVector vector = root.getVector(name);
        if (vector == null) {
            return null;
        }
        if (!type.isInstance(vector)) {
            throw new RayTopicsException("invalid_response", "the segment's " + name + " column is "
                    + vector.getField().getType() + ", expected " + type.getSimpleName());
        }
        return type.cast(vector);
    }
}
