package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;

/** The driver's calls against an in-process gateway: request bodies, positions, partitions. */
public final class MicroBatchStreamTest {
    private static final String P0 = "{\"segments\":{\"0\":0},\"v\":1}";
    private static final String P1 = "{\"segments\":{\"0\":50},\"v\":1}";
    private static final String P2 = "{\"segments\":{\"0\":90},\"v\":1}";

    public static void main(String[] args) throws Exception {
        try (FakeGateway gateway = new FakeGateway()) {
            gateway.route("/stream/initial", "{\"position\": " + P0 + "}");
            gateway.route("/stream/latest", body -> new FakeGateway.Answer(200, body.get("maxMessages").isNull()
                    ? "{\"end\": " + P2 + ", \"warnings\": [\"segment 3 is slow\"], \"records\": 90,"
                            + " \"available\": 90, \"behind\": {\"0\": 0, \"2\": 6}}"
                    : "{\"end\": " + P1 + ", \"warnings\": [], \"records\": 50, \"available\": 90,"
                            + " \"segments\": 1, \"behind\": {\"0\": 40, \"2\": 6}}"));
            gateway.route("/stream/ranges", "{\"ranges\": ["
                    + "{\"segmentId\": 0, \"descriptor\": \"segment://t/ns/orders/0\", \"from\": 0, \"to\": 50,"
                    + " \"endpoint\": {\"host\": \"h0\", \"port\": 7000, \"tls\": true}},"
                    + "{\"segmentId\": 2, \"descriptor\": \"segment://t/ns/orders/2\", \"from\": 4, \"to\": 4,"
                    + " \"endpoint\": {\"host\": \"h2\", \"port\": 7002, \"tls\": false}}], \"warnings\": []}");
            ConnectionConfig config = gateway.config("tok");
            ReadOptions options = ReadOptions.parse(Map.of(
                    "startingTimestamp", "1700000000000",
                    "maxMessagesPerTrigger", "50", "failOnDataLoss", "false"));
            RayTopicsMicroBatchStream stream = new RayTopicsMicroBatchStream(new StreamGateway(config), options);

            Offset initial = stream.initialOffset();
            Check.equal(P0, initial.json(), "initial position");
            JsonNode init = gateway.requests("/stream/initial").get(0).body();
            Check.equal("{\"startingTimestampMs\":1700000000000}", init.toString(), "initial request");
            Check.equal("Bearer tok", gateway.requests("/stream/initial").get(0).authorization(), "bearer token");

            Check.equal(ReadLimit.maxRows(50), stream.getDefaultReadLimit(), "default read limit");
            Offset end = stream.latestOffset(stream.deserializeOffset(P0), stream.getDefaultReadLimit());
            Check.equal(P1, end.json(), "capped end");
            Check.equal("{\"start\":" + P0 + ",\"maxMessages\":50,\"until\":null,\"failOnDataLoss\":false}",
                    gateway.requests("/stream/latest").get(0).body().toString(), "latest request");

            Check.equal(Map.of("minOffsetsBehindLatest", "6", "maxOffsetsBehindLatest", "40",
                    "avgOffsetsBehindLatest", "23.0", "totalOffsetsBehindLatest", "46", "segmentsRead", "1"),
                    stream.metrics(Optional.of(end)), "offsets behind the planned batch's end");
            Check.equal(Map.of(), stream.metrics(Optional.of(initial)), "not the planned batch: no figures");
            Check.equal(Map.of(), stream.metrics(Optional.empty()), "no batch yet");

            InputPartition[] partitions = stream.planInputPartitions(initial, end);
            Check.equal(1, partitions.length, "the empty range is skipped");
            SegmentPartition p = (SegmentPartition) partitions[0];
            Check.equal(new SegmentPartition(config, 0, 0, 50, new Endpoint("h0", 7000, true), false), p, "partition");
            Check.equal("{\"start\":" + P0 + ",\"end\":" + P1 + ",\"failOnDataLoss\":false}",
                    gateway.requests("/stream/ranges").get(0).body().toString(), "ranges request");
            Check.isTrue(!p.toString().contains("tok,") && p.toString().contains("token=***"), "no token in toString");

            // Trigger.AvailableNow: the bound is what every segment holds when the run starts
            stream.prepareForTriggerAvailableNow();
            List<FakeGateway.Request> bound = gateway.requests("/stream/initial");
            Check.equal(2, bound.size(), "one bound request");
            Check.equal("{\"startingOffsets\":\"latest\"}", bound.get(1).body().toString(), "the bound");
            stream.latestOffset(end, ReadLimit.maxRows(50));
            stream.latestOffset(stream.deserializeOffset(P1), ReadLimit.allAvailable());
            List<FakeGateway.Request> latest = gateway.requests("/stream/latest");
            Check.equal(3, latest.size(), "one request per batch");
            Check.equal(P0, latest.get(1).body().get("until").toString(), "capped batch up to the bound");
            Check.equal(P0, latest.get(2).body().get("until").toString(), "uncapped batch up to the bound");
            Check.isTrue(latest.get(2).body().get("maxMessages").isNull(), "all available: no cap");

            minimumPerTrigger(gateway, config);

            gateway.route("/stream/latest", body -> new FakeGateway.Answer(503,
                    "{\"error\": \"unavailable_segments\", \"message\": \"segments [3] are missing\"}"));
            Check.fails(RayTopicsException.class, () -> stream.latestOffset(end, ReadLimit.allAvailable()),
                    "unavailable_segments", "segments [3] are missing");
        }
        Check.fails(IllegalArgumentException.class, () -> ReadOptions.parse(Map.of("startingOffsets", "[1]")),
                "startingOffsets");
        Check.fails(IllegalArgumentException.class, () -> ReadOptions.parse(Map.of("maxMessagesPerTrigger", "0")),
                "maxMessagesPerTrigger");
        Check.fails(IllegalArgumentException.class, () -> ReadOptions.parse(Map.of("minMessagesPerTrigger", "x")),
                "minMessagesPerTrigger");
        Check.fails(IllegalArgumentException.class, () -> ReadOptions.parse(Map.of("maxTriggerDelay", "soon")),
                "maxTriggerDelay");
        Check.fails(IllegalArgumentException.class, () -> ReadOptions.parse(Map.of("maxBytesPerTrigger", "0")),
                "maxBytesPerTrigger");
        Check.fails(IllegalArgumentException.class, () -> ReadOptions.parse(Map.of("maxBytesPerTrigger", "lots")),
                "maxBytesPerTrigger");
        Check.equal(900_000L, ReadOptions.parse(Map.of()).maxTriggerDelayMs(), "Kafka's default delay, 15m");
        Check.equal(null, ReadOptions.parse(Map.of()).startingOffsets(), "no start given: the gateway's");
        Check.equal("\"earliest\"", ReadOptions.parse(Map.of("startingOffsets", "EARLIEST"))
                .startingOffsets().toString(), "a start word");
        Check.fails(IllegalArgumentException.class, () -> ReadOptions.parse(Map.of(
                "startingOffsets", "earliest", "startingTimestamp", "5")), "startingTimestamp");
        Check.equal("/admin/v2/scalable/t/ns/orders", ConnectionConfig.restPath(FakeGateway.TOPIC), "REST path");
        Check.fails(IllegalArgumentException.class, () -> ConnectionConfig.restPath("t/ns/orders"), "topic://");
        Check.fails(IllegalArgumentException.class, () -> ConnectionConfig.resolve(Map.of("url", "http://x")),
                "topic");
        System.out.println("MicroBatchStreamTest: ok");
    }

