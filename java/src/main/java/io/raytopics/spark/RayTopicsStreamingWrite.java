package io.raytopics.spark;

import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;

/**
 * Each task stores its rows itself when it commits, keyed by (query id, batch id,
 * partition): the gateway drops a replay of a key it already stored, which makes a
 * retried task or a re-run batch after a restart exactly-once without a driver commit.
 */
final class RayTopicsStreamingWrite implements StreamingWrite {
    private final ConnectionConfig connection;
    private final SinkColumns columns;
    private final String queryId;

    RayTopicsStreamingWrite(ConnectionConfig connection, SinkColumns columns, String queryId) {
        this.connection = connection;
        this.columns = columns;
        this.queryId = queryId;
    }

    @Override
    public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
        return new RayTopicsWriterFactory(connection, columns, queryId);
    }

    /** The tasks' records are already stored; the batch is done when Spark logs its commit. */
    @Override
    public void commit(long epochId, WriterCommitMessage[] messages) {}

    /** Stored chunks stay: a re-run of the batch is deduplicated by its idempotency keys. */
    @Override
    public void abort(long epochId, WriterCommitMessage[] messages) {}
}
