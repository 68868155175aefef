package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.Serializable;

/** Where a segment's data plane listens, and whether it speaks TLS there. */
public record Endpoint(String host, int port, boolean tls) implements Serializable {
    /** From the gateway's {@code {"host", "port", "tls"}} document. */
    static Endpoint of(JsonNode doc) {
        if (doc == null || !doc.hasNonNull("host") || !doc.path("port").canConvertToInt()) {
            throw new RayTopicsException(
                    "invalid_response", "the gateway sent an endpoint without host/port: " + doc);
        }
        return new Endpoint(
                doc.get("host").asText(), doc.get("port").asInt(), doc.path("tls").asBoolean(false));
    }
}
