//! `rediss://`: the store over TLS to a redis-server with a certificate from
//! a private CA (made here with openssl), and a clear error when the
//! certificate is not trusted.

use std::process::Command;

use shardcall::conformance;
use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisServer;

/// A private CA, and a server certificate for 127.0.0.1 signed by it:
/// (CA certificate, server certificate, server key).
fn make_certs(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let p = |n: &str| dir.join(n);
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(p("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
    (p("ca.pem"), p("server.pem"), p("server.key"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_works_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = make_certs(dir.path());
    let server = RedisServer::start_tls(dir.path().join("redis"), &cert, &key).unwrap();
    let url = format!("rediss://127.0.0.1:{}/", server.port);
    let ca = std::fs::read(&ca).unwrap();
    let store = RedisStore::connect_tls(&url, &ca).await.unwrap();
    conformance::run_all(&store, "tls").await;
    shardcall::conformance_tickets::run_all(&store, "tls").await;
    // Without the private CA the certificate is refused, clearly.
    let err = RedisStore::connect(&url).await.unwrap_err();
    assert!(!err.is_fenced());
    assert!(
        err.to_string().to_lowercase().contains("cert") || err.to_string().contains("Redis"),
        "{err}"
    );
}
