package io.raytopics.spark;

import com.fasterxml.jackson.databind.node.TextNode;
import java.util.LongSummaryStatistics;
import java.util.Map;
import java.util.Optional;
import java.util.function.LongSupplier;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.CompositeReadLimit;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.ReadMinRows;
import org.apache.spark.sql.connector.read.streaming.ReportsSourceMetrics;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

/**
 * The driver side of a streaming read. It plans nothing itself: every offset and range
 * comes from the gateway, which alone knows the topic's segment DAG.
 *
 * <p>Admission control as Spark's Kafka source has it: at most {@code maxMessagesPerTrigger}
 * records a batch (and about {@code maxBytesPerTrigger} bytes, as a file source), and with
 * {@code minMessagesPerTrigger} no batch until that many are there or {@code maxTriggerDelay}
 * has passed since the last one. Each batch's progress
 * reports how far the query is behind what the segments held when it was planned
 * ({@code minOffsetsBehindLatest}, {@code maxOffsetsBehindLatest}, {@code avgOffsetsBehindLatest}
 * over the segments it has not finished, as Kafka's over partitions, and
 * {@code totalOffsetsBehindLatest}) and from how many segments it read ({@code segmentsRead}).
 */
final class RayTopicsMicroBatchStream
        implements MicroBatchStream, SupportsTriggerAvailableNow, ReportsSourceMetrics {
    private final StreamGateway gateway;
    private final ReadOptions options;
    private final LongSupplier clockMs;
    private TopicPosition until;
    private StreamGateway.Batch planned;
    private long lastBatchMs;

    RayTopicsMicroBatchStream(StreamGateway gateway, ReadOptions options) {
        this(gateway, options, System::currentTimeMillis);
    }

    RayTopicsMicroBatchStream(StreamGateway gateway, ReadOptions options, LongSupplier clockMs) {
        this.gateway = gateway;
        this.options = options;
        this.clockMs = clockMs;
        this.lastBatchMs = clockMs.getAsLong();
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
        ReadMaxRows max = part(limit, ReadMaxRows.class);
        ReadMinRows min = part(limit, ReadMinRows.class);
        StreamGateway.Batch batch = gateway.latest(from, max == null ? null : max.maxRows(),
                options.maxBytesPerTrigger(), until, options.failOnDataLoss());
        long now = clockMs.getAsLong();
        if (min != null && until == null && batch.available() < min.minRows()
                && now - lastBatchMs < min.maxTriggerDelayMs()) {
            return from;  // no batch yet: too few records, and the delay has not passed
        }
        planned = batch;
        if (batch.records() > 0) {
            lastBatchMs = now;
        }
        return batch.end();
    }

    /** The limit of kind {@code kind} in {@code limit}, alone or in a composite, or null. */
    private static <T extends ReadLimit> T part(ReadLimit limit, Class<T> kind) {
        if (kind.isInstance(limit)) {
            return kind.cast(limit);
        }
        if (limit instanceof CompositeReadLimit composite) {
            for (ReadLimit one : composite.getReadLimits()) {
                if (kind.isInstance(one)) {
                    return kind.cast(one);
                }
            }
        }
        return null;
    }

    /**
     * Offsets behind latest for the batch Spark last ran, when it ends where the last
     * planned batch ends (else nothing: what the segments held is not known for it).
     */
    @Override
    public Map<String, String> metrics(Optional<Offset> latestConsumedOffset) {
        StreamGateway.Batch last = planned;
        if (last == null || latestConsumedOffset.isEmpty() || last.behind().isEmpty()
                || !last.end().json().equals(latestConsumedOffset.get().json())) {
            return Map.of();
        }
        LongSummaryStatistics behind = last.behind().values().stream()
                .mapToLong(Long::longValue).summaryStatistics();
        return Map.of(
                "minOffsetsBehindLatest", Long.toString(behind.getMin()),
                "maxOffsetsBehindLatest", Long.toString(behind.getMax()),
                "avgOffsetsBehindLatest", Double.toString(behind.getAverage()),
                "totalOffsetsBehindLatest", Long.toString(behind.getSum()),
                "segmentsRead", Long.toString(last.segments()));
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
        Long min = options.minMessagesPerTrigger();
        if (min != null && max != null) {
            return ReadLimit.compositeLimit(new ReadLimit[] {
                ReadLimit.minRows(min, options.maxTriggerDelayMs()), ReadLimit.maxRows(max)});
        }
        if (min != null) {
            return ReadLimit.minRows(min, options.maxTriggerDelayMs());
        }
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
