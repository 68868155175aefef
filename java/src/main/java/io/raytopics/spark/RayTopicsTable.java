package io.raytopics.spark;

import java.util.EnumSet;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A topic as a Spark table: streamed from (micro-batches) and streamed into. */
final class RayTopicsTable implements SupportsRead, SupportsWrite {
    private final String topic;

    RayTopicsTable(String topic) {
        this.topic = topic;
    }

    @Override
    public String name() {
        return topic;
    }

    /** Deprecated in favour of columns(), yet still abstract in Spark 3.5. */
    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return RecordSchema.SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.MICRO_BATCH_READ, TableCapability.STREAMING_WRITE);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        return new RayTopicsScan(options);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        return new RayTopicsWrite(
                ConnectionConfig.resolve(info.options()), SinkColumns.of(info.schema()), info.queryId());
    }
}
