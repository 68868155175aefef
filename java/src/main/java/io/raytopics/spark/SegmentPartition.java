package io.raytopics.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One Spark task's work: records {@code [from, to)} of one segment. Carries everything
 * the executor needs (it cannot reach the driver's options or the planning answer).
 */
public record SegmentPartition(
        ConnectionConfig connection,
        long segmentId,
        long from,
        long to,
        Endpoint endpoint,
        boolean failOnDataLoss)
        implements InputPartition {}
