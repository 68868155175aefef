package io.raytopics.spark;

import java.nio.charset.StandardCharsets;

/**
 * MurmurHash3 x86 32-bit, seed 0: the routing hash every Ray Topics client computes.
 *
 * <p>Not Spark's {@code Murmur3_x86_32.hashUnsafeBytes}: that mixes each trailing byte
 * as a whole block, so it disagrees with the reference algorithm (and with the Python
 * side's {@code mmh3}) for every length that is not a multiple of four.
 */
public final class Murmur3 {
    /** The routing hash keeps the low 16 bits. */
    public static final int KEY_HASH_MASK = 0xFFFF;

    private static final int C1 = 0xcc9e2d51;
    private static final int C2 = 0x1b873593;

    private Murmur3() {}

    /** The 16-bit routing hash of a key, over its UTF-8 bytes. */
    public static int keyHash(String key) {
        return hash32(key.getBytes(StandardCharsets.UTF_8)) & KEY_HASH_MASK;
    }

    /** The 16-bit routing hash of a key already encoded as UTF-8. */
    public static int keyHash(byte[] utf8) {
        return hash32(utf8) & KEY_HASH_MASK;
    }

    public static int hash32(byte[] data) {
        int h = 0;
        int blocks = data.length / 4;
        for (int i = 0; i < blocks; i++) {
            int at = i * 4;
            int k = (data[at] & 0xff)
                    | (data[at + 1] & 0xff) << 8
                    | (data[at + 2] & 0xff) << 16
                    | (data[at + 3] & 0xff) << 24;
            h ^= mixK(k);
            h = Integer.rotateLeft(h, 13) * 5 + 0xe6546b64;
        }
        int tail = blocks * 4;
        int rest = data.length - tail;
        if (rest > 0) {
            int k = 0;
            for (int i = rest - 1; i >= 0; i--) {
                k = k << 8 | (data[tail + i] & 0xff);
            }
            h ^= mixK(k);
        }
        h ^= data.length;
        h ^= h >>> 16;
        h *= 0x85ebca6b;
        h ^= h >>> 13;
        h *= 0xc2b2ae35;
        h ^= h >>> 16;
        return h;
    }

    private static int mixK(int k) {
        k *= C1;
        k = Integer.rotateLeft(k, 15);
        return k * C2;
    }
}
