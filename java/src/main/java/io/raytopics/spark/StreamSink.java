package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.Closeable;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SSLContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A streaming sink task's rows stored once, however often Spark runs the task again: the
 * Python side's {@code runtime.sink_writes} protocol, with the cluster keeping each chunk's
 * record (the gateway's {@code stream/sink} calls) and the rows going straight to their
 * segments over the data plane, as a producer's batches do.
 *
 * <p>A task's rows are cut into chunks that depend only on the rows, so a replay cuts them
 * alike. For each chunk the cluster records where each record goes before anything is
 * appended: parts, each a hash range on one segment under the chunk's producer id and a
 * sequence. A replay gets the same record back and appends what the segments do not hold
 * (a segment answers a sequence it stored with where it went). A part refused by a
 * segment sealed since (a split or merge) is given to the owners of its range now.
 */
final class StreamSink implements Closeable {
    private static final Logger LOG = LoggerFactory.getLogger(StreamSink.class);
    /** Rows per chunk: one append per segment each, half a namespace's default cap. */
    static final int CHUNK_ROWS = 50_000;
    /** About this many bytes per chunk at most (a namespace's default batch cap is 64 MiB). */
    static final long CHUNK_BYTES = 16L << 20;
    /** Another attempt of the same chunk moved its record first this many times: give up. */
    private static final int MAX_RACES = 20;
    private static final long RETRY_WINDOW_NS = TimeUnit.SECONDS.toNanos(30);
    private static final long FIRST_PAUSE_MS = 100;
    private static final long MAX_PAUSE_MS = 2_000;

    private final ConnectionConfig config;
    private final GatewayClient gateway;
    private final StreamGateway streams;
    private final Map<Long, SegmentConnection> connections = new HashMap<>();
    private final Map<Long, Endpoint> endpoints = new HashMap<>();
    private SSLContext tls;

    StreamSink(ConnectionConfig config) {
        this.config = config;
        this.gateway = new GatewayClient(config);
        this.streams = new StreamGateway(config);
    }

    /** The task's result: rows appended by this attempt, chunks a replay found stored. */
    record Stored(long rows, int replayedChunks) {}

    /** Stores {@code records} under {@code key}, chunk by chunk. */
    Stored store(WriteKey key, List<SinkRecord> records) throws IOException {
        long rows = 0;
        int replayed = 0;
        List<int[]> chunks = chunks(records);
        for (int chunk = 0; chunk < chunks.size(); chunk++) {
            int[] bounds = chunks.get(chunk);
            List<SinkRecord> rowsOf = records.subList(bounds[0], bounds[1]);
            long stored = storeChunk(key, chunk, rowsOf);
            if (stored < 0) {
                replayed++;
                LOG.info("raytopics: {} chunk {} was already stored (a replay)", key, chunk);
            } else {
                rows += stored;
            }
        }
        return new Stored(rows, replayed);
    }

    /**
     * {@code [from, to)} of each chunk: at most {@link #CHUNK_ROWS} rows and about
     * {@link #CHUNK_BYTES}, at least one row. Boundaries depend only on the rows.
     */
    static List<int[]> chunks(List<SinkRecord> records) {
        List<int[]> chunks = new ArrayList<>();
        int start = 0;
        while (start < records.size()) {
            int end = start;
            long bytes = 0;
            while (end < records.size() && end - start < CHUNK_ROWS
                    && (end == start || bytes + records.get(end).size() <= CHUNK_BYTES)) {
                bytes += records.get(end).size();
                end++;
            }
            chunks.add(new int[] {start, end});
            start = end;
        }
        return chunks;
    }

    static int[] hashes(List<SinkRecord> rows, int partition, int chunk) {
        int[] hashes = new int[rows.size()];
        for (int i = 0; i < hashes.length; i++) {
            hashes[i] = rows.get(i).routingHash(partition, chunk, i);
        }
        return hashes;
    }

    /** Rows this attempt appended, or -1 when the chunk was stored before. */
    private long storeChunk(WriteKey key, int chunk, List<SinkRecord> rows) throws IOException {
        int[] hashes = hashes(rows, key.partitionId(), chunk);
        for (int race = 0; ; race++) {
            ObjectNode request = chunkKey(key, chunk);
            request.put("batchId", key.batchId());
            request.set("hashes", array(hashes));
            JsonNode opened = gateway.post("/stream/sink/open", request);
            if (opened.path("recorded").isNull()) {
                return -1;
            }
            try {
                Chunk carried = new Chunk(key, chunk, rows, hashes, opened);
                long stored = carried.carryOut();
                ObjectNode finish = chunkKey(key, chunk);
                finish.set("recorded", carried.recorded);
                gateway.post("/stream/sink/finish", finish);
                return stored;
            } catch (RayTopicsException e) {
                boolean raced = e.code().equals("bad_version") || e.code().equals("already_exists");
                if (!raced || race >= MAX_RACES) {
                    throw e;
                }
                // another attempt of the same chunk (a speculative task) moved first: look again
                LOG.info("raytopics: {} chunk {}: {}; opening it again", key, chunk, e.getMessage());
            }
        }
    }

    private static ObjectNode chunkKey(WriteKey key, int chunk) {
        ObjectNode body = Json.MAPPER.createObjectNode();
        body.put("queryId", key.queryId());
        body.put("partitionId", key.partitionId());
        body.put("chunk", chunk);
        return body;
    }

    private static ArrayNode array(int[] hashes) {
        ArrayNode array = Json.MAPPER.createArrayNode();
        for (int hash : hashes) {
            array.add(hash);
        }
        return array;
    }

    /** One chunk's record carried out: its parts appended, rerouted where refused. */
    private final class Chunk {
        final WriteKey key;
        final int chunk;
        final List<SinkRecord> rows;
        final int[] hashes;
        final String producerId;
        final boolean resumed;
        final Map<Long, Long> lastSequences = new HashMap<>();
        JsonNode recorded;

        Chunk(WriteKey key, int chunk, List<SinkRecord> rows, int[] hashes, JsonNode opened) {
            this.key = key;
            this.chunk = chunk;
            this.rows = rows;
            this.hashes = hashes;
            this.producerId = opened.path("producerId").asText();
            this.resumed = opened.path("resumed").asBoolean(false);
            this.recorded = opened.get("recorded");
            opened.path("lastSequences").fields().forEachRemaining(
                    e -> lastSequences.put(Long.parseLong(e.getKey()), e.getValue().asLong()));
        }

        /**
         * Appends every part, each segment's in sequence order: a round sends the next part
         * of each segment that has one, all at once, then reads their answers; parts
         * refused by a sealed segment go to the owners of their ranges, for the next rounds.
         */
        long carryOut() throws IOException {
            long stored = 0;
            List<JsonNode> pending = inAppendOrder(parts(recorded));
            while (!pending.isEmpty()) {
                Map<Long, JsonNode> firsts = new LinkedHashMap<>();
                for (JsonNode part : pending) {
                    firsts.putIfAbsent(part.path("segment").asLong(), part);
                }
                pending.removeAll(firsts.values());
                List<Append> round = new ArrayList<>();
                for (JsonNode part : firsts.values()) {
                    Append append = prepare(part);
                    if (append != null) {
                        round.add(append);
                    }
                }
                for (Append append : round) {
                    append.send();
                }
                for (Append append : round) {
                    try {
                        stored += append.finish();
                    } catch (RayTopicsException e) {
                        if (!e.code().equals("segment_terminated")) {
                            throw e;
                        }
                        pending.addAll(reroute(append.part));
                        pending = inAppendOrder(pending);
                    }
                }
            }
            return stored;
        }

        /** This part's append, or null when it has no records or its segment holds it. */
        private Append prepare(JsonNode part) {
            int[] selected = rowsOf(part);
            long segment = part.path("segment").asLong();
            long sequence = part.path("sequence").asLong();
            if (selected.length == 0
                    || (resumed && lastSequences.getOrDefault(segment, -1L) >= sequence)) {
                return null;
            }
            return new Append(part, segment, sequence, ArrowRecordEncoder.ipc(rows, selected), selected.length);
        }

        /** One part's append: sent with the round, its answer read after; retried alone. */
        private final class Append {
            final JsonNode part;
            final long segment;
            final long sequence;
            final byte[] payload;
            final int rows;
            boolean sent;

            Append(JsonNode part, long segment, long sequence, byte[] payload, int rows) {
                this.part = part;
                this.segment = segment;
                this.sequence = sequence;
                this.payload = payload;
                this.rows = rows;
            }

            void send() {
                try {
                    connection(segment).sendAppend(producerId, sequence, payload);
                    sent = true;
                } catch (IOException | RayTopicsException e) {
                    drop(segment); // finish() sends it again, with the retries
                }
            }

            /** Rows stored; a refusal of the segment is thrown (segment_terminated among them). */
            long finish() throws IOException {
                if (sent) {
                    try {
                        connection(segment).appended();
                        return rows;
                    } catch (IOException e) {
                        drop(segment);
                    } catch (RayTopicsException e) {
                        drop(segment);
                        if (!e.code().equals("unavailable") && !e.code().equals("not_ready")) {
                            throw e;
                        }
                    }
                }
                appendWithRetries(segment, producerId, sequence, payload);
                return rows;
            }
        }

        private int[] rowsOf(JsonNode part) {
            JsonNode range = part.path("hash_range");
            int start = range.path("start").asInt();
            int end = range.path("end").asInt();
            int count = 0;
            for (int hash : hashes) {
                if (hash >= start && hash <= end) {
                    count++;
                }
            }
            int[] selected = new int[count];
            int at = 0;
            for (int i = 0; i < hashes.length; i++) {
                if (hashes[i] >= start && hashes[i] <= end) {
                    selected[at++] = i;
                }
            }
            return selected;
        }

        /** Gives {@code part}'s range to its owners now; the parts that came of it. */
        private List<JsonNode> reroute(JsonNode part) {
            Set<String> held = new HashSet<>();
            for (JsonNode p : parts(recorded)) {
                held.add(p.toString());
            }
            ObjectNode request = chunkKey(key, chunk);
            request.set("recorded", recorded);
            request.set("part", part);
            request.set("hashes", array(hashes));
            recorded = gateway.post("/stream/sink/reroute", request);
            List<JsonNode> moved = new ArrayList<>();
            for (JsonNode p : parts(recorded)) {
                if (!held.contains(p.toString())) {
                    moved.add(p);
                }
            }
            LOG.info("raytopics: {} chunk {}: segment {} was sealed; its part goes to {} part(s)",
                    key, chunk, part.path("segment").asLong(), moved.size());
            return moved;
        }
    }

    private static List<JsonNode> parts(JsonNode recorded) {
        List<JsonNode> parts = new ArrayList<>();
        recorded.path("write").path("parts").forEach(parts::add);
        return parts;
    }

    private static List<JsonNode> inAppendOrder(List<JsonNode> parts) {
        List<JsonNode> sorted = new ArrayList<>(parts);
        sorted.sort(Comparator.comparingLong((JsonNode p) -> p.path("segment").asLong())
                .thenComparingLong(p -> p.path("sequence").asLong()));
        return sorted;
    }

    /**
     * Appends over the segment's data plane; a connection that fails is opened again where
     * the gateway says the segment serves now (it may be restarting elsewhere), for
     * {@link #RETRY_WINDOW_NS}. Resending a sequence is safe: the segment stores it once.
     */
    private void appendWithRetries(long segment, String producerId, long sequence, byte[] payload)
            throws IOException {
        long deadline = System.nanoTime() + RETRY_WINDOW_NS;
        long pauseMs = FIRST_PAUSE_MS;
        while (true) {
            try {
                connection(segment).append(producerId, sequence, payload);
                return;
            } catch (IOException e) {
                drop(segment);
                pauseMs = pauseOrFail(segment, deadline, pauseMs, e);
                relocate(segment);
            } catch (RayTopicsException e) {
                drop(segment);
                if (!e.code().equals("unavailable") && !e.code().equals("not_ready")) {
                    throw e;
                }
                pauseMs = pauseOrFail(segment, deadline, pauseMs, e);
            }
        }
    }

    private long pauseOrFail(long segment, long deadline, long pauseMs, Exception cause)
            throws InterruptedIOException {
        if (System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(pauseMs) > deadline) {
            RayTopicsException failure = new RayTopicsException(RayTopicsException.UNAVAILABLE_SEGMENTS,
                    "segment " + segment + " of " + config.topicName() + " took no append for "
                            + TimeUnit.NANOSECONDS.toSeconds(RETRY_WINDOW_NS) + " s: " + cause);
            failure.initCause(cause);
            throw failure;
        }
        LOG.info("raytopics segment {}: append failed ({}); retrying in {} ms", segment, cause, pauseMs);
        try {
            Thread.sleep(pauseMs);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("raytopics sink interrupted");
        }
        return Math.min(pauseMs * 2, MAX_PAUSE_MS);
    }

    private void relocate(long segment) {
        try {
            endpoints.put(segment, streams.endpoint(segment));
        } catch (UncheckedIOException | RayTopicsException e) {
            LOG.info("raytopics segment {}: endpoint lookup failed: {}", segment, e.getMessage());
        }
    }

    private SegmentConnection connection(long segment) throws IOException {
        SegmentConnection connection = connections.get(segment);
        if (connection == null) {
            Endpoint endpoint = endpoints.get(segment);
            if (endpoint == null) {
                endpoint = streams.endpoint(segment);
                endpoints.put(segment, endpoint);
            }
            if (endpoint.tls() && tls == null) {
                tls = TlsContexts.trusting(config.caFile());
            }
            connection = SegmentConnection.open(endpoint, config.token(), tls, WireProtocol.ACCESS_PRODUCE);
            connections.put(segment, connection);
        }
        return connection;
    }

    private void drop(long segment) {
        SegmentConnection connection = connections.remove(segment);
        if (connection != null) {
            try {
                connection.close();
            } catch (IOException e) {
                LOG.debug("raytopics: closing a failed connection", e);
            }
        }
    }

    @Override
    public void close() {
        for (Long segment : new ArrayList<>(connections.keySet())) {
            drop(segment);
        }
    }
}
