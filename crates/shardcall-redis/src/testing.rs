//! Redis set-ups only tests need: clusters on free ports and a TCP proxy
//! that can cut or delay the link (feature `testkit`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

pub use crate::server::{RedisServer, free_port};

/// A TCP proxy in front of a server, whose connections a test can cut (and
/// refuse) to simulate a network partition between one client and Redis, or
/// whose answers it can hold back while requests still go through (a client
/// that cannot tell whether its write landed).
#[derive(Debug)]
pub struct TcpProxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
    state: std::sync::Arc<ProxyState>,
}

#[derive(Debug, Default)]
struct ProxyState {
    cut: std::sync::atomic::AtomicBool,
    hold_answers: std::sync::atomic::AtomicBool,
    stopped: std::sync::atomic::AtomicBool,
    live: std::sync::Mutex<Vec<std::net::TcpStream>>,
}

impl TcpProxy {
    /// Starts forwarding 127.0.0.1:`port` to 127.0.0.1:`upstream`.
    pub fn start(upstream: u16) -> std::io::Result<Self> {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let state = std::sync::Arc::new(ProxyState::default());
        let s = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.stopped.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                if s.cut.load(Ordering::Acquire) {
                    continue; // dropped: the connection is refused at once
                }
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let pipe = |mut from: std::net::TcpStream,
                            mut to: std::net::TcpStream,
                            held: Option<std::sync::Arc<ProxyState>>| {
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut buf = vec![0u8; 64 << 10];
                        while let Ok(n @ 1..) = from.read(&mut buf) {
                            while held
                                .as_ref()
                                .is_some_and(|h| h.hold_answers.load(Ordering::Acquire))
                            {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
                    let mut live = s.live.lock().expect("proxy lock");
                    live.push(c2.try_clone().expect("clone"));
                    live.push(s2.try_clone().expect("clone"));
                    pipe(client, s2, None);
                    pipe(server, c2, Some(s.clone()));
                }
            }
        });
        Ok(Self { port, state })
    }

    /// `redis://127.0.0.1:PORT/` through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Cuts every connection and refuses new ones until [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.state
            .cut
            .store(true, std::sync::atomic::Ordering::Release);
        for s in self.state.live.lock().expect("proxy lock").drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.state
            .cut
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Holds the server's answers back (requests still reach the server)
    /// while `hold` is true; held answers then arrive late, in order.
    pub fn hold_answers(&self, hold: bool) {
        self.state
            .hold_answers
            .store(hold, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.state
            .stopped
            .store(true, std::sync::atomic::Ordering::Release);
        self.cut();
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A local Redis Cluster of `masters` servers without replicas.
#[derive(Debug)]
pub struct RedisCluster {
    /// The servers.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the servers in folders under `dir` and joins them with
    /// `redis-cli --cluster create`, waiting until the cluster is ok.
    pub fn start(dir: impl Into<PathBuf>, masters: usize) -> std::io::Result<Self> {
        let dir = dir.into();
        let mut nodes = Vec::new();
        for i in 0..masters {
            nodes.push(RedisServer::start(
                dir.join(format!("node{i}")),
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ],
            )?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "redis-cli --cluster create: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        let deadline = shardcall::clock::now() + Duration::from_secs(20);
        loop {
            let ok = nodes.iter().all(|n| {
                Command::new("redis-cli")
                    .args(["-p", &n.port.to_string(), "cluster", "info"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
                    .unwrap_or(false)
            });
            if ok {
                return Ok(Self { nodes });
            }
            if shardcall::clock::now() > deadline {
                return Err(std::io::Error::other("the cluster did not become ok"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
