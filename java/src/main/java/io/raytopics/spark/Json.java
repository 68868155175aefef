package io.raytopics.spark;

import com.fasterxml.jackson.databind.ObjectMapper;

/** The one Jackson mapper: thread-safe once configured, and costly to build per use. */
final class Json {
    static final ObjectMapper MAPPER = new ObjectMapper();

    private Json() {}
}
