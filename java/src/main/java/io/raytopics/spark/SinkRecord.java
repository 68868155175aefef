package io.raytopics.spark;

import java.nio.charset.StandardCharsets;
import java.util.Map;

/**
 * One record a sink stores: its key (null: none), value and properties (null: none).
 *
 * @param key the key, which routes the record as a producer's key does
 * @param value the value's bytes
 * @param properties string properties, or null
 */
record SinkRecord(String key, byte[] value, Map<String, String> properties) {
    /**
     * The record's routing hash: its key's, as every producer routes; a record without a key
     * gets one from its place in the write, so a replay routes it the same way (the Python
     * side's {@code runtime.sink_writes.routing_hashes}).
     */
    int routingHash(int partition, int chunk, int index) {
        if (key != null) {
            return Murmur3.keyHash(key);
        }
        byte[] place = (partition + ":" + chunk + ":" + index).getBytes(StandardCharsets.UTF_8);
        return Murmur3.hash32(place) & Murmur3.KEY_HASH_MASK;
    }

    /** About the bytes the record takes in an append, to keep a chunk within bounds. */
    long size() {
        long bytes = value.length + 16L;
        if (key != null) {
            bytes += key.length() * 3L;
        }
        if (properties != null) {
            for (Map.Entry<String, String> e : properties.entrySet()) {
                bytes += 3L * (e.getKey().length() + (e.getValue() == null ? 0 : e.getValue().length())) + 8;
            }
        }
        return bytes;
    }
}
