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

    /** The schema is fixed: a topic's records all have the same columns. */
    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return RecordSchema.SCHEMA;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        String topic = new CaseInsensitiveStringMap(properties).getOrDefault("topic", "raytopics");
        return new RayTopicsTable(topic);
    }
}
