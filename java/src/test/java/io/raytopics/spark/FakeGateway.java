package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.Function;

/** An in-process REST gateway: canned answers per path suffix, and a record of the requests. */
final class FakeGateway implements AutoCloseable {
    static final String TOPIC = "topic://t/ns/orders";
    static final String TOPIC_PATH = "/admin/v2/scalable/t/ns/orders";

    record Request(String method, String suffix, JsonNode body, String authorization) {}

    record Answer(int status, String json) {}

    final List<Request> requests = new CopyOnWriteArrayList<>();
    private final Map<String, Function<JsonNode, Answer>> routes = new ConcurrentHashMap<>();
    private final HttpServer server;

    FakeGateway() throws IOException {
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext(TOPIC_PATH, exchange -> {
            String suffix = exchange.getRequestURI().getPath().substring(TOPIC_PATH.length());
            byte[] raw = exchange.getRequestBody().readAllBytes();
            JsonNode body = raw.length == 0 ? null : Json.MAPPER.readTree(raw);
            requests.add(new Request(exchange.getRequestMethod(), suffix, body,
                    exchange.getRequestHeaders().getFirst("Authorization")));
            Function<JsonNode, Answer> route = routes.get(suffix);
            Answer answer = route == null
                    ? new Answer(404, "{\"error\":\"not_found\",\"message\":\"no route " + suffix + "\"}")
                    : route.apply(body);
            byte[] out = answer.json().getBytes(StandardCharsets.UTF_8);
            exchange.sendResponseHeaders(answer.status(), out.length);
            try (OutputStream os = exchange.getResponseBody()) {
                os.write(out);
            }
        });
        server.start();
    }

    void route(String suffix, Function<JsonNode, Answer> answer) {
        routes.put(suffix, answer);
    }

    void route(String suffix, String json) {
        route(suffix, body -> new Answer(200, json));
    }

    ConnectionConfig config(String token) {
        return new ConnectionConfig("http://127.0.0.1:" + server.getAddress().getPort(), TOPIC_PATH, token, null);
    }

    List<Request> requests(String suffix) {
        return requests.stream().filter(r -> r.suffix().equals(suffix)).toList();
    }

    @Override
    public void close() {
        server.stop(0);
    }
}
