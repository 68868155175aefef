package io.raytopics.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BitVectorHelper;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.MapVector;
import org.apache.arrow.vector.complex.StructVector;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * Records as the Arrow IPC stream an append carries, in the schema every producer writes
 * (the Python side's {@code runtime.batch.BATCH_SCHEMA}: key, value, properties).
 */
final class ArrowRecordEncoder {
    static final Schema BATCH = new Schema(List.of(
            new Field("key", FieldType.nullable(ArrowType.Utf8.INSTANCE), null),
            new Field("value", FieldType.nullable(ArrowType.Binary.INSTANCE), null),
            new Field("properties", FieldType.nullable(new ArrowType.Map(false)), List.of(
                    new Field("entries", FieldType.notNullable(ArrowType.Struct.INSTANCE), List.of(
                            new Field("key", FieldType.notNullable(ArrowType.Utf8.INSTANCE), null),
                            new Field("value", FieldType.nullable(ArrowType.Utf8.INSTANCE), null)))))));

    private ArrowRecordEncoder() {}

    /** The records at {@code rows} of {@code records}, in that order, as one IPC stream. */
    static byte[] ipc(List<SinkRecord> records, int[] rows) {
        try (BufferAllocator allocator = new RootAllocator();
                VectorSchemaRoot root = VectorSchemaRoot.create(BATCH, allocator)) {
            fill(root, records, rows);
            root.setRowCount(rows.length);
            return stream(root);
        }
    }

    /** {@code root}'s rows as an IPC stream: its schema, one batch, the end-of-stream mark. */
    static byte[] stream(VectorSchemaRoot root) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (ArrowStreamWriter writer = new ArrowStreamWriter(root, null, out)) {
            writer.start();
            writer.writeBatch();
            writer.end();
        } catch (IOException e) {
            throw new UncheckedIOException(e); // written to memory: not expected
        }
        return out.toByteArray();
    }

    /** Sets the key, value and properties vectors of {@code root} from the records at {@code rows}. */
    static void fill(VectorSchemaRoot root, List<SinkRecord> records, int[] rows) {
        VarCharVector keys = (VarCharVector) root.getVector("key");
        VarBinaryVector values = (VarBinaryVector) root.getVector("value");
        MapVector properties = (MapVector) root.getVector("properties");
        StructVector entries = (StructVector) properties.getDataVector();
        VarCharVector entryKeys = (VarCharVector) entries.getChildByOrdinal(0);
        VarCharVector entryValues = (VarCharVector) entries.getChildByOrdinal(1);
        int entry = 0;
        for (int i = 0; i < rows.length; i++) {
            SinkRecord record = records.get(rows[i]);
            if (record.key() == null) {
                keys.setNull(i);
            } else {
                keys.setSafe(i, record.key().getBytes(StandardCharsets.UTF_8));
            }
            values.setSafe(i, record.value());
            properties.startNewValue(i);
            if (record.properties() == null) {
                // An empty slot marked null: MapVector.setNull walks its offsets again on
                // every call, which made a batch's encoding quadratic in its rows.
                properties.endValue(i, 0);
                BitVectorHelper.unsetBit(properties.getValidityBuffer(), i);
                continue;
            }
            for (Map.Entry<String, String> e : record.properties().entrySet()) {
                entries.setIndexDefined(entry);
                entryKeys.setSafe(entry, e.getKey().getBytes(StandardCharsets.UTF_8));
                if (e.getValue() == null) {
                    entryValues.setNull(entry);
                } else {
                    entryValues.setSafe(entry, e.getValue().getBytes(StandardCharsets.UTF_8));
                }
                entry++;
            }
            properties.endValue(i, record.properties().size());
        }
    }
}
