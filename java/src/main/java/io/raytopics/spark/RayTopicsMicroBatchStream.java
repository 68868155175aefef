package io.raytopics.spark;

import com.fasterxml.jackson.databind.node.TextNode;
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
        Long max = limit instanceof ReadMaxRows rows ? rows.maxRows() : null;
        return gateway.latest(from, max, until, options.failOnDataLoss());
    }

    @Override
    /**
     * The bound of an AvailableNow run: what every segment holds now (the "latest" start
     * position). Segments created later are not in it, so the run reads none of them,
     * while children that exist now are read once their parents are, up to their ends now.
     */
    public void prepareForTriggerAvailableNow() {
        until = gateway.initial(TextNode.valueOf("latest"), null);
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
