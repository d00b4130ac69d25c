//! A private `redis-server` child process on a free port, never the
//! machine's own server: `shardcall bench` starts one to measure against,
//! and tests start, kill and restart them.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `redis-server` child process; killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    args: Vec<String>,
}

/// A free TCP port on 127.0.0.1 (closed again before returning).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl RedisServer {
    /// Starts a server with persistence off (`extra` adds arguments, such
    /// as `--appendonly yes`) whose files live in `dir`.
    pub fn start(dir: impl Into<PathBuf>, extra: &[&str]) -> std::io::Result<Self> {
        let mut s = Self {
            port: free_port(),
            child: None,
            dir: dir.into(),
            args: extra.iter().map(|a| (*a).to_owned()).collect(),
        };
        s.spawn()?;
        Ok(s)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let child = Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&self) -> std::io::Result<()> {
        let deadline = shardcall::clock::now() + Duration::from_secs(10);
        while shardcall::clock::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(std::io::Error::other(format!(
            "redis-server on {} did not start",
            self.port
        )))
    }

    /// Starts a server that speaks only TLS on its port, with the given
    /// certificate and key (clients are not asked for certificates).
    pub fn start_tls(
        dir: impl Into<PathBuf>,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> std::io::Result<Self> {
        let port = free_port();
        let args = [
            "--port".to_owned(),
            "0".to_owned(),
            "--tls-port".to_owned(),
            port.to_string(),
            "--tls-cert-file".to_owned(),
            cert.display().to_string(),
            "--tls-key-file".to_owned(),
            key.display().to_string(),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        let mut s = Self {
            port,
            child: None,
            dir: dir.into(),
            args: args.to_vec(),
        };
        s.spawn()?;
        Ok(s)
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills and starts it again on the same port with the same files.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
