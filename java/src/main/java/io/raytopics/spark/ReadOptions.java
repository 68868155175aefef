package io.raytopics.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.TextNode;
import java.util.Locale;
import java.util.Map;
import org.apache.spark.network.util.JavaUtils;

/**
 * The source's own options (the connection's are in {@link ConnectionConfig}).
 *
 * @param startingOffsets "earliest", "latest" or a {@code {"<segmentId>": offset}} object, or null
 * @param startingTimestampMs publish time (epoch ms) to start from, or null (not with the other)
 * @param maxMessagesPerTrigger the per-batch cap, or null for none
 * @param maxBytesPerTrigger about the most bytes per batch (estimated by the gateway from
 *     each segment's mean stored record size), or null for no byte cap
 * @param minMessagesPerTrigger the fewest records a batch waits for, or null for none
 *     (Kafka's {@code minOffsetsPerTrigger})
 * @param maxTriggerDelayMs how long a batch waits for {@code minMessagesPerTrigger} at most
 * @param failOnDataLoss whether records lost to retention fail the query
 */
record ReadOptions(
        JsonNode startingOffsets,
        Long startingTimestampMs,
        Long maxMessagesPerTrigger,
        Long maxBytesPerTrigger,
        Long minMessagesPerTrigger,
        long maxTriggerDelayMs,
        boolean failOnDataLoss) {

    /** Kafka's default for {@code maxTriggerDelay}. */
    static final String DEFAULT_MAX_TRIGGER_DELAY = "15m";

    /** Neither start option given: null for both, and the gateway starts at "latest". */
    static ReadOptions parse(Map<String, String> options) {
        String offsets = options.get("startingOffsets");
        Long timestamp = longAtLeast(options, "startingTimestamp", 0);
        if (offsets != null && timestamp != null) {
            throw new IllegalArgumentException("raytopics options startingOffsets and "
                    + "startingTimestamp exclude each other: give one of them (or neither, "
                    + "to start at the latest)");
        }
        return new ReadOptions(
                offsets == null ? null : startingOffsets(offsets),
                timestamp,
                longAtLeast(options, "maxMessagesPerTrigger", 1),
                bytes(options.get("maxBytesPerTrigger")),
                longAtLeast(options, "minMessagesPerTrigger", 1),
                duration(options.getOrDefault("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY)),
                bool(options.getOrDefault("failOnDataLoss", "true")));
    }

    /** A size as Spark writes them ("64m", "1g", "512k"; a bare number is bytes), or null. */
    private static Long bytes(String text) {
        if (text == null) {
            return null;
        }
        try {
            long value = JavaUtils.byteStringAsBytes(text.trim());
            if (value >= 1) {
                return value;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        throw new IllegalArgumentException("raytopics option maxBytesPerTrigger must be a size "
                + "of at least one byte, such as 64m, 1g or 1048576, got " + text);
    }

    /** A time as Spark writes them ("15m", "30s", "500ms"; a bare number is milliseconds). */
    private static long duration(String text) {
        try {
            long ms = JavaUtils.timeStringAsMs(text.trim());
            if (ms >= 0) {
                return ms;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        throw new IllegalArgumentException("raytopics option maxTriggerDelay must be a duration "
                + "such as 30s, 15m or 500ms, got " + text);
    }

    private static JsonNode startingOffsets(String text) {
        String word = text.trim().toLowerCase(Locale.ROOT);
        if (word.equals("earliest") || word.equals("latest")) {
            return TextNode.valueOf(word);
        }
        try {
            JsonNode node = Json.MAPPER.readTree(text);
            if (node != null && node.isObject()) {
                return node;
            }
        } catch (JsonProcessingException e) {
            // reported below with the accepted forms
        }
        throw new IllegalArgumentException("raytopics option startingOffsets must be \"earliest\", "
                + "\"latest\" or a JSON object {\"<segmentId>\": offset, ...}, got " + text);
    }

    private static Long longAtLeast(Map<String, String> options, String key, long min) {
        String text = options.get(key);
        if (text == null) {
            return null;
        }
        try {
            long value = Long.parseLong(text.trim());
            if (value >= min) {
                return value;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        throw new IllegalArgumentException(
                "raytopics option " + key + " must be an integer >= " + min + ", got " + text);
    }

    private static boolean bool(String text) {
        switch (text.trim().toLowerCase(Locale.ROOT)) {
            case "true":
                return true;
            case "false":
                return false;
            default:
                throw new IllegalArgumentException(
                        "raytopics option failOnDataLoss must be true or false, got " + text);
        }
    }
}
