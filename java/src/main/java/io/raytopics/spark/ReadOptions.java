package io.raytopics.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.TextNode;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.function.ToLongFunction;
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

    /** Kafka's default for {@code maxTriggerDelay}, 15m. */
    static final long DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000;

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
                parsed(options, "maxBytesPerTrigger", JavaUtils::byteStringAsBytes, 1,
                        "a size of at least one byte, such as 64m, 1g or 1048576"),
                longAtLeast(options, "minMessagesPerTrigger", 1),
                Objects.requireNonNullElse(parsed(options, "maxTriggerDelay", JavaUtils::timeStringAsMs,
                        0, "a duration such as 30s, 15m or 500ms"), DEFAULT_MAX_TRIGGER_DELAY_MS),
                bool(options.getOrDefault("failOnDataLoss", "true")));
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
        return parsed(options, key, Long::parseLong, min, "an integer >= " + min);
    }

    /**
     * Option {@code key} read by {@code parse} (null when absent), refused unless it is at
     * least {@code min}; the error says what was {@code expected}.
     */
    private static Long parsed(Map<String, String> options, String key, ToLongFunction<String> parse,
            long min, String expected) {
        String text = options.get(key);
        if (text == null) {
            return null;
        }
        try {
            long value = parse.applyAsLong(text.trim());
            if (value >= min) {
                return value;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        throw new IllegalArgumentException(
                "raytopics option " + key + " must be " + expected + ", got " + text);
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
