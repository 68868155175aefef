package io.raytopics.spark;

import java.io.Serializable;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * Where the sink finds value, key and properties in its input rows. Checked when the
 * query starts, so a wrong DataFrame fails there rather than in every task.
 *
 * @param value the value column's index
 * @param valueIsString whether the value is a string (sent as its UTF-8 bytes) or binary
 * @param key the key column's index, -1 if none (records without key)
 * @param properties the properties column's index, -1 if none
 */
record SinkColumns(int value, boolean valueIsString, int key, int properties) implements Serializable {
    static final String ALLOWED = "value (binary or string, required), key (string), "
            + "properties (map<string,string>)";

    static SinkColumns of(StructType schema) {
        int value = -1;
        int key = -1;
        int properties = -1;
        boolean valueIsString = false;
        StructField[] fields = schema.fields();
        for (int i = 0; i < fields.length; i++) {
            String name = fields[i].name().toLowerCase(Locale.ROOT);
            DataType type = fields[i].dataType();
            boolean duplicate;
            if (name.equals("value") && (type instanceof BinaryType || type instanceof StringType)) {
                duplicate = value >= 0;
                value = i;
                valueIsString = type instanceof StringType;
            } else if (name.equals("key") && type instanceof StringType) {
                duplicate = key >= 0;
                key = i;
            } else if (name.equals("properties") && isStringMap(type)) {
                duplicate = properties >= 0;
                properties = i;
            } else {
                throw refuse("column " + fields[i].name() + " of type " + type.simpleString());
            }
            if (duplicate) {
                throw refuse("a second column named " + fields[i].name());
            }
        }
        if (value < 0) {
            throw refuse("no value column");
        }
        return new SinkColumns(value, valueIsString, key, properties);
    }

    /** A row as the record the sink stores (copied: Spark reuses the row object). */
    SinkRecord toRecord(InternalRow row) {
        String k = key < 0 || row.isNullAt(key) ? null : row.getUTF8String(key).toString();
        if (row.isNullAt(value)) {
            throw new IllegalArgumentException("raytopics sink: a row has a null value");
        }
        byte[] bytes = valueIsString ? row.getUTF8String(value).getBytes() : row.getBinary(value);
        Map<String, String> props = null;
        if (properties >= 0 && !row.isNullAt(properties)) {
            MapData map = row.getMap(properties);
            ArrayData keys = map.keyArray();
            ArrayData values = map.valueArray();
            props = new LinkedHashMap<>();
            for (int i = 0; i < map.numElements(); i++) {
                props.put(keys.getUTF8String(i).toString(),
                        values.isNullAt(i) ? null : values.getUTF8String(i).toString());
            }
        }
        return new SinkRecord(k, bytes, props);
    }

    private static boolean isStringMap(DataType type) {
        return type instanceof MapType map
                && map.keyType() instanceof StringType
                && map.valueType() instanceof StringType;
    }

    private static IllegalArgumentException refuse(String what) {
        return new IllegalArgumentException(
                "raytopics sink: " + what + "; the allowed columns are " + ALLOWED);
    }
}
