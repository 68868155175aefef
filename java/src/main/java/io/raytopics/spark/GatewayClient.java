package io.raytopics.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

/** JSON over HTTP to the cluster's REST gateway, for one topic. */
final class GatewayClient {
    private static final Duration CONNECT_TIMEOUT = Duration.ofSeconds(10);
    // Planning may wait for segments the gateway has to locate or restart.
    private static final Duration REQUEST_TIMEOUT = Duration.ofSeconds(120);

    private final ConnectionConfig config;
    private final HttpClient http;

    GatewayClient(ConnectionConfig config) {
        this.config = config;
        HttpClient.Builder builder = HttpClient.newBuilder().connectTimeout(CONNECT_TIMEOUT);
        if (config.caFile() != null) {
            builder.sslContext(TlsContexts.trusting(config.caFile()));
        }
        this.http = builder.build();
    }

    /** POST {@code body} to the topic's path + {@code suffix}; the answer's document. */
    JsonNode post(String suffix, JsonNode body) {
        try {
            byte[] bytes = Json.MAPPER.writeValueAsBytes(body);
            return send(request(suffix).POST(HttpRequest.BodyPublishers.ofByteArray(bytes)));
        } catch (JsonProcessingException e) {
            throw new UncheckedIOException(e);
        }
    }

    JsonNode get(String suffix) {
        return send(request(suffix).GET());
    }

    private HttpRequest.Builder request(String suffix) {
        HttpRequest.Builder builder = HttpRequest.newBuilder(
                        URI.create(config.url() + config.topicPath() + suffix))
                .timeout(REQUEST_TIMEOUT)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json");
        if (config.token() != null) {
            builder.header("Authorization", "Bearer " + config.token());
        }
        return builder;
    }

    private JsonNode send(HttpRequest.Builder builder) {
        HttpRequest request = builder.build();
        HttpResponse<byte[]> response;
        try {
            response = http.send(request, HttpResponse.BodyHandlers.ofByteArray());
        } catch (IOException e) {
            throw new UncheckedIOException(
                    "raytopics gateway " + request.method() + " " + request.uri() + ": " + e, e);
        } catch (InterruptedException e) {
            // A query being stopped interrupts its thread: Spark takes an interruption (here
            // an UncheckedIOException caused by an InterruptedIOException) as the stop, not
            // as the query's failure.
            Thread.currentThread().interrupt();
            InterruptedIOException cause = new InterruptedIOException(
                    "interrupted while calling the raytopics gateway");
            cause.initCause(e);
            throw new UncheckedIOException(cause);
        }
        return answer(response.statusCode(), response.body());
    }

    /** The document of a 2xx answer; any other status as the error it reports. */
    static JsonNode answer(int status, byte[] body) {
        if (status < 200 || status > 299) {
            throw RayTopicsException.fromErrorJson(body, 0, "http_" + status);
        }
        try {
            return Json.MAPPER.readTree(body);
        } catch (IOException e) {
            throw new RayTopicsException(
                    "invalid_response", "the gateway answered " + status + " with invalid JSON");
        }
    }
}
