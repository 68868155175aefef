package io.raytopics.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Buffers one task's rows and stores them at commit, so an attempt that fails midway has
 * sent nothing (or chunks its retry will resend under the same keys).
 */
final class RayTopicsDataWriter implements DataWriter<InternalRow> {
    private static final Logger LOG = LoggerFactory.getLogger(RayTopicsDataWriter.class);
    static final int CHUNK_ROWS = 5_000;
    static final long CHUNK_BYTES = 512 * 1024;

    private final GatewayClient gateway;
    private final SinkColumns columns;
    private final WriteKey key;
    private final List<ObjectNode> records = new ArrayList<>();

    RayTopicsDataWriter(GatewayClient gateway, SinkColumns columns, WriteKey key) {
        this.gateway = gateway;
        this.columns = columns;
        this.key = key;
    }

    @Override
    public void write(InternalRow row) {
        records.add(columns.toRecord(row)); // now: Spark reuses the row object
    }

    @Override
    public WriterCommitMessage commit() {
        List<ObjectNode> requests = requests(key, records);
        int stored = 0;
        for (ObjectNode request : requests) {
            JsonNode answer = gateway.post("/stream/write", request);
            stored += answer.path("stored").asInt();
            if (answer.path("duplicate").asBoolean(false)) {
                LOG.info("raytopics: {} chunk {} was already stored (a replay)", key, request.path("chunk"));
            }
        }
        records.clear();
        return new Committed(stored);
    }

    /**
     * The request bodies for a task's records, numbered chunks of at most {@link #CHUNK_ROWS}
     * records and about {@link #CHUNK_BYTES} of JSON each: the gateway refuses bodies over
     * 1 MiB. Chunk boundaries depend only on the rows, so a replay sends the same chunks.
     */
    static List<ObjectNode> requests(WriteKey key, List<ObjectNode> records) {
        List<ObjectNode> requests = new ArrayList<>();
        int chunk = 0;
        int start = 0;
        while (start < records.size()) {
            int end = start;
            long bytes = 0;
            while (end < records.size() && end - start < CHUNK_ROWS
                    && (end == start || bytes + size(records.get(end)) <= CHUNK_BYTES)) {
                bytes += size(records.get(end));
                end++;
            }
            ObjectNode body = key.request();
            body.put("chunk", chunk++);
            body.putArray("records").addAll(records.subList(start, end));
            requests.add(body);
            start = end;
        }
        return requests;
    }

    /** A record's JSON size, near enough to keep a chunk under the gateway's limit. */
    private static long size(ObjectNode record) {
        return record.toString().length() + 8L;
    }

    /** Nothing was sent yet, or what was sent is keyed for a replay to deduplicate. */
    @Override
    public void abort() {
        records.clear();
    }

    @Override
    public void close() {
        records.clear();
    }

    /** How many records the gateway reported stored for the task. */
    record Committed(int stored) implements WriterCommitMessage {}
}
