package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The sink's column checks, and a task's rows stored over the data plane: chunked,
 * routed by hash to their parts' segments, each chunk's record opened and finished at the
 * gateway, a replay finding its chunks stored, a resumed chunk appending only what is
 * missing, a part refused by a sealed segment rerouted, a race with another attempt.
 */
public final class SinkTest {
    /** Two parts, one per half of the hash space, sequenced by batch (%1$d). */
    private static final String HALVES = "[{\"segment\": 0, \"sequence\": %1$d, \"hash_range\": "
            + "{\"start\": 0, \"end\": 32767}}, {\"segment\": 1, \"sequence\": %1$d, \"hash_range\": "
            + "{\"start\": 32768, \"end\": 65535}}]";

    public static void main(String[] args) throws Exception {
        columns();
        try (FakeGateway gateway = new FakeGateway();
                FakeAppendSegment low = new FakeAppendSegment();
                FakeAppendSegment high = new FakeAppendSegment();
                FakeAppendSegment child = new FakeAppendSegment()) {
            gateway.route("/stream/endpoint/0", low.endpointJson());
            gateway.route("/stream/endpoint/1", high.endpointJson());
            gateway.route("/stream/endpoint/2", child.endpointJson());
            gateway.route("/stream/sink/finish", "{\"finished\": true}");
            ConnectionConfig config = gateway.config("tok-1");
            SinkColumns columns = new SinkColumns(1, true, 0, -1);
            WriteKey key = new WriteKey("q-1", 7, 3);

            // a new write: two chunks, each record on the segment its key's hash names
            gateway.route("/stream/sink/open", body -> opened(HALVES, false, "{}", body));
            RayTopicsDataWriter writer = new RayTopicsDataWriter(config, columns, key);
            for (int i = 0; i < 60_000; i++) {
                writer.write(row("k-" + (i % 500), "v" + i));
            }
            Check.equal(new RayTopicsDataWriter.Committed(60_000, 0), writer.commit(), "all rows stored");
            Check.equal(60_000, low.rows() + high.rows(), "every row on one segment");
            Check.equal(List.of((byte) 1, (byte) 1), List.of(low.accessAsked.get(0), high.accessAsked.get(0)),
                    "the data plane asked for produce access");
            for (FakeAppendSegment segment : List.of(low, high)) {
                Check.equal(2, segment.stored.size(), "one append per chunk and segment");
                Check.isTrue(segment.stored.get(0).fullSchema(), "the producers' batch schema");
                Check.equal("sink:q-1:3:0", segment.stored.get(0).producerId(), "the chunk's producer");
            }
            for (FakeAppendSegment.Stored s : low.stored) {
                for (String k : s.keys()) {
                    Check.isTrue(Murmur3.keyHash(k) <= 32767, "low keys on the low segment");
                }
            }
            Check.equal(StreamSink.CHUNK_ROWS, low.stored.get(0).keys().size() + high.stored.get(0).keys().size(),
                    "the first chunk is CHUNK_ROWS rows");
            List<String> inOrder = new ArrayList<>();
            for (FakeAppendSegment.Stored s : low.stored) {
                for (int i = 0; i < s.keys().size(); i++) {
                    if (s.keys().get(i).equals("k-1")) {
                        inOrder.add(s.values().get(i));
                    }
                }
            }
            Check.equal(120, inOrder.size(), "every record of key k-1");
            Check.equal("v1", inOrder.get(0), "first k-1 record");
            Check.equal("v59501", inOrder.get(119), "last k-1 record: the key's order kept");
            List<FakeGateway.Request> opens = gateway.requests("/stream/sink/open");
            JsonNode open = opens.get(0).body();
            Check.equal(StreamSink.CHUNK_ROWS, open.get("hashes").size(), "the chunk's hashes");
            Check.equal(6347, open.get("hashes").get(1).asInt(), "k-1 hashes as mmh3 does in Python");
            Check.equal(7L, open.get("batchId").asLong(), "batch id");
            Check.equal(1, opens.get(1).body().get("chunk").asInt(), "second chunk numbered 1");
            Check.equal("Bearer tok-1", opens.get(0).authorization(), "the token to the gateway");
            Check.equal(2, gateway.requests("/stream/sink/finish").size(), "each chunk finished");
            Check.equal("g:1", gateway.requests("/stream/sink/finish").get(0).body()
                    .path("recorded").path("version").asText(), "the record sent back as it came");

            // a replay: the cluster says each chunk was stored; nothing is appended
            gateway.route("/stream/sink/open", "{\"recorded\": null, \"resumed\": true, "
                    + "\"producerId\": \"sink:q-1:3:0\", \"lastSequences\": {}}");
            RayTopicsDataWriter replay = new RayTopicsDataWriter(config, columns, key);
            for (int i = 0; i < 60_000; i++) {
                replay.write(row("k-" + (i % 500), "v" + i));
            }
            Check.equal(new RayTopicsDataWriter.Committed(0, 2), replay.commit(), "a replay stores nothing");
            Check.equal(60_000, low.rows() + high.rows(), "nothing more stored");

            // resumed: the low segment holds its part already, only the high one is appended
            gateway.route("/stream/sink/open", body -> opened(HALVES, true, "{\"0\": 8, \"1\": 7}", body));
            WriteKey next = new WriteKey("q-1", 8, 3);
            RayTopicsDataWriter resumed = new RayTopicsDataWriter(config, columns, next);
            resumed.write(row("k-2", "again")); // k-2 hashes high (54505)
            resumed.write(row("k-1", "low")); // k-1 low (6347)
            int lowBefore = low.stored.size();
            Check.equal(new RayTopicsDataWriter.Committed(1, 0), resumed.commit(), "only the missing part");
            Check.equal(lowBefore, low.stored.size(), "the stored part not sent again");

            // the high segment sealed by a split: its part goes to the child the cluster names
            high.sealed = true;
            gateway.route("/stream/sink/open", body -> opened(HALVES, false, "{}", body));
            gateway.route("/stream/sink/reroute", body -> new FakeGateway.Answer(200, recorded(
                    "[{\"segment\": 0, \"sequence\": 9, \"hash_range\": {\"start\": 0, \"end\": 32767}}, "
                    + "{\"segment\": 2, \"sequence\": 0, \"hash_range\": {\"start\": 32768, \"end\": 65535}}]",
                    "g:2")));
            RayTopicsDataWriter rerouted = new RayTopicsDataWriter(config, columns, new WriteKey("q-1", 9, 3));
            rerouted.write(row("k-2", "to the child"));
            rerouted.write(row(null, "no key"));
            Check.equal(new RayTopicsDataWriter.Committed(2, 0), rerouted.commit(), "rerouted and stored");
            Check.equal(List.of("to the child", "no key"), child.stored.get(0).values(), "the child took the part");
            JsonNode reroute = gateway.requests("/stream/sink/reroute").get(0).body();
            Check.equal(1, reroute.path("part").path("segment").asInt(), "the refused part named");
            Check.equal(41678, reroute.path("hashes").get(1).asInt(),
                    "a record without a key hashes by its place, as Python does");
            Check.equal("g:2", gateway.requests("/stream/sink/finish").get(3).body()
                    .path("recorded").path("version").asText(), "the rerouted record finished");
            high.sealed = false;

            // another attempt moved the record first: the chunk is opened again
            AtomicInteger finishes = new AtomicInteger();
            gateway.route("/stream/sink/finish", body -> finishes.incrementAndGet() == 1
                    ? new FakeGateway.Answer(409, "{\"error\": \"bad_version\", \"message\": \"moved\"}")
                    : new FakeGateway.Answer(200, "{\"finished\": true}"));
            int opensBefore = gateway.requests("/stream/sink/open").size();
            RayTopicsDataWriter raced = new RayTopicsDataWriter(config, columns, new WriteKey("q-1", 10, 3));
            raced.write(row("k-1", "raced"));
            raced.commit();
            Check.equal(opensBefore + 2, gateway.requests("/stream/sink/open").size(), "opened again");

            // a segment restarting: the connection drops, the append is sent again
            low.dropNext = 1;
            gateway.route("/stream/sink/finish", "{\"finished\": true}");
            RayTopicsDataWriter dropped = new RayTopicsDataWriter(config, columns, new WriteKey("q-1", 11, 3));
            dropped.write(row("k-1", "after a drop"));
            Check.equal(new RayTopicsDataWriter.Committed(1, 0), dropped.commit(), "stored after a reconnect");
            Check.equal("after a drop", low.stored.get(low.stored.size() - 1).values().get(0), "stored once");

            // refusals come back as the cluster's errors; an empty task sends nothing
            gateway.route("/stream/sink/open", body -> new FakeGateway.Answer(403,
                    "{\"error\": \"unauthorized\", \"message\": \"no produce grant\"}"));
            RayTopicsDataWriter refused = new RayTopicsDataWriter(config, columns, key);
            refused.write(row("k", "v"));
            Check.fails(RayTopicsException.class, refused::commit, "unauthorized", "no produce grant");
            int before = gateway.requests.size();
            new RayTopicsDataWriter(config, columns, key).commit();
            Check.equal(before, gateway.requests.size(), "an empty partition sends nothing");
        }
        System.out.println("SinkTest: ok");
    }

