package io.raytopics.spark;

import java.util.Arrays;
import java.util.Objects;

/** Assertions for the plain-main tests (no JUnit here); a failure ends the JVM non-zero. */
final class Check {
    private Check() {}

    static void equal(Object expected, Object actual, String what) {
        boolean same = expected instanceof byte[] e && actual instanceof byte[] a
                ? Arrays.equals(e, a)
                : Objects.equals(expected, actual);
        if (!same) {
            throw new AssertionError(what + ": expected " + show(expected) + ", got " + show(actual));
        }
    }

    static void isTrue(boolean condition, String what) {
        if (!condition) {
            throw new AssertionError(what);
        }
    }

    /** Runs {@code action}, which must throw {@code type} with a message containing every part. */
    static <T extends Throwable> T fails(Class<T> type, Action action, String... parts) {
        try {
            action.run();
        } catch (Throwable t) {
            if (!type.isInstance(t)) {
                throw new AssertionError("expected " + type.getSimpleName() + ", got " + t, t);
            }
            for (String part : parts) {
                if (t.getMessage() == null || !t.getMessage().contains(part)) {
                    throw new AssertionError("message lacks \"" + part + "\": " + t.getMessage(), t);
                }
            }
            return type.cast(t);
        }
        throw new AssertionError("expected " + type.getSimpleName() + ", nothing thrown");
    }

    interface Action {
        void run() throws Exception;
    }

    private static String show(Object o) {
        return o instanceof byte[] b ? Arrays.toString(b) : String.valueOf(o);
    }
}
