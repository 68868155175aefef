package io.raytopics.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.TimeStampMilliTZVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.MapVector;
import org.apache.arrow.vector.complex.StructVector;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.types.TimeUnit;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;

/** Delivery batches as a segment sends them (Python's DELIVERY_SCHEMA), built with Arrow Java. */
final class ArrowFixtures {
    record Message(String key, byte[] value, Map<String, String> properties, long offset, long publishMs) {}

    static final Schema DELIVERY = new Schema(List.of(
            new Field("key", FieldType.nullable(ArrowType.Utf8.INSTANCE), null),
            new Field("value", FieldType.nullable(ArrowType.Binary.INSTANCE), null),
            new Field("properties", FieldType.nullable(new ArrowType.Map(false)), List.of(
                    new Field("entries", FieldType.notNullable(ArrowType.Struct.INSTANCE), List.of(
                            new Field("key", FieldType.notNullable(ArrowType.Utf8.INSTANCE), null),
                            new Field("value", FieldType.nullable(ArrowType.Utf8.INSTANCE), null))))),
            new Field("offset", FieldType.nullable(new ArrowType.Int(64, true)), null),
            new Field("publish_time", FieldType.nullable(
                    new ArrowType.Timestamp(TimeUnit.MILLISECOND, "UTC")), null)));

    private ArrowFixtures() {}

    /** Message {@code offset} of a simple numbered stream: key-N, value "vN", properties every 3rd. */
    static Message numbered(long offset) {
        return new Message(offset % 5 == 0 ? null : "key-" + offset,
                ("v" + offset).getBytes(StandardCharsets.UTF_8),
                offset % 3 == 0 ? Map.of("n", Long.toString(offset)) : null,
                offset, 1_700_000_000_000L + offset);
    }

    /** The Arrow IPC stream (schema, one batch, end-of-stream) of {@code messages}. */
    static byte[] ipc(List<Message> messages) throws IOException {
        try (BufferAllocator allocator = new RootAllocator();
                VectorSchemaRoot root = VectorSchemaRoot.create(DELIVERY, allocator)) {
            VarCharVector keys = (VarCharVector) root.getVector("key");
            VarBinaryVector values = (VarBinaryVector) root.getVector("value");
            MapVector properties = (MapVector) root.getVector("properties");
            StructVector entries = (StructVector) properties.getDataVector();
            VarCharVector entryKeys = (VarCharVector) entries.getChildByOrdinal(0);
            VarCharVector entryValues = (VarCharVector) entries.getChildByOrdinal(1);
            BigIntVector offsets = (BigIntVector) root.getVector("offset");
            TimeStampMilliTZVector times = (TimeStampMilliTZVector) root.getVector("publish_time");
            int entry = 0;
            for (int i = 0; i < messages.size(); i++) {
                Message m = messages.get(i);
                if (m.key() == null) {
                    keys.setNull(i);
                } else {
                    keys.setSafe(i, m.key().getBytes(StandardCharsets.UTF_8));
                }
                values.setSafe(i, m.value());
                if (m.properties() == null) {
                    properties.setNull(i);
                } else {
                    properties.startNewValue(i);
                    for (Map.Entry<String, String> e : m.properties().entrySet()) {
                        entries.setIndexDefined(entry);
                        entryKeys.setSafe(entry, e.getKey().getBytes(StandardCharsets.UTF_8));
                        if (e.getValue() == null) {
                            entryValues.setNull(entry);
                        } else {
                            entryValues.setSafe(entry, e.getValue().getBytes(StandardCharsets.UTF_8));
                        }
                        entry++;
                    }
                    properties.endValue(i, m.properties().size());
                }
                offsets.setSafe(i, m.offset());
                times.setSafe(i, m.publishMs());
            }
            root.setRowCount(messages.size());
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            try (ArrowStreamWriter writer = new ArrowStreamWriter(root, null, out)) {
                writer.start();
                writer.writeBatch();
                writer.end();
            }
            return out.toByteArray();
        }
    }
}
