package io.raytopics.spark;

import java.io.Serializable;
import java.util.Map;
import org.apache.spark.sql.SparkSession;

/**
 * Where the cluster is and who we are: resolved once on the driver, then shipped to
 * executors inside partitions and writer factories, so they never read driver-only
 * state (Spark conf, the driver's environment).
 *
 * @param url the REST gateway's base URL, without a trailing slash
 * @param topicPath the topic's REST path, {@code /admin/v2/scalable/{tenant}/{ns}/{name}}
 * @param token the bearer token / data plane credential, or null
 * @param caFile a CA PEM file to trust for TLS (gateway and segments), or null for the JVM's
 */
public record ConnectionConfig(String url, String topicPath, String token, String caFile)
        implements Serializable {
    static final String URL_CONF = "spark.raytopics.url";
    static final String TOKEN_CONF = "spark.raytopics.token";
    static final String TOKEN_ENV = "RAYTOPICS_TOKEN";
    static final String CA_ENV = "RAYTOPICS_TLS_CA";
    private static final String TOPIC_SCHEME = "topic://";

    /** From the source's / sink's options (case-insensitive keys), Spark conf and env. */
    static ConnectionConfig resolve(Map<String, String> options) {
        String url = firstNonEmpty(options.get("url"), sparkConf(URL_CONF));
        if (url == null) {
            throw new IllegalArgumentException(
                    "raytopics needs the gateway URL: option \"url\" or Spark conf " + URL_CONF);
        }
        String topic = options.get("topic");
        if (topic == null || topic.isEmpty()) {
            throw new IllegalArgumentException(
                    "raytopics needs option \"topic\" (topic://tenant/namespace/topic)");
        }
        String token = firstNonEmpty(
                options.get("token"), sparkConf(TOKEN_CONF), System.getenv(TOKEN_ENV));
        String caFile = firstNonEmpty(options.get("caFile"), System.getenv(CA_ENV));
        return new ConnectionConfig(stripSlash(url), restPath(topic), token, caFile);
    }

    /** {@code topic://tenant/ns/name} as the gateway's path for that topic. */
    static String restPath(String topic) {
        String[] parts = topic.startsWith(TOPIC_SCHEME)
                ? topic.substring(TOPIC_SCHEME.length()).split("/", -1)
                : new String[0];
        if (parts.length != 3 || parts[0].isEmpty() || parts[1].isEmpty() || parts[2].isEmpty()) {
            throw new IllegalArgumentException(
                    "invalid topic " + topic + ": expected topic://tenant/namespace/topic");
        }
        return "/admin/v2/scalable/" + parts[0] + "/" + parts[1] + "/" + parts[2];
    }

    /** The topic's name ({@code topic://...}) for messages and Spark's UI. */
    String topicName() {
        return "topic://" + topicPath.substring("/admin/v2/scalable/".length());
    }

    /** Without the token: partitions and configs end up in logs and Spark's UI. */
    @Override
    public String toString() {
        return "ConnectionConfig[url=" + url + ", topic=" + topicName()
                + ", token=" + (token == null ? "none" : "***") + ", caFile=" + caFile + "]";
    }

    private static String sparkConf(String key) {
        try {
            return SparkSession.active().conf().get(key, null);
        } catch (IllegalStateException noSession) {
            return null; // outside a Spark application (unit tests): options and env only
        }
    }

    private static String firstNonEmpty(String... candidates) {
        for (String c : candidates) {
            if (c != null && !c.isEmpty()) {
                return c;
            }
        }
        return null;
    }

    private static String stripSlash(String url) {
        return url.endsWith("/") ? url.substring(0, url.length() - 1) : url;
    }
}
