package io.raytopics.spark;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

/**
 * The driver side of a streaming read. It plans nothing itself: every offset and range
 * comes from the gateway, which alone knows the topic's segment DAG.
 */
final class RayTopicsMicroBatchStream implements MicroBatchStream, SupportsTriggerAvailableNow {
    private final StreamGateway gateway;
    private final ReadOptions options;
    private boolean availableNow;
    private TopicPosition until;

    RayTopicsMicroBatchStream(StreamGateway gateway, ReadOptions options) {
        this.gateway = gateway;
        this.options = options;
    }

    @Override
    public Offset initialOffset() {
        return gateway.initial(options.startingOffsets(), options.startingTimestampMs());
    }

    /** Spark calls {@link #latestOffset(Offset, ReadLimit)} on a source with admission control. */
    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException("raytopics uses latestOffset(Offset, ReadLimit)");
    }

    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
        TopicPosition from = TopicPosition.of(start);
        if (availableNow && until == null) {
            // Captured here, not in prepareForTriggerAvailableNow: Spark prepares before it has
            // read the checkpoint, and the gateway needs the query's actual start.
            until = gateway.latest(from, null, null, options.failOnDataLoss());
        }
        Long max = limit instanceof ReadMaxRows rows ? rows.maxRows() : null;
        return gateway.latest(from, max, until, options.failOnDataLoss());
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        availableNow = true;
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        Long max = options.maxMessagesPerTrigger();
        return max == null ? ReadLimit.allAvailable() : ReadLimit.maxRows(max);
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        return gateway.ranges(TopicPosition.of(start), TopicPosition.of(end), options.failOnDataLoss())
                .toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new SegmentReaderFactory();
    }

    @Override
    public Offset deserializeOffset(String json) {
        return new TopicPosition(json);
    }

    /** Positions live in Spark's checkpoint; the cluster keeps no cursor to advance. */
    @Override
    public void commit(Offset end) {}

    @Override
    public void stop() {}
}
