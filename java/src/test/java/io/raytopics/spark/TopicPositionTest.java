package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.sql.connector.read.streaming.Offset;

/** Positions are the gateway's documents, kept and sent back unchanged. */
public final class TopicPositionTest {
    public static void main(String[] args) throws Exception {
        String json = "{\"v\":1,\"segments\":{\"3\":120,\"0\":-1},\"finished\":[1,2],\"big\":12345678901234567890,"
                + "\"s\":\"a\\\"q\\\\\",\"n\":null}";
        // (Jackson writes non-ASCII as UTF-8, not as backslash-u escapes: equal JSON, other bytes.
        // The gateway's positions are ASCII: segment ids, offsets, flags.)
        TopicPosition position = new TopicPosition(json);
        Check.equal(json, position.json(), "json() is the text kept");
        Check.equal(json, Json.MAPPER.writeValueAsString(position.node()), "node() writes back byte for byte");
        Check.equal(json, TopicPosition.of(position.node()).json(), "through a node and back");

        // From a gateway answer (Python's json.dumps spacing): compact, field order kept.
        JsonNode answer = Json.MAPPER.readTree("{\"position\": {\"z\": 1, \"a\": [1, 2], \"m\": {\"b\": 2, \"a\": 1}}}");
        TopicPosition taken = TopicPosition.of(answer.get("position"));
        Check.equal("{\"z\":1,\"a\":[1,2],\"m\":{\"b\":2,\"a\":1}}", taken.json(), "compact, in order");

        Offset fromLog = new Offset() {
            @Override
            public String json() {
                return taken.json();
            }
        };
        Check.isTrue(taken.equals(fromLog) && fromLog.equals(taken), "equal to any Offset with the same json");
        Check.isTrue(TopicPosition.of(fromLog).equals(taken), "an offset from the log converts");
        Check.isTrue(!taken.equals(new TopicPosition("{\"a\":[1,2],\"z\":1}")), "different text: different position");
        Check.fails(RayTopicsException.class, () -> TopicPosition.of(Json.MAPPER.readTree("[1]")), "not a JSON object");
        System.out.println("TopicPositionTest: ok");
    }
}
