package io.raytopics.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.TimeStampMilliTZVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.TimeUnit;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * Delivery batches as a segment sends them (Python's DELIVERY_SCHEMA: the producers'
 * batch columns, then offset and publish time), built with Arrow Java.
 */
final class ArrowFixtures {
    record Message(String key, byte[] value, Map<String, String> properties, long offset, long publishMs) {}

    static final Schema DELIVERY = delivery();

    private ArrowFixtures() {}

    private static Schema delivery() {
        List<Field> fields = new ArrayList<>(ArrowRecordEncoder.BATCH.getFields());
        fields.add(new Field("offset", FieldType.nullable(new ArrowType.Int(64, true)), null));
        fields.add(new Field("publish_time", FieldType.nullable(
                new ArrowType.Timestamp(TimeUnit.MILLISECOND, "UTC")), null));
        return new Schema(fields);
    }

    /** Message {@code offset} of a simple numbered stream: key-N, value "vN", properties every 3rd. */
    static Message numbered(long offset) {
        return new Message(offset % 5 == 0 ? null : "key-" + offset,
                ("v" + offset).getBytes(StandardCharsets.UTF_8),
                offset % 3 == 0 ? Map.of("n", Long.toString(offset)) : null,
                offset, 1_700_000_000_000L + offset);
    }

    /** The Arrow IPC stream (schema, one batch, end-of-stream) of {@code messages}. */
    static byte[] ipc(List<Message> messages) throws IOException {
        return ipc(messages, Map.of());
    }

    /** The same, its schema carrying {@code metadata} (what a read states: where it started). */
    static byte[] ipc(List<Message> messages, Map<String, String> metadata) throws IOException {
        Schema schema = metadata.isEmpty() ? DELIVERY : new Schema(DELIVERY.getFields(), metadata);
        try (BufferAllocator allocator = new RootAllocator();
                VectorSchemaRoot root = VectorSchemaRoot.create(schema, allocator)) {
            List<SinkRecord> records = new ArrayList<>();
            int[] rows = new int[messages.size()];
            for (int i = 0; i < rows.length; i++) {
                Message m = messages.get(i);
                records.add(new SinkRecord(m.key(), m.value(), m.properties()));
                rows[i] = i;
            }
            ArrowRecordEncoder.fill(root, records, rows);
            BigIntVector offsets = (BigIntVector) root.getVector("offset");
            TimeStampMilliTZVector times = (TimeStampMilliTZVector) root.getVector("publish_time");
            for (int i = 0; i < rows.length; i++) {
                offsets.setSafe(i, messages.get(i).offset());
                times.setSafe(i, messages.get(i).publishMs());
            }
            root.setRowCount(messages.size());
            return ArrowRecordEncoder.stream(root);
        }
    }
}
