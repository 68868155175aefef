package io.raytopics.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import java.io.UncheckedIOException;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A stream position as the gateway produced it: an opaque JSON object, which only the
 * gateway interprets. Kept as its compact JSON text, which is what Spark writes to the
 * checkpoint's offset log; {@link Offset#equals} compares that text, so two positions
 * are equal exactly when the gateway wrote the same document.
 */
public final class TopicPosition extends Offset {
    private final String json;

    public TopicPosition(String json) {
        this.json = json;
    }

    /** A position object taken from a gateway answer. */
    static TopicPosition of(JsonNode position) {
        if (position == null || !position.isObject()) {
            throw new RayTopicsException(
                    "invalid_response", "the gateway sent a position that is not a JSON object: "
                            + position);
        }
        try {
            return new TopicPosition(Json.MAPPER.writeValueAsString(position));
        } catch (JsonProcessingException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Spark may hand back any Offset subclass (one read from the offset log): by its JSON. */
    static TopicPosition of(Offset offset) {
        return offset instanceof TopicPosition p ? p : new TopicPosition(offset.json());
    }

    /** The document, to embed in a request exactly as the gateway wrote it. */
    JsonNode node() {
        try {
            return Json.MAPPER.readTree(json);
        } catch (JsonProcessingException e) {
            throw new IllegalArgumentException("not a raytopics position: " + json, e);
        }
    }

    @Override
    public String json() {
        return json;
    }
}
