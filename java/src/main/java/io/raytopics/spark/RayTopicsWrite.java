package io.raytopics.spark;

import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;

/** An append of a streaming query's rows to a topic; nothing to configure, so builder = write. */
final class RayTopicsWrite implements WriteBuilder, Write {
    private final ConnectionConfig connection;
    private final SinkColumns columns;
    private final String queryId;

    RayTopicsWrite(ConnectionConfig connection, SinkColumns columns, String queryId) {
        this.connection = connection;
        this.columns = columns;
        this.queryId = queryId;
    }

    @Override
    public Write build() {
        return this;
    }

    @Override
    public String description() {
        return "raytopics " + connection.topicName();
    }

    @Override
    public StreamingWrite toStreaming() {
        return new RayTopicsStreamingWrite(connection, columns, queryId);
    }
}
