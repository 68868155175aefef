package io.raytopics.spark;

/** The routing hash against vectors computed with the reference mmh3 (as the Python side uses). */
public final class Murmur3Test {
    public static void main(String[] args) {
        Object[][] vectors = {
            {"", 0}, {"a", 27058}, {"ab", 55135}, {"abc", 37882}, {"abcd", 26474},
            {"abcde", 39670}, {"key-1", 5536}, {"héllo wörld", 62068}, {"k".repeat(37), 29551},
        };
        for (Object[] v : vectors) {
            Check.equal(v[1], Murmur3.keyHash((String) v[0]), "keyHash(\"" + v[0] + "\")");
        }
        // The full 32 bits too: the published value for "hello" (seed 0) is 0x248bfa47.
        Check.equal(0x248bfa47, Murmur3.hash32("hello".getBytes(java.nio.charset.StandardCharsets.UTF_8)), "hash32(hello)");
        System.out.println("Murmur3Test: " + vectors.length + " vectors ok");
    }
}
