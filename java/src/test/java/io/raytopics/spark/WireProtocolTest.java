package io.raytopics.spark;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;

/** The data plane's frames against bytes written out by hand from runtime/wire.py's layout. */
public final class WireProtocolTest {
    public static void main(String[] args) throws Exception {
        Check.equal(bytes(0, 0, 0, 6, 3, 1, 2, 't', 'o', 'k'), WireProtocol.hello("tok"), "HELLO with a token");
        Check.equal(bytes(0, 0, 0, 3, 3, 1, 2), WireProtocol.hello(null), "HELLO without a token");

        Check.equal(bytes(
                        0, 0, 0, 27, // length: 1 + 8 + 4 + 4 + 8 + 2
                        2, // op READ
                        0, 0, 0, 0, 0, 0, 0x01, 0x02, // offset 258
                        0, 0, 0x27, 0x10, // max records 10000
                        0, 0, 0, 0, // wait ms 0
                        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // ack -1: none
                        0, 0), // no subscription
                WireProtocol.read(258, 10_000, 0, -1, ""), "READ");
        Check.equal(bytes(0, 0, 0, 29, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 7,
                        0, 0, 0, 0, 0, 0, 0, 9, 0, 2, 's', 'b'),
                WireProtocol.read(1, 5, 7, 9, "sb"), "READ with ack and subscription");

        Check.equal(2, WireProtocol.welcome(bytes(0, 2)), "WELCOME grants consume");
        byte[] refusal = withStatus(1, "{\"error\": \"unauthenticated\", \"message\": \"bad token\"}");
        Check.fails(RayTopicsException.class, () -> WireProtocol.welcome(refusal), "unauthenticated", "bad token");

        byte[] arrow = {9, 8, 7};
        byte[] records = bytes(0, 0, 0, 0, 0, 0, 0, 0x30, 0x39, 1, 9, 8, 7); // end 12345, terminated
        WireProtocol.Records answer = WireProtocol.records(records);
        Check.equal(12_345L, answer.endOffset(), "RECORDS end offset");
        Check.isTrue(answer.terminated(), "RECORDS terminated");
        Check.equal(arrow, answer.arrow().readAllBytes(), "RECORDS Arrow bytes");
        Check.isTrue(!WireProtocol.records(bytes(0, 0, 0, 0, 0, 0, 0, 0, 5, 0)).hasArrow(), "no Arrow bytes");
        byte[] readError = withStatus(1, "{\"error\":\"segment_not_found\",\"message\":\"segment 4 is gone\"}");
        RayTopicsException e = Check.fails(RayTopicsException.class,
                () -> WireProtocol.records(readError), "segment_not_found", "segment 4 is gone");
        Check.equal("segment_not_found", e.code(), "error code");
        Check.fails(RayTopicsException.class, () -> WireProtocol.records(withStatus(1, "not json")),
                "segment_error", "not json");

        DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes(0, 0, 0, 2, 0, 2, 0, 0, 0, 1, 5)));
        Check.equal(bytes(0, 2), WireProtocol.readFrame(in), "first frame");
        Check.equal(bytes(5), WireProtocol.readFrame(in), "second frame");
        Check.fails(IOException.class, () -> WireProtocol.readFrame(new DataInputStream(
                new ByteArrayInputStream(bytes('H', 'T', 'T', 'P', '/', '1')))), "does not speak");
        System.out.println("WireProtocolTest: ok");
    }

    static byte[] bytes(int... values) {
        byte[] out = new byte[values.length];
        for (int i = 0; i < values.length; i++) {
            out[i] = (byte) values[i];
        }
        return out;
    }

    static byte[] withStatus(int status, String json) {
        byte[] text = json.getBytes(StandardCharsets.UTF_8);
        byte[] body = new byte[text.length + 1];
        body[0] = (byte) status;
        System.arraycopy(text, 0, body, 1, text.length);
        return body;
    }
}