    /**
     * minMessagesPerTrigger: no batch while fewer records are there, until maxTriggerDelay
     * has passed since the last batch; with maxMessagesPerTrigger both limits apply.
     */
    private static void minimumPerTrigger(FakeGateway gateway, ConnectionConfig config) {
        gateway.route("/stream/latest", body -> new FakeGateway.Answer(200, "{\"end\": " + P1
                + ", \"warnings\": [], \"records\": 50, \"available\": 90, \"behind\": {\"0\": 40}}"));
        long[] now = {1_000};
        ReadOptions options = ReadOptions.parse(Map.of(
                "minMessagesPerTrigger", "100", "maxTriggerDelay", "1m", "maxMessagesPerTrigger", "50",
                "maxBytesPerTrigger", "2k"));
        RayTopicsMicroBatchStream stream = new RayTopicsMicroBatchStream(
                new StreamGateway(config), options, () -> now[0]);
        Check.equal(ReadLimit.compositeLimit(new ReadLimit[] {ReadLimit.minRows(100, 60_000), ReadLimit.maxRows(50)}),
                stream.getDefaultReadLimit(), "both limits");
        Offset start = stream.deserializeOffset(P0);
        Check.equal(P0, stream.latestOffset(start, stream.getDefaultReadLimit()).json(), "90 < 100: no batch");
        Check.equal(Map.of(), stream.metrics(Optional.of(start)), "nothing planned yet");
        now[0] += 59_000;
        Check.equal(P0, stream.latestOffset(start, stream.getDefaultReadLimit()).json(), "still within the delay");
        now[0] += 1_000;
        Check.equal(P1, stream.latestOffset(start, stream.getDefaultReadLimit()).json(), "the delay passed");
        JsonNode last = lastRequest(gateway, "/stream/latest");
        Check.equal("50", last.get("maxMessages").toString(), "capped by the maximum all along");
        Check.equal("2048", last.get("maxBytes").toString(), "and by the byte cap");
        Check.equal(P0, stream.latestOffset(start, ReadLimit.minRows(100, 60_000)).json(),
                "a batch just ran: the delay starts again");
        Check.equal(P1, stream.latestOffset(start, ReadLimit.minRows(90, 60_000)).json(), "90 are enough for 90");
    }

    private static JsonNode lastRequest(FakeGateway gateway, String suffix) {
        List<FakeGateway.Request> requests = gateway.requests(suffix);
        return requests.get(requests.size() - 1).body();
    }
}
