package io.raytopics.spark;

import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.ByteArrayInputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.MapVector;
import org.apache.arrow.vector.ipc.ArrowStreamReader;

/**
 * An in-process segment data plane taking appends as a segment does: a HELLO asking for
 * produce, then APPEND frames, each stored once per (producer id, sequence) and answered
 * with where it went; sealed, it refuses every append as {@code segment_terminated}.
 */
final class FakeAppendSegment implements AutoCloseable {
    /** One stored append: its producer, sequence, and its records' keys, values, properties. */
    record Stored(String producerId, long sequence, List<String> keys, List<String> values,
            List<Object> properties, boolean fullSchema) {}

    final List<Stored> stored = new ArrayList<>();
    final List<Byte> accessAsked = new ArrayList<>();
    volatile boolean sealed;
    /** Close the connection instead of answering this many appends (a restart). */
    volatile int dropNext;
    private final Map<String, long[]> placed = new HashMap<>();
    private long end;
    private final ServerSocket server;

    FakeAppendSegment() throws IOException {
        server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        Thread acceptor = new Thread(this::accept, "fake-append-segment");
        acceptor.setDaemon(true);
        acceptor.start();
    }

    Endpoint endpoint() {
        return new Endpoint("127.0.0.1", server.getLocalPort(), false);
    }

    String endpointJson() {
        return "{\"host\": \"127.0.0.1\", \"port\": " + server.getLocalPort() + ", \"tls\": false}";
    }

    synchronized int rows() {
        return stored.stream().mapToInt(s -> s.keys().size()).sum();
    }

    private void accept() {
        while (!server.isClosed()) {
            try (Socket socket = server.accept()) {
                serve(socket);
            } catch (IOException closed) {
                // the client went away, or the test is over
            }
        }
    }

    private void serve(Socket socket) throws IOException {
        DataInputStream in = new DataInputStream(new BufferedInputStream(socket.getInputStream()));
        DataOutputStream out = new DataOutputStream(socket.getOutputStream());
        byte[] hello = WireProtocol.readFrame(in);
        synchronized (this) {
            accessAsked.add(hello[2]);
        }
        FakeSegment.frame(out, new byte[] {0, hello[2]});
        while (true) {
            ByteBuffer append = ByteBuffer.wrap(WireProtocol.readFrame(in));
            if (dropNext > 0) {
                dropNext--;
                return;
            }
            Check.equal(WireProtocol.OP_APPEND, append.get(), "an append frame");
            byte[] pid = new byte[append.getShort()];
            append.get(pid);
            long sequence = append.getLong();
            byte[] payload = new byte[append.remaining()];
            append.get(payload);
            if (sealed) {
                FakeSegment.frame(out, WireProtocolTest.withStatus(1,
                        "{\"error\": \"segment_terminated\", \"message\": \"the segment is sealed\"}"));
                continue;
            }
            long[] at = store(new String(pid, StandardCharsets.UTF_8), sequence, payload);
            FakeSegment.frame(out, ByteBuffer.allocate(17).put((byte) 0).putLong(at[0]).putLong(at[1]).array());
        }
    }

    private synchronized long[] store(String producerId, long sequence, byte[] payload) throws IOException {
        long[] before = placed.get(producerId + "/" + sequence);
        if (before != null) {
            return before;
        }
        List<String> keys = new ArrayList<>();
        List<String> values = new ArrayList<>();
        List<Object> properties = new ArrayList<>();
        boolean full;
        try (RootAllocator allocator = new RootAllocator();
                ArrowStreamReader reader = new ArrowStreamReader(new ByteArrayInputStream(payload), allocator)) {
            VectorSchemaRoot root = reader.getVectorSchemaRoot();
            full = root.getSchema().equals(ArrowRecordEncoder.BATCH);
            while (reader.loadNextBatch()) {
                VarCharVector k = (VarCharVector) root.getVector("key");
                VarBinaryVector v = (VarBinaryVector) root.getVector("value");
                MapVector p = (MapVector) root.getVector("properties");
                for (int i = 0; i < root.getRowCount(); i++) {
                    keys.add(k.isNull(i) ? null : new String(k.get(i), StandardCharsets.UTF_8));
                    values.add(new String(v.get(i), StandardCharsets.UTF_8));
                    properties.add(p.getObject(i) == null ? null : p.getObject(i).toString());
                }
            }
        }
        stored.add(new Stored(producerId, sequence, keys, values, properties, full));
        long[] at = {end, keys.size()};
        end += keys.size();
        placed.put(producerId + "/" + sequence, at);
        return at;
    }

    @Override
    public void close() throws IOException {
        server.close();
    }
}
