package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/** The sink's column checks and the write requests a task sends at commit. */
public final class SinkTest {
    public static void main(String[] args) throws Exception {
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
        Check.equal("{\"key\":\"k1\",\"value\":\"" + Base64.getEncoder().encodeToString("héllo".getBytes("UTF-8"))
                + "\",\"properties\":{\"a\":\"b\"}}", columns.toRecord(row).toString(), "a full record");
        InternalRow bare = new GenericInternalRow(new Object[] {null, UTF8String.fromString(""), null});
        Check.equal("{\"key\":null,\"value\":\"\",\"properties\":null}", columns.toRecord(bare).toString(),
                "null key and properties");

        try (FakeGateway gateway = new FakeGateway()) {
            gateway.route("/stream/write", body -> new FakeGateway.Answer(200,
                    "{\"stored\": " + body.get("records").size() + ", \"duplicate\": false}"));
            WriteKey key = new WriteKey("q-1", 7, 3);
            RayTopicsDataWriter small = new RayTopicsDataWriter(new GatewayClient(gateway.config(null)), columns, key);
            small.write(row);
            small.write(bare);
            Check.equal(new RayTopicsDataWriter.Committed(2), small.commit(), "small commit");
            JsonNode one = gateway.requests("/stream/write").get(0).body();
            Check.equal("q-1", one.get("queryId").asText(), "query id");
            Check.equal(7L, one.get("batchId").asLong(), "batch id");
            Check.equal(3, one.get("partitionId").asInt(), "partition id");
            Check.equal(0, one.get("chunk").asInt(), "one chunk, numbered 0");
            Check.equal(null, gateway.requests("/stream/write").get(0).authorization(), "no token, no header");

            RayTopicsDataWriter big = new RayTopicsDataWriter(new GatewayClient(gateway.config(null)), columns, key);
            for (int i = 0; i < 12_001; i++) {
                big.write(row);
            }
            Check.equal(new RayTopicsDataWriter.Committed(12_001), big.commit(), "chunked commit");
            List<Integer> sizes = new ArrayList<>();
            List<String> marks = new ArrayList<>();
            for (FakeGateway.Request r : gateway.requests("/stream/write").subList(1, 4)) {
                sizes.add(r.body().get("records").size());
                marks.add(r.body().get("chunk").asText());
            }
            Check.equal(List.of(5_000, 5_000, 2_001), sizes, "chunk sizes");
            Check.equal(List.of("0", "1", "2"), marks, "chunk numbers");

            List<ObjectNode> large = new ArrayList<>();
            for (int i = 0; i < 3_000; i++) { // ~700 KiB of base64 values: two chunks by size
                large.add(columns.toRecord(new GenericInternalRow(new Object[] {
                    null, UTF8String.fromString("x".repeat(180)), null})));
            }
            List<ObjectNode> bySize = RayTopicsDataWriter.requests(key, large);
            Check.equal(2, bySize.size(), "chunks cut by size, not only by rows");
            for (ObjectNode body : bySize) {
                Check.isTrue(body.toString().length() < 600 * 1024, "a chunk stays under the limit");
            }

            RayTopicsDataWriter empty = new RayTopicsDataWriter(new GatewayClient(gateway.config(null)), columns, key);
            empty.commit();
            Check.equal(4, gateway.requests("/stream/write").size(), "an empty partition sends nothing");

            gateway.route("/stream/write", body -> new FakeGateway.Answer(403,
                    "{\"error\": \"unauthorized\", \"message\": \"no produce grant\"}"));
            RayTopicsDataWriter refused = new RayTopicsDataWriter(new GatewayClient(gateway.config(null)), columns, key);
            refused.write(row);
            Check.fails(RayTopicsException.class, refused::commit, "unauthorized", "no produce grant");
        }
        System.out.println("SinkTest: ok");
    }
}
