package io.raytopics.spark;

import java.nio.charset.StandardCharsets;

/** Gateway answers: error documents become exceptions that carry the cluster's code and text. */
public final class GatewayErrorTest {
    public static void main(String[] args) {
        RayTopicsException lost = Check.fails(RayTopicsException.class, () -> GatewayClient.answer(503,
                        utf8("{\"error\": \"unavailable_segments\", \"message\": \"segments [0, 2] are missing\"}")),
                "unavailable_segments", "segments [0, 2] are missing");
        Check.equal("unavailable_segments", lost.code(), "code");
        Check.equal("unavailable_segments: segments [0, 2] are missing", lost.getMessage(), "message");
        Check.fails(RayTopicsException.class, () -> GatewayClient.answer(403,
                utf8("{\"error\":\"unauthorized\",\"message\":\"no consume grant\"}")), "unauthorized", "no consume grant");
        Check.fails(RayTopicsException.class, () -> GatewayClient.answer(502,
                utf8("<html>Bad Gateway</html>")), "http_502", "Bad Gateway");
        Check.fails(RayTopicsException.class, () -> GatewayClient.answer(200, utf8("{oops")), "invalid_response");
        Check.equal(7, GatewayClient.answer(200, utf8("{\"stored\": 7}")).get("stored").asInt(), "a 2xx document");
        System.out.println("GatewayErrorTest: ok");
    }

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }
}
