package io.raytopics.spark;

import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.List;
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

    /**
     * The records of {@code ipc} with offsets below {@code to}.
     *
     * @param firstOffset the first record's offset (even one at or past {@code to}), -1 if none:
     *     what tells a reader that retention removed the records it asked for
     */
    record Decoded(List<InternalRow> rows, long firstOffset) {}

    static Decoded decode(InputStream ipc, BufferAllocator allocator, long segmentId, long to)
            throws IOException {
        List<InternalRow> rows = new ArrayList<>();
        long firstOffset = -1;
        try (ArrowStreamReader reader = new ArrowStreamReader(ipc, allocator)) {
            VectorSchemaRoot root = reader.getVectorSchemaRoot();
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
                        return new Decoded(rows, firstOffset);
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
        }
        return new Decoded(rows, firstOffset);
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
