package io.raytopics.spark;

import java.io.ByteArrayInputStream;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.arrow.memory.RootAllocator;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.MapData;

/** Delivery batches into Spark rows: values, nulls, hash, time unit, and the stop at {@code to}. */
public final class ArrowRecordDecoderTest {
    public static void main(String[] args) throws Exception {
        List<ArrowFixtures.Message> messages = new ArrayList<>();
        for (long offset = 100; offset < 110; offset++) {
            messages.add(ArrowFixtures.numbered(offset));
        }
        messages.add(new ArrowFixtures.Message("héllo wörld", new byte[0],
                mapOf("a", null), 110, 5));
        byte[] ipc = ArrowFixtures.ipc(messages);

        try (RootAllocator allocator = new RootAllocator()) {
            ArrowRecordDecoder.Decoded all = ArrowRecordDecoder.decode(
                    new ByteArrayInputStream(ipc), allocator, 7, Long.MAX_VALUE);
            Check.equal(11, all.rows().size(), "rows");
            Check.equal(100L, all.firstOffset(), "first offset");
            for (int i = 0; i < 10; i++) {
                checkRow(messages.get(i), all.rows().get(i));
            }
            InternalRow odd = all.rows().get(10);
            Check.equal("héllo wörld", odd.getUTF8String(RecordSchema.KEY).toString(), "utf-8 key");
            Check.equal(62068, odd.getInt(RecordSchema.HASH), "hash of a utf-8 key");
            Check.equal(0, odd.getBinary(RecordSchema.VALUE).length, "empty value");
            Check.equal(5_000L, odd.getLong(RecordSchema.PUBLISH_TIME), "5 ms in microseconds");
            MapData map = odd.getMap(RecordSchema.PROPERTIES);
            Check.isTrue(map.valueArray().isNullAt(0), "a null property value stays null");

            ArrowRecordDecoder.Decoded cut = ArrowRecordDecoder.decode(
                    new ByteArrayInputStream(ipc), allocator, 7, 104);
            Check.equal(4, cut.rows().size(), "rows below to=104");
            Check.equal(103L, cut.rows().get(3).getLong(RecordSchema.OFFSET), "last row before to");

            ArrowRecordDecoder.Decoded beyond = ArrowRecordDecoder.decode(
                    new ByteArrayInputStream(ipc), allocator, 7, 50);
            Check.equal(0, beyond.rows().size(), "nothing below to=50");
            Check.equal(100L, beyond.firstOffset(), "first offset even past to");

            ArrowRecordDecoder.Decoded empty = ArrowRecordDecoder.decode(
                    new ByteArrayInputStream(ArrowFixtures.ipc(List.of())), allocator, 7, 50);
            Check.equal(-1L, empty.firstOffset(), "no records");
            Check.equal(0L, allocator.getAllocatedMemory(), "Arrow memory freed after decoding");
        }
        System.out.println("ArrowRecordDecoderTest: ok");
    }

    private static void checkRow(ArrowFixtures.Message m, InternalRow row) {
        String at = "offset " + m.offset() + ": ";
        Check.equal(7 + 0L, row.getLong(RecordSchema.SEGMENT_ID), at + "segment id");
        Check.equal(m.offset(), row.getLong(RecordSchema.OFFSET), at + "offset");
        Check.equal(m.value(), row.getBinary(RecordSchema.VALUE), at + "value");
        Check.equal(m.publishMs() * 1000, row.getLong(RecordSchema.PUBLISH_TIME), at + "publish time (us)");
        if (m.key() == null) {
            Check.isTrue(row.isNullAt(RecordSchema.KEY), at + "null key");
            Check.isTrue(row.isNullAt(RecordSchema.HASH), at + "null key has null hash");
        } else {
            Check.equal(m.key(), row.getUTF8String(RecordSchema.KEY).toString(), at + "key");
            Check.equal(Murmur3.keyHash(m.key()), row.getInt(RecordSchema.HASH), at + "hash");
        }
        if (m.properties() == null) {
            Check.isTrue(row.isNullAt(RecordSchema.PROPERTIES), at + "null properties");
        } else {
            MapData map = row.getMap(RecordSchema.PROPERTIES);
            Map<String, String> got = new HashMap<>();
            for (int i = 0; i < map.numElements(); i++) {
                got.put(map.keyArray().getUTF8String(i).toString(),
                        map.valueArray().getUTF8String(i).toString());
            }
            Check.equal(m.properties(), got, at + "properties");
        }
    }

    private static Map<String, String> mapOf(String key, String value) {
        Map<String, String> map = new HashMap<>();
        map.put(key, value);
        return map;
    }
}
