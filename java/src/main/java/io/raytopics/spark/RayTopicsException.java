package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;

/**
 * An error the cluster reported (REST gateway or segment data plane), or data the read
 * could not deliver. The message always starts with the cluster's error code so that
 * a user (and a test) can tell e.g. {@code unavailable_segments} from an auth refusal.
 */
public final class RayTopicsException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    /** The code of a read that lost records (retention, a lost segment). */
    public static final String UNAVAILABLE_SEGMENTS = "unavailable_segments";
    /** The code of a TLS handshake that cannot succeed by trying again (trust, host name). */
    public static final String TLS_ERROR = "tls_error";

    private final String code;

    public RayTopicsException(String code, String message) {
        super(code + ": " + message);
        this.code = code;
    }

    public String code() {
        return code;
    }

    /**
     * The exception of an error document {@code {"error": code, "message": text}};
     * {@code fallbackCode} names the error when the body is not such a document (a
     * proxy's HTML page, a truncated frame), whose text is then kept as the message.
     */
    static RayTopicsException fromErrorJson(byte[] body, int from, String fallbackCode) {
        String text = new String(body, from, body.length - from, StandardCharsets.UTF_8);
        try {
            JsonNode doc = Json.MAPPER.readTree(text);
            if (doc != null && doc.isObject() && doc.hasNonNull("error")) {
                return new RayTopicsException(
                        doc.get("error").asText(), doc.path("message").asText(""));
            }
        } catch (java.io.IOException notJson) {
            // fall through: report the raw text under the fallback code
        }
        String shown = text.length() > 500 ? text.substring(0, 500) + "..." : text;
        return new RayTopicsException(fallbackCode, shown);
    }
}
