package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The streaming calls of the REST gateway, which does all the planning: positions are
 * its documents, and only it knows which segments a position covers.
 */
final class StreamGateway {
    private static final Logger LOG = LoggerFactory.getLogger(StreamGateway.class);

    private final ConnectionConfig config;
    private final GatewayClient client;

    StreamGateway(ConnectionConfig config) {
        this.config = config;
        this.client = new GatewayClient(config);
    }

    /** Fails (topic_not_found, or why the gateway cannot be reached) unless the topic exists. */
    void requireTopic() {
        client.get("");
    }

    /**
     * Where a new query starts: {@code startingOffsets} ("earliest", "latest" or an object)
     * or {@code startingTimestampMs}, at most one of them (neither: the gateway's default).
     */
    TopicPosition initial(JsonNode startingOffsets, Long startingTimestampMs) {
        ObjectNode body = Json.MAPPER.createObjectNode();
        if (startingOffsets != null) {
            body.set("startingOffsets", startingOffsets);
        }
        if (startingTimestampMs != null) {
            body.put("startingTimestampMs", startingTimestampMs);
        }
        return TopicPosition.of(client.post("/stream/initial", body).get("position"));
    }

    /**
     * The next batch from a position, as the gateway planned it.
     *
     * @param end where the batch ends
     * @param records how many records it reads
     * @param segments from how many segments
     * @param available how many it would read under no record limit
     * @param behind per segment, the records held past {@code end} when it was planned
     */
    record Batch(TopicPosition end, long records, long segments, long available, Map<Long, Long> behind) {}

    /**
     * The end of the next batch from {@code start}: at most {@code maxMessages} records
     * (null: all available) and about {@code maxBytes} bytes (null: no byte cap), never
     * beyond {@code until} (null: no bound).
     */
    Batch latest(TopicPosition start, Long maxMessages, Long maxBytes, TopicPosition until,
            boolean failOnDataLoss) {
        ObjectNode body = Json.MAPPER.createObjectNode();
        body.set("start", start.node());
        body.put("maxMessages", maxMessages);
        if (maxBytes != null) {
            body.put("maxBytes", maxBytes);
        }
        body.set("until", until == null ? null : until.node());
        body.put("failOnDataLoss", failOnDataLoss);
        JsonNode answer = client.post("/stream/latest", body);
        logWarnings(answer);
        Map<Long, Long> behind = new TreeMap<>();
        answer.path("behind").fields().forEachRemaining(
                e -> behind.put(Long.parseLong(e.getKey()), e.getValue().asLong()));
        return new Batch(TopicPosition.of(answer.get("end")), answer.path("records").asLong(),
                answer.path("segments").asLong(), answer.path("available").asLong(), behind);
    }

    /** The segment ranges between two positions, one partition each (empty ranges dropped). */
    List<SegmentPartition> ranges(TopicPosition start, TopicPosition end, boolean failOnDataLoss) {
        ObjectNode body = Json.MAPPER.createObjectNode();
        body.set("start", start.node());
        body.set("end", end.node());
        body.put("failOnDataLoss", failOnDataLoss);
        JsonNode answer = client.post("/stream/ranges", body);
        logWarnings(answer);
        List<SegmentPartition> partitions = new ArrayList<>();
        for (JsonNode range : answer.path("ranges")) {
            long from = range.path("from").asLong();
            long to = range.path("to").asLong();
            if (from < to) {
                partitions.add(new SegmentPartition(
                        config, range.path("segmentId").asLong(), from, to,
                        Endpoint.of(range.get("endpoint")), failOnDataLoss));
            }
        }
        return partitions;
    }

    /** Where a segment serves now: after a reconnect, it may have moved. */
    Endpoint endpoint(long segmentId) {
        return Endpoint.of(client.get("/stream/endpoint/" + segmentId));
    }

    private void logWarnings(JsonNode answer) {
        for (JsonNode warning : answer.path("warnings")) {
            LOG.warn("raytopics {}: {}", config.topicName(), warning.asText());
        }
    }
}
