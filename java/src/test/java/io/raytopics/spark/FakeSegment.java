package io.raytopics.spark;

import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * An in-process segment data plane holding offsets {@code [first, end)} of
 * {@link ArrowFixtures#numbered} messages, answering at most {@code perAnswer} records per
 * READ whatever the request's maximum (so the reader must stop at {@code to} itself).
 */
final class FakeSegment implements AutoCloseable {
    volatile long first;
    volatile long end;
    volatile boolean terminated;
    volatile int perAnswer = 7;
    /** Close every connection after this many answers (0: never). */
    volatile int dropAfter;
    /** Answer the HELLO with this error document instead of a WELCOME. */
    volatile String refusal;
    final List<String> credentials = new ArrayList<>();
    final AtomicInteger connections = new AtomicInteger();
    volatile boolean helloPipelined;
    /** Offsets no reader gets (a transaction's markers, aborted records): stepped over. */
    volatile Set<Long> hidden = Set.of();

    private final ServerSocket server;

    FakeSegment(long first, long end) throws IOException {
        this.first = first;
        this.end = end;
        server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        Thread acceptor = new Thread(this::accept, "fake-segment");
        acceptor.setDaemon(true);
        acceptor.start();
    }

    Endpoint endpoint() {
        return new Endpoint("127.0.0.1", server.getLocalPort(), false);
    }

    private void accept() {
        while (!server.isClosed()) {
            try (Socket socket = server.accept()) {
                connections.incrementAndGet();
                serve(socket);
            } catch (IOException closed) {
                // the test is over, or the client went away: take the next connection
            }
        }
    }

    private void serve(Socket socket) throws IOException {
        InputStream raw = new BufferedInputStream(socket.getInputStream());
        DataInputStream in = new DataInputStream(raw);
        DataOutputStream out = new DataOutputStream(socket.getOutputStream());
        byte[] hello = WireProtocol.readFrame(in);
        Thread.yield();
        helloPipelined = raw.available() > 0;
        synchronized (credentials) {
            credentials.add(new String(hello, 3, hello.length - 3, StandardCharsets.UTF_8));
        }
        if (refusal != null) {
            frame(out, WireProtocolTest.withStatus(1, refusal));
            return;
        }
        frame(out, new byte[] {0, 2});
        for (int answers = 0; dropAfter == 0 || answers < dropAfter; answers++) {
            ByteBuffer read = ByteBuffer.wrap(WireProtocol.readFrame(in));
            read.get();
            long offset = read.getLong();
            byte[] ipc = answer(offset);
            frame(out, ByteBuffer.allocate(WireProtocol.RECORDS_HEADER + ipc.length)
                    .put((byte) 0).putLong(end).put((byte) (terminated ? 1 : 0)).put(ipc).array());
        }
    }

    /** A read from {@code offset}, stating what the real segment states (runtime.batch). */
    private byte[] answer(long offset) throws IOException {
        long start = Math.max(offset, first);
        Map<String, String> stated = new HashMap<>();
        if (start > offset) {
            stated.put(ArrowRecordDecoder.STARTED_KEY, Long.toString(start));
        }
        List<ArrowFixtures.Message> messages = new ArrayList<>();
        long o = start;
        for (; o < end && messages.size() < perAnswer; o++) {
            if (!hidden.contains(o)) {
                messages.add(ArrowFixtures.numbered(o));
            }
        }
        while (o < end && hidden.contains(o)) {
            o++;
        }
        long after = messages.isEmpty() ? start : messages.get(messages.size() - 1).offset() + 1;
        if (o > after) {
            stated.put(ArrowRecordDecoder.FOLLOWING_KEY, after + " " + o);
        }
        return ArrowFixtures.ipc(messages, stated);
    }

    static void frame(DataOutputStream out, byte[] body) throws IOException {
        out.writeInt(body.length);
        out.write(body);
        out.flush();
    }

    @Override
    public void close() throws IOException {
        server.close();
    }
}
