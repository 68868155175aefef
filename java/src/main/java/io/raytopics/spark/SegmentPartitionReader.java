package io.raytopics.spark;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.UncheckedIOException;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SSLContext;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads one segment range {@code [from, to)} over the data plane, on an executor.
 *
 * <p>Records the planner promised may briefly be invisible (a replica catching up) or
 * unreachable (the segment restarting elsewhere): both are retried for
 * {@link #RETRY_WINDOW_NS} from the last progress. Records that will never come
 * (removed by retention, or past the end of a terminated segment) are data loss,
 * which {@code failOnDataLoss} turns into a failure or a warning.
 */
final class SegmentPartitionReader implements PartitionReader<InternalRow> {
    private static final Logger LOG = LoggerFactory.getLogger(SegmentPartitionReader.class);
    static final int MAX_RECORDS_PER_READ = 10_000;
    static final long RETRY_WINDOW_NS = TimeUnit.SECONDS.toNanos(30);
    private static final long FIRST_PAUSE_MS = 100;
    private static final long MAX_PAUSE_MS = 2_000;

    private final SegmentPartition range;
    private final ConnectionConfig connectionConfig;
    private final BufferAllocator allocator = new RootAllocator();
    private SSLContext tls;
    private StreamGateway gateway;
    private Endpoint endpoint;
    private SegmentConnection connection;
    private long next;
    private Iterator<InternalRow> batch = Collections.emptyIterator();
    private InternalRow current;

    SegmentPartitionReader(SegmentPartition range) {
        this.range = range;
        this.connectionConfig = range.connection();
        this.endpoint = range.endpoint();
        this.next = range.from();
    }

    @Override
    public boolean next() throws IOException {
        while (!batch.hasNext()) {
            if (next >= range.to()) {
                return false;
            }
            batch = fetch().iterator();
        }
        current = batch.next();
        return true;
    }

    @Override
    public InternalRow get() {
        return current;
    }

    /** The next records from {@code next} (none if the rest of the range was lost). */
    private List<InternalRow> fetch() throws IOException {
        long deadline = System.nanoTime() + RETRY_WINDOW_NS;
        long pauseMs = FIRST_PAUSE_MS;
        while (true) {
            WireProtocol.Records answer;
            try {
                answer = connection().read(next, (int) Math.min(MAX_RECORDS_PER_READ, range.to() - next));
            } catch (IOException e) {
                closeConnection();
                pauseMs = pauseOrFail(deadline, pauseMs, "connection to " + endpoint + " failed: " + e, e);
                relocate();
                continue;
            }
            ArrowRecordDecoder.Decoded decoded = decode(answer);
            if (decoded.started() > next) {
                lose(Math.min(decoded.started(), range.to()), "removed by retention");
            }
            if (decoded.firstOffset() >= 0) {
                List<InternalRow> rows = decoded.rows();
                next = rows.isEmpty() ? range.to() : following(decoded, lastOffset(rows) + 1);
                return rows;
            }
            long stepped = following(decoded, next);
            if (stepped > next) {  // only records no reader gets: markers, aborted ones
                next = Math.min(stepped, range.to());
                return List.of();
            }
            if (answer.terminated()) {
                lose(range.to(), "the segment is terminated at end offset " + answer.endOffset());
                return List.of();
            }
            pauseMs = pauseOrFail(deadline, pauseMs, "no records at offset " + next
                    + " (segment end offset " + answer.endOffset() + ")", null);
        }
    }

    private static long lastOffset(List<InternalRow> rows) {
        return rows.get(rows.size() - 1).getLong(RecordSchema.OFFSET);
    }

    /**
     * Where the read after one that ends at {@code after} starts: further on when the segment
     * stepped over records no reader gets there (Python's {@code runtime.batch.following}); a
     * read cut short at {@code to}, or one that started further on than asked, ends elsewhere.
     */
    private static long following(ArrowRecordDecoder.Decoded decoded, long after) {
        boolean empty = decoded.rows().isEmpty();
        boolean endsThere = decoded.statedAfter() == after || (empty && decoded.statedAfter() > after);
        return endsThere ? Math.max(after, decoded.following()) : after;
    }

    private ArrowRecordDecoder.Decoded decode(WireProtocol.Records answer) {
        if (!answer.hasArrow()) {
            return new ArrowRecordDecoder.Decoded(List.of(), -1, -1, -1, -1);
        }
        try {
            return ArrowRecordDecoder.decode(answer.arrow(), allocator, range.segmentId(), range.to());
        } catch (IOException e) {
            throw new RayTopicsException("invalid_response", "segment " + range.segmentId()
                    + " sent records that are not an Arrow IPC stream: " + e);
        }
    }

    /** Records {@code [next, until)} will never be served: fail, or warn and skip them. */
    private void lose(long until, String why) {
        String what = "segment " + range.segmentId() + " of " + connectionConfig.topicName()
                + ": offsets [" + next + ", " + until + ") are no longer available (" + why + ")";
        if (range.failOnDataLoss()) {
            throw new RayTopicsException(RayTopicsException.UNAVAILABLE_SEGMENTS,
                    what + "; set option failOnDataLoss=false to skip lost records");
        }
        LOG.warn("raytopics data loss: {}", what);
        next = until;
    }

    /** Waits before the next attempt (doubling), or fails once the retry window is over. */
    private long pauseOrFail(long deadline, long pauseMs, String problem, Exception cause)
            throws InterruptedIOException {
        if (System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(pauseMs) > deadline) {
            RayTopicsException failure = new RayTopicsException(RayTopicsException.UNAVAILABLE_SEGMENTS,
                    "segment " + range.segmentId() + " of " + connectionConfig.topicName()
                            + " made no progress for " + TimeUnit.NANOSECONDS.toSeconds(RETRY_WINDOW_NS)
                            + " s: " + problem);
            if (cause != null) {
                failure.initCause(cause);
            }
            throw failure;
        }
        LOG.info("raytopics segment {}: {}; retrying in {} ms", range.segmentId(), problem, pauseMs);
        try {
            Thread.sleep(pauseMs);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("raytopics read interrupted");
        }
        return Math.min(pauseMs * 2, MAX_PAUSE_MS);
    }

    /** After a failed connection the segment may serve elsewhere: ask the gateway where. */
    private void relocate() {
        try {
            if (gateway == null) {
                gateway = new StreamGateway(connectionConfig);
            }
            endpoint = gateway.endpoint(range.segmentId());
        } catch (UncheckedIOException | RayTopicsException e) {
            // The gateway may be down or the segment mid-restart: the old address is as good a
            // guess as any, and the retry window bounds how long we keep guessing.
            LOG.info("raytopics segment {}: endpoint lookup failed: {}", range.segmentId(), e.getMessage());
        }
    }

    private SegmentConnection connection() throws IOException {
        if (connection == null) {
            if (endpoint.tls() && tls == null) {
                tls = TlsContexts.trusting(connectionConfig.caFile());
            }
            connection = SegmentConnection.open(endpoint, connectionConfig.token(), tls);
        }
        return connection;
    }

    private void closeConnection() {
        if (connection != null) {
            try {
                connection.close();
            } catch (IOException e) {
                LOG.debug("raytopics: closing a failed connection", e);
            }
            connection = null;
        }
    }

    @Override
    public void close() {
        closeConnection();
        allocator.close();
    }
}