    private static void columns() throws java.io.IOException {
        StructType full = new StructType()
                .add("Key", DataTypes.StringType)
                .add("value", DataTypes.StringType)
                .add("properties", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType));
        Check.equal(new SinkColumns(1, true, 0, 2), SinkColumns.of(full), "all three columns");
        Check.equal(new SinkColumns(0, false, -1, -1),
                SinkColumns.of(new StructType().add("value", DataTypes.BinaryType)), "value only");
        Check.fails(IllegalArgumentException.class, () -> SinkColumns.of(new StructType()
                .add("value", DataTypes.BinaryType).add("extra", DataTypes.IntegerType)),
                "column extra of type int", "value (binary or string, required), key (string)");
        Check.fails(IllegalArgumentException.class, () -> SinkColumns.of(
                new StructType().add("value", DataTypes.IntegerType)), "column value of type int");
        Check.fails(IllegalArgumentException.class, () -> SinkColumns.of(
                new StructType().add("key", DataTypes.StringType)), "no value column");

        SinkColumns columns = SinkColumns.of(full);
        InternalRow row = new GenericInternalRow(new Object[] {
            UTF8String.fromString("k1"), UTF8String.fromString("héllo"),
            new ArrayBasedMapData(new GenericArrayData(new Object[] {UTF8String.fromString("a")}),
                    new GenericArrayData(new Object[] {UTF8String.fromString("b")}))});
        SinkRecord record = columns.toRecord(row);
        Check.equal("k1", record.key(), "key");
        Check.equal("héllo", new String(record.value(), java.nio.charset.StandardCharsets.UTF_8), "value");
        Check.equal(Map.of("a", "b"), record.properties(), "properties");
        SinkRecord bare = columns.toRecord(new GenericInternalRow(new Object[] {null, UTF8String.fromString(""), null}));
        Check.equal(null, bare.key(), "null key");
        Check.equal(null, bare.properties(), "null properties");
        Check.equal(58786, bare.routingHash(3, 0, 0), "a keyless record's hash, as mmh3 in Python");
        Check.equal(46132, bare.routingHash(3, 1, 7), "its place decides it");
        Check.fails(IllegalArgumentException.class, () -> columns.toRecord(new GenericInternalRow(
                new Object[] {null, null, null})), "a row has a null value");

