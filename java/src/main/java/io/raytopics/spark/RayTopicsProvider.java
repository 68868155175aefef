package io.raytopics.spark;

import java.util.Map;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** {@code format("raytopics")}: found by Spark through META-INF/services. */
public final class RayTopicsProvider implements TableProvider, DataSourceRegister {
    @Override
    public String shortName() {
        return "raytopics";
    }

    /**
     * The schema is fixed: a topic's records all have the same columns. Spark asks for it at
     * {@code load()} (and a sink's {@code start()}), so the options and the topic are checked
     * here: a typo fails the call that made it, not the query's first batch.
     */
    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        ReadOptions.parse(options);
        new StreamGateway(ConnectionConfig.resolve(options)).requireTopic();
        return RecordSchema.SCHEMA;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        String topic = new CaseInsensitiveStringMap(properties).getOrDefault("topic", "raytopics");
        return new RayTopicsTable(topic);
    }
}
