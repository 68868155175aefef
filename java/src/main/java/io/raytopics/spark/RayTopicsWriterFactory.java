package io.raytopics.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;

/** Ships to executors with everything a task's writer needs. */
final class RayTopicsWriterFactory implements StreamingDataWriterFactory {
    private static final long serialVersionUID = 1L;

    private final ConnectionConfig connection;
    private final SinkColumns columns;
    private final String queryId;

    RayTopicsWriterFactory(ConnectionConfig connection, SinkColumns columns, String queryId) {
        this.connection = connection;
        this.columns = columns;
        this.queryId = queryId;
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
        return new RayTopicsDataWriter(connection, columns, new WriteKey(queryId, epochId, partitionId));
    }
}
