package io.raytopics.spark;

import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** The source's fixed row schema; the column indices are the positions in every InternalRow. */
final class RecordSchema {
    static final int KEY = 0;
    static final int VALUE = 1;
    static final int HASH = 2;
    static final int SEGMENT_ID = 3;
    static final int OFFSET = 4;
    static final int PUBLISH_TIME = 5;
    static final int PROPERTIES = 6;

    static final StructType SCHEMA = new StructType(new StructField[] {
        DataTypes.createStructField("key", DataTypes.StringType, true),
        DataTypes.createStructField("value", DataTypes.BinaryType, false),
        DataTypes.createStructField("hash", DataTypes.IntegerType, true),
        DataTypes.createStructField("segment_id", DataTypes.LongType, false),
        DataTypes.createStructField("offset", DataTypes.LongType, false),
        DataTypes.createStructField("publish_time", DataTypes.TimestampType, false),
        DataTypes.createStructField(
                "properties", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType), true),
    });

    private RecordSchema() {}
}
