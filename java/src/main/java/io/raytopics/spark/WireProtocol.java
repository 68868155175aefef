package io.raytopics.spark;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;

/**
 * The segment data plane's frames (the Python side's {@code runtime/wire.py}): each is a
 * big-endian {@code u32} length and that many bytes of body. Pure encoding and decoding,
 * so it can be checked against hand-built bytes without a socket.
 */
final class WireProtocol {
    static final byte OP_APPEND = 1;
    static final byte OP_READ = 2;
    static final byte OP_HELLO = 3;
    static final byte WIRE_VERSION = 1;
    static final byte ACCESS_PRODUCE = 1;
    static final byte ACCESS_CONSUME = 2;
    static final byte STATUS_OK = 0;
    static final byte STATUS_ERROR = 1;
    /** The segment refuses larger frames; a larger length means the stream is not ours. */
    static final int MAX_FRAME = 256 << 20;
    /** status, end offset, terminated: what precedes a RECORDS answer's Arrow stream. */
    static final int RECORDS_HEADER = 1 + 8 + 1;

    private WireProtocol() {}

    /** A connection's first frame: asks for consume access with {@code credential}. */
    static byte[] hello(String credential) {
        return hello(credential, ACCESS_CONSUME);
    }

    /** A connection's first frame: asks for {@code access} with {@code credential}. */
    static byte[] hello(String credential, byte access) {
        byte[] token = credential == null ? new byte[0] : credential.getBytes(StandardCharsets.UTF_8);
        return ByteBuffer.allocate(4 + 3 + token.length)
                .putInt(3 + token.length)
                .put(OP_HELLO)
                .put(WIRE_VERSION)
                .put(access)
                .put(token)
                .array();
    }

    /** A read of up to {@code maxRecords} from {@code offset}; ack -1 means none. */
    static byte[] read(long offset, int maxRecords, int waitMs, long ack, String subscription) {
        byte[] sub = subscription.getBytes(StandardCharsets.UTF_8);
        int body = 1 + 8 + 4 + 4 + 8 + 2 + sub.length;
        return ByteBuffer.allocate(4 + body)
                .putInt(body)
                .put(OP_READ)
                .putLong(offset)
                .putInt(maxRecords)
                .putInt(waitMs)
                .putLong(ack)
                .putShort((short) sub.length)
                .put(sub)
                .array();
    }

    /**
     * An append of the Arrow IPC stream {@code payload} under {@code producerId} and
     * {@code sequence}: the segment stores a sequence once, and answers a resent one with
     * where it went the first time.
     */
    static byte[] append(String producerId, long sequence, byte[] payload) {
        byte[] pid = producerId.getBytes(StandardCharsets.UTF_8);
        int body = 1 + 2 + pid.length + 8 + payload.length;
        return ByteBuffer.allocate(4 + body)
                .putInt(body)
                .put(OP_APPEND)
                .putShort((short) pid.length)
                .put(pid)
                .putLong(sequence)
                .put(payload)
                .array();
    }

    /** How many records an APPENDED answer stored; an ERROR is thrown as the segment's error. */
    static long appended(byte[] body) {
        requireOk(body);
        if (body.length != 1 + 8 + 8) {
            throw new RayTopicsException("invalid_response", "the segment did not answer the append");
        }
        return ByteBuffer.wrap(body, 1 + 8, 8).getLong();
    }

    /** The body of the next frame on {@code in}. */
    static byte[] readFrame(DataInputStream in) throws IOException {
        int length = in.readInt();
        if (length < 1 || length > MAX_FRAME) {
            throw new IOException("data plane frame of " + Integer.toUnsignedString(length)
                    + " bytes: the peer does not speak the segment wire protocol");
        }
        byte[] body = new byte[length];
        in.readFully(body);
        return body;
    }

    /** The access a WELCOME granted; a refusal (ERROR) is thrown as the segment's error. */
    static int welcome(byte[] body) {
        requireOk(body);
        if (body.length != 2) {
            throw new RayTopicsException("invalid_response", "the segment did not answer the HELLO");
        }
        return body[1] & 0xff;
    }

    /** A RECORDS answer; an ERROR is thrown as the segment's error. */
    static Records records(byte[] body) {
        requireOk(body);
        if (body.length < RECORDS_HEADER) {
            throw new RayTopicsException("invalid_response", "short RECORDS frame");
        }
        ByteBuffer head = ByteBuffer.wrap(body);
        head.get();
        return new Records(head.getLong(), head.get() != 0, body);
    }

    private static void requireOk(byte[] body) {
        if (body[0] == STATUS_ERROR) {
            throw RayTopicsException.fromErrorJson(body, 1, "segment_error");
        }
        if (body[0] != STATUS_OK) {
            throw new RayTopicsException("invalid_response", "data plane status " + body[0]);
        }
    }

    /**
     * A RECORDS answer.
     *
     * @param endOffset the segment's end offset when it answered
     * @param terminated whether the segment is sealed: nothing past {@code endOffset} will come
     * @param body the whole frame body; the Arrow IPC stream follows the header
     */
    record Records(long endOffset, boolean terminated, byte[] body) {
        boolean hasArrow() {
            return body.length > RECORDS_HEADER;
        }

        InputStream arrow() {
            return new ByteArrayInputStream(body, RECORDS_HEADER, body.length - RECORDS_HEADER);
        }
    }
}
