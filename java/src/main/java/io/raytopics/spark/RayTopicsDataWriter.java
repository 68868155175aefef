package io.raytopics.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;

/**
 * Buffers one task's rows and stores them at commit ({@link StreamSink}), so an attempt
 * that fails midway has stored nothing, or chunks its retry finds stored under the same
 * keys.
 */
final class RayTopicsDataWriter implements DataWriter<InternalRow> {
    private final ConnectionConfig connection;
    private final SinkColumns columns;
    private final WriteKey key;
    private final List<SinkRecord> records = new ArrayList<>();

    RayTopicsDataWriter(ConnectionConfig connection, SinkColumns columns, WriteKey key) {
        this.connection = connection;
        this.columns = columns;
        this.key = key;
    }

    @Override
    public void write(InternalRow row) {
        records.add(columns.toRecord(row)); // now: Spark reuses the row object
    }

    @Override
    public WriterCommitMessage commit() throws IOException {
        if (records.isEmpty()) {
            return new Committed(0, 0);
        }
        try (StreamSink sink = new StreamSink(connection)) {
            StreamSink.Stored stored = sink.store(key, records);
            return new Committed(stored.rows(), stored.replayedChunks());
        } finally {
            records.clear();
        }
    }

    /** Nothing was stored yet, or what was stored is keyed for a replay to find. */
    @Override
    public void abort() {
        records.clear();
    }

    @Override
    public void close() {
        records.clear();
    }

    /** What the task stored: rows this attempt appended, chunks it found stored (a replay). */
    record Committed(long stored, int replayedChunks) implements WriterCommitMessage {}
}
