package io.raytopics.spark;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/** TLS trust for the gateway and the segments: a cluster CA file, or the JVM's default. */
final class TlsContexts {
    private TlsContexts() {}

    /** An SSLContext trusting exactly the certificates in {@code caFile} (PEM), or the default. */
    static SSLContext trusting(String caFile) {
        try {
            if (caFile == null) {
                return SSLContext.getDefault();
            }
            KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
            store.load(null, null);
            try (InputStream in = Files.newInputStream(Path.of(caFile))) {
                int n = 0;
                for (Certificate cert : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                    store.setCertificateEntry("ca-" + n++, cert);
                }
                if (n == 0) {
                    throw new IllegalArgumentException("no certificate in CA file " + caFile);
                }
            }
            TrustManagerFactory trust =
                    TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            trust.init(store);
            SSLContext context = SSLContext.getInstance("TLS");
            context.init(null, trust.getTrustManagers(), null);
            return context;
        } catch (IOException | GeneralSecurityException e) {
            throw new IllegalArgumentException("cannot use CA file " + caFile + ": " + e, e);
        }
    }
}
