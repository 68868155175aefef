package io.raytopics.spark;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A read of the fixed schema: nothing to push down, so the builder is the scan. */
final class RayTopicsScan implements ScanBuilder, Scan {
    private final CaseInsensitiveStringMap options;

    RayTopicsScan(CaseInsensitiveStringMap options) {
        this.options = options;
    }

    @Override
    public Scan build() {
        return this;
    }

    @Override
    public StructType readSchema() {
        return RecordSchema.SCHEMA;
    }

    @Override
    public String description() {
        return "raytopics " + options.get("topic");
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        return new RayTopicsMicroBatchStream(
                new StreamGateway(ConnectionConfig.resolve(options)), ReadOptions.parse(options));
    }
}
