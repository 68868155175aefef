package io.raytopics.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;

/** A partition read against an in-process segment (and gateway, for relocation). */
public final class SegmentPartitionReaderTest {
    public static void main(String[] args) throws Exception {
        try (FakeGateway gateway = new FakeGateway(); FakeSegment segment = new FakeSegment(0, 100)) {
            ConnectionConfig config = gateway.config("secret-token");

            // Several answers; the last one runs past `to` and is cut there.
            Check.equal(range(10, 35), offsets(read(config, segment, 10, 35, true)), "[10, 35)");
            Check.isTrue(segment.helloPipelined, "the HELLO went out with the first READ");
            Check.equal("secret-token", segment.credentials.get(0), "HELLO credential");

            // Retention removed [10, 20).
            segment.first = 20;
            Check.fails(RayTopicsException.class, () -> read(config, segment, 10, 30, true),
                    "unavailable_segments", "segment 5", "[10, 20)", "failOnDataLoss");
            Check.equal(range(20, 30), offsets(read(config, segment, 10, 30, false)), "lost records skipped");
            Check.equal(List.of(), offsets(read(config, segment, 0, 15, false)), "the whole range lost");

            // Transactions' records no reader gets: stepped over at the head, in the middle
            // and at the end of a range, never taken for records lost.
            segment.first = 0;
            segment.hidden = Set.of(3L, 4L, 5L, 17L, 28L, 29L);
            List<Long> committed = range(0, 30);
            committed.removeAll(segment.hidden);
            Check.equal(committed, offsets(read(config, segment, 0, 30, true)), "stepped over");
            Check.equal(range(6, 10), offsets(read(config, segment, 3, 10, true)), "a hidden head");
            Check.equal(List.of(), offsets(read(config, segment, 28, 30, true)), "nothing but hidden");
            segment.first = 20;
            Check.fails(RayTopicsException.class, () -> read(config, segment, 15, 30, true),
                    "unavailable_segments", "[15, 20)");
            segment.hidden = Set.of();

            // The segment is sealed before `to`.
            segment.first = 0;
            segment.end = 40;
            segment.terminated = true;
            Check.fails(RayTopicsException.class, () -> read(config, segment, 30, 50, true),
                    "unavailable_segments", "[40, 50)", "terminated at end offset 40");
            Check.equal(range(30, 40), offsets(read(config, segment, 30, 50, false)), "read up to the seal");

            // Records not yet visible: retried until they are.
            segment.terminated = false;
            new Thread(() -> {
                sleep(300);
                segment.end = 100;
            }).start();
            Check.equal(range(38, 45), offsets(read(config, segment, 38, 45, true)), "waited for [40, 45)");

            // The connection drops after every answer: the reader asks the gateway where the
            // segment is and resumes where it was.
            gateway.route("/stream/endpoint/5", "{\"host\":\"127.0.0.1\",\"port\":"
                    + segment.endpoint().port() + ",\"tls\":false}");
            segment.dropAfter = 1;
            int before = segment.connections.get();
            Check.equal(range(0, 30), offsets(read(config, segment, 0, 30, true)), "resumed after drops");
            Check.isTrue(segment.connections.get() - before >= 5, "one connection per answer");
            Check.isTrue(!gateway.requests("/stream/endpoint/5").isEmpty(), "the endpoint was looked up");
            Check.equal("Bearer secret-token", gateway.requests("/stream/endpoint/5").get(0).authorization(),
                    "the gateway got the token");
            segment.dropAfter = 0;

            segment.refusal = "{\"error\":\"unauthenticated\",\"message\":\"unknown token\"}";
            Check.fails(RayTopicsException.class, () -> read(config, segment, 0, 10, true),
                    "unauthenticated", "unknown token");
        }
        System.out.println("SegmentPartitionReaderTest: ok");
    }

    private static List<InternalRow> read(ConnectionConfig config, FakeSegment segment, long from, long to,
            boolean failOnDataLoss) throws Exception {
        List<InternalRow> rows = new ArrayList<>();
        SegmentPartition partition = new SegmentPartition(config, 5, from, to, segment.endpoint(), failOnDataLoss);
        try (SegmentPartitionReader reader = new SegmentPartitionReader(partition)) {
            while (reader.next()) {
                rows.add(reader.get().copy());
            }
        }
        return rows;
    }

    private static List<Long> offsets(List<InternalRow> rows) {
        List<Long> offsets = new ArrayList<>();
        for (InternalRow row : rows) {
            Check.equal(5L, row.getLong(RecordSchema.SEGMENT_ID), "segment id");
            offsets.add(row.getLong(RecordSchema.OFFSET));
        }
        return offsets;
    }

    private static List<Long> range(long from, long to) {
        List<Long> out = new ArrayList<>();
        for (long o = from; o < to; o++) {
            out.add(o);
        }
        return out;
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
