package io.raytopics.spark;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.Closeable;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLHandshakeException;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

/**
 * One connection to a segment's data plane, for reads (consume) or appends (produce). The
 * HELLO goes out with the first request (the segment answers in request order), so the
 * handshake costs no round trip.
 */
final class SegmentConnection implements Closeable {
    private static final int CONNECT_TIMEOUT_MS = 10_000;
    // A read uses wait 0, so a silent segment for this long is a dead connection.
    private static final int READ_TIMEOUT_MS = 60_000;
    private static final int NO_ACK = -1;
    // A stream read keeps its own position (in the checkpoint), not a subscription cursor.
    private static final String NO_SUBSCRIPTION = "";

    private final Socket socket;
    private final DataInputStream in;
    private final OutputStream out;
    private final byte access;
    private byte[] pendingHello;

    private SegmentConnection(Socket socket, String credential, byte access) throws IOException {
        this.socket = socket;
        this.in = new DataInputStream(new BufferedInputStream(socket.getInputStream(), 1 << 16));
        this.out = new BufferedOutputStream(socket.getOutputStream());
        this.access = access;
        this.pendingHello = WireProtocol.hello(credential, access);
    }

    /** A consume connection (and for a TLS endpoint, handshaken, checking the host name). */
    static SegmentConnection open(Endpoint endpoint, String credential, SSLContext tls) throws IOException {
        return open(endpoint, credential, tls, WireProtocol.ACCESS_CONSUME);
    }

    /** A connection asking for {@code access} (consume or produce). */
    static SegmentConnection open(Endpoint endpoint, String credential, SSLContext tls, byte access)
            throws IOException {
        Socket plain = new Socket();
        try {
            plain.connect(new InetSocketAddress(endpoint.host(), endpoint.port()), CONNECT_TIMEOUT_MS);
            plain.setSoTimeout(READ_TIMEOUT_MS);
            plain.setTcpNoDelay(true);
            if (!endpoint.tls()) {
                return new SegmentConnection(plain, credential, access);
            }
            SSLSocket ssl = (SSLSocket) tls.getSocketFactory()
                    .createSocket(plain, endpoint.host(), endpoint.port(), true);
            SSLParameters parameters = ssl.getSSLParameters();
            parameters.setEndpointIdentificationAlgorithm("HTTPS");
            ssl.setSSLParameters(parameters);
            ssl.startHandshake();
            return new SegmentConnection(ssl, credential, access);
        } catch (SSLHandshakeException e) {
            // an untrusted certificate, or one for another address: no retry can fix it
            plain.close();
            throw new RayTopicsException(RayTopicsException.TLS_ERROR, "the segment at " + endpoint.host()
                    + ":" + endpoint.port() + " presented a certificate that is not trusted here"
                    + " (option caFile or " + ConnectionConfig.CA_ENV + " names the CA to trust): "
                    + e.getMessage());
        } catch (IOException | RuntimeException e) {
            plain.close();
            throw e;
        }
    }

    /** Up to {@code maxRecords} records from {@code offset}, without waiting for new ones. */
    WireProtocol.Records read(long offset, int maxRecords) throws IOException {
        send(WireProtocol.read(offset, maxRecords, 0, NO_ACK, NO_SUBSCRIPTION));
        return WireProtocol.records(WireProtocol.readFrame(in));
    }

    /** Appends an Arrow IPC stream under a producer id and sequence; the records it stored. */
    long append(String producerId, long sequence, byte[] payload) throws IOException {
        sendAppend(producerId, sequence, payload);
        return appended();
    }

    /**
     * Sends an append without waiting for its answer ({@link #appended}), so that appends
     * to several segments are under way at once.
     */
    void sendAppend(String producerId, long sequence, byte[] payload) throws IOException {
        send(WireProtocol.append(producerId, sequence, payload));
    }

    /** The answer to the append sent last: the records it stored, or the segment's error. */
    long appended() throws IOException {
        return WireProtocol.appended(WireProtocol.readFrame(in));
    }

    /** Sends {@code request}, after the HELLO on a new connection, whose WELCOME it reads. */
    private void send(byte[] request) throws IOException {
        boolean first = pendingHello != null;
        if (first) {
            out.write(pendingHello);
            pendingHello = null;
        }
        out.write(request);
        out.flush();
        if (first) {
            int granted = WireProtocol.welcome(WireProtocol.readFrame(in));
            if ((granted & access) == 0) {
                String what = access == WireProtocol.ACCESS_PRODUCE ? "produce" : "consume";
                throw new RayTopicsException("unauthorized", "the segment did not grant " + what + " access");
            }
        }
    }

    @Override
    public void close() throws IOException {
        socket.close();
    }
}
