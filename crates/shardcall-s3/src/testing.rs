//! A real S3-compatible server for tests and benchmarks: an `s3s-fs`
//! process serving a temporary folder on a free port, killed when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::S3Config;

/// Why a test server could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The `s3s-fs` binary is not installed.
    #[error(
        "the s3s-fs server is not installed (looked for $S3S_FS, `s3s-fs` on PATH and ~/.cargo/bin/s3s-fs); scripts/test.sh installs it"
    )]
    NotInstalled,
    /// Starting or reaching it failed.
    #[error("s3s-fs: {0}")]
    Start(String),
}

/// Where the s3s-fs binary is: `$S3S_FS`, then `PATH`, then `~/.cargo/bin`.
pub fn s3s_fs_binary() -> Option<PathBuf> {
    shardcall::installed::installed_binary("S3S_FS", "s3s-fs")
}

/// The bucket every test server has.
pub const BUCKET: &str = "backups";
const ACCESS_KEY: &str = "shardcall-test";
const SECRET_KEY: &str = "shardcall-test-secret";

/// An s3s-fs server on a free port.
#[derive(Debug)]
pub struct S3Server {
    port: u16,
    root: PathBuf,
    child: Option<Child>,
}

impl S3Server {
    /// Starts a server keeping its objects below `root` (created, with the
    /// bucket [`BUCKET`]); its output goes to `root/../s3s-fs-PORT.log`.
    pub fn start(root: impl Into<PathBuf>) -> Result<Self, ServerError> {
        let root = root.into();
        std::fs::create_dir_all(root.join(BUCKET))
            .map_err(|e| ServerError::Start(e.to_string()))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| ServerError::Start(e.to_string()))?;
        let mut server = Self {
            port,
            root,
            child: None,
        };
        server.restart()?;
        Ok(server)
    }

    /// Starts the process again on the same port and folder (after
    /// [`Self::stop`]): what was stored is still there.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.stop();
        let bin = s3s_fs_binary().ok_or(ServerError::NotInstalled)?;
        let log = self
            .root
            .with_file_name(format!("s3s-fs-{}.log", self.port));
        let out = std::fs::File::create(&log).map_err(|e| ServerError::Start(e.to_string()))?;
        let err = out
            .try_clone()
            .map_err(|e| ServerError::Start(e.to_string()))?;
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| ServerError::Start(format!("{}: {e}", bin.display())))?;
        self.child = Some(child);
        self.wait_ready(&log)
    }

    /// Freezes the process (SIGSTOP): the kernel still accepts connections
    /// on its port, and nothing answers them — a hung server.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status();
        }
    }

    /// Kills the process (the folder stays).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn wait_ready(&mut self, log: &Path) -> Result<(), ServerError> {
        let deadline = shardcall::clock::now() + Duration::from_secs(30);
        while shardcall::clock::now() < deadline {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(ServerError::Start(format!(
                    "exited with {status}; see {}",
                    log.display()
                )));
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(ServerError::Start(format!(
            "not answering on port {} after 30 s; see {}",
            self.port,
            log.display()
        )))
    }

    /// A configuration for this server's bucket, its keys below `prefix`.
    pub fn config(&self, prefix: &str) -> S3Config {
        S3Config {
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            region: "us-east-1".into(),
            bucket: BUCKET.into(),
            prefix: prefix.into(),
            access_key_id: ACCESS_KEY.into(),
            secret_access_key: SECRET_KEY.into(),
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