        // encoded as the producers' batches: null keys and properties stay null, maps keep entries
        List<SinkRecord> mixed = List.of(new SinkRecord(null, new byte[] {1}, null),
                new SinkRecord("k", new byte[] {2}, Map.of("a", "b")), new SinkRecord("j", new byte[0], null));
        try (org.apache.arrow.memory.RootAllocator allocator = new org.apache.arrow.memory.RootAllocator();
                org.apache.arrow.vector.ipc.ArrowStreamReader reader = new org.apache.arrow.vector.ipc.ArrowStreamReader(
                        new java.io.ByteArrayInputStream(ArrowRecordEncoder.ipc(mixed, new int[] {0, 1, 2})), allocator)) {
            Check.isTrue(reader.loadNextBatch(), "one batch");
            org.apache.arrow.vector.VectorSchemaRoot root = reader.getVectorSchemaRoot();
            Check.equal(ArrowRecordEncoder.BATCH, root.getSchema(), "the batch schema");
            Check.equal(3, root.getRowCount(), "three rows");
            Check.isTrue(root.getVector("key").isNull(0), "a null key");
            Check.isTrue(root.getVector("properties").isNull(0), "null properties");
            Check.equal("[{\"key\":\"a\",\"value\":\"b\"}]", root.getVector("properties").getObject(1).toString(),
                    "a map's entries");
            Check.isTrue(root.getVector("properties").isNull(2), "null properties after a map");
        }

        List<SinkRecord> big = new ArrayList<>();
        for (int i = 0; i < 10_000; i++) { // ~20 MiB: two chunks by size, not by rows
            big.add(new SinkRecord(null, new byte[2_000], null));
        }
        List<int[]> chunks = StreamSink.chunks(big);
        Check.equal(2, chunks.size(), "chunks cut by size");
        Check.isTrue(chunks.get(0)[1] * 2_016L <= StreamSink.CHUNK_BYTES, "a chunk within its bytes");
    }

    private static InternalRow row(String key, String value) {
        return new GenericInternalRow(new Object[] {
            key == null ? null : UTF8String.fromString(key), UTF8String.fromString(value)});
    }

    private static String recorded(String parts, String version) {
        return "{\"write\": {\"batch\": 7, \"parts\": " + parts + ", \"done\": false}, \"version\": \""
                + version + "\", \"segments\": {\"0\": \"segment://t/ns/orders/0000-7fff-0\"}}";
    }

    /** The open answer to {@code request}: its chunk's producer, the parts given. */
    private static FakeGateway.Answer opened(String parts, boolean resumed, String lasts, JsonNode request) {
        String producer = "sink:" + request.path("queryId").asText() + ":"
                + request.path("partitionId").asInt() + ":" + request.path("chunk").asInt();
        String sequenced = String.format(parts, request.path("batchId").asLong());
        return new FakeGateway.Answer(200, "{\"recorded\": " + recorded(sequenced, "g:1") + ", \"resumed\": "
                + resumed + ", \"producerId\": \"" + producer + "\", \"lastSequences\": " + lasts + "}");
    }
}
