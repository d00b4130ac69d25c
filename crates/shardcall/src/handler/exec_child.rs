//! One `--exec` child process: started in a process group of its own,
//! guarded so it never outlives the worker, its stderr echoed and its last
//! lines kept to say why it ended, and one JSON object a line each way.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use shardcall_core::PartitionId;

/// A running child with its pipes.
pub(crate) struct Running {
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: BufReader<ChildStdout>,
    pub(crate) life: ChildLife,
}

/// A running child, apart from its pipes: enough to kill it and to say
/// why it ended.
pub(crate) struct ChildLife {
    /// Shared with the handler's [`Interrupt`], which kills it from another
    /// thread when a call outlives its deadline.
    pub(crate) child: Arc<Mutex<Child>>,
    /// The last lines the child wrote to stderr (each also goes to the
    /// worker's own stderr, named after the partition).
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_reader: std::thread::JoinHandle<()>,
}

impl ChildLife {
    /// Why the child's output ended: its exit status and its last words,
    /// once its stderr is drained (a grandchild holding the pipe open gets
    /// a moment, not a wait).
    pub(crate) fn ended(&self) -> String {
        // Polled, not waited for with the lock held: a child that closed its
        // output may still run, and the lock is what kills it.
        let waited = crate::clock::now();
        let status = loop {
            match self.child.lock().expect("child lock").try_wait() {
                Ok(Some(status)) => break status.to_string(),
                Ok(None) if waited.elapsed() < Duration::from_millis(200) => {}
                Ok(None) => break "its output closed, still running".to_owned(),
                Err(e) => break e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let waited = crate::clock::now();
        while !self.stderr_reader.is_finished() && waited.elapsed() < Duration::from_millis(200) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let tail: Vec<String> = self
            .stderr_tail
            .lock()
            .expect("stderr lock")
            .iter()
            .cloned()
            .collect();
        if tail.is_empty() {
            format!("the handler exited ({status}) without a word on stderr")
        } else {
            format!(
                "the handler exited ({status}); its last stderr lines: {}",
                tail.join(" | ")
            )
        }
    }
}

impl Running {
    /// Starts `command` with `sh -c` in a process group of its own (so
    /// killing it kills what it started), guarded so it never outlives the
    /// worker, its stderr echoed under the partition's name.
    pub(crate) fn start(command: &str, partition: &PartitionId) -> Result<Self, String> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {command:?}: {e}"))?;
        crate::handler::child_guard::guard(&child);
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let stderr = BufReader::new(child.stderr.take().expect("piped"));
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let (tail, partition) = (stderr_tail.clone(), partition.clone());
        let stderr_reader = std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("handler {partition}: {line}");
                let mut tail = tail.lock().expect("stderr lock");
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        Ok(Self {
            stdin,
            stdout,
            life: ChildLife {
                child: Arc::new(Mutex::new(child)),
                stderr_tail,
                stderr_reader,
            },
        })
    }

    /// Starts `command` for the partition of `ctx` and initializes it with
    /// `state`: running, listed in `children` (so the interrupter can kill
    /// a child that hangs before it answers), and past its `ok`. A child
    /// that fails to answer `ok` is stopped.
    pub(crate) fn start_initialized(
        command: &str,
        ctx: &crate::handler::PartitionContext,
        state: Option<&[u8]>,
        children: &Children,
    ) -> Result<Self, String> {
        let mut running = Self::start(command, &ctx.partition)?;
        children
            .lock()
            .expect("children lock")
            .push(running.life.child.clone());
        let answered = running
            .send(&crate::handler::exec::initialize_request(ctx, state))
            .and_then(|()| running.receive())
            .and_then(|v| match v["action"].as_str() {
                Some("ok") => Ok(()),
                _ => Err(crate::handler::exec::unexpected(&v, "ok")),
            });
        match answered {
            Ok(()) => Ok(running),
            Err(why) => {
                stop_child(children, &running.life.child);
                Err(why)
            }
        }
    }

    /// Writes one line to the child.
    pub(crate) fn send(&mut self, request: &Value) -> Result<(), String> {
        write_line(&mut self.stdin, request)
    }

    /// Reads one line from the child: a JSON object (an `error` from the
    /// child is an error here, with its message).
    pub(crate) fn receive(&mut self) -> Result<Value, String> {
        let v = read_line(&mut self.stdout, || self.life.ended())?;
        if v["action"].as_str() == Some("error") {
            return Err(child_error(&v));
        }
        Ok(v)
    }
}

/// Writes `request` as one line.
pub(crate) fn write_line(stdin: &mut ChildStdin, request: &Value) -> Result<(), String> {
    let mut line = serde_json::to_string(request).map_err(|e| e.to_string())?;
    line.push('\n');
    stdin
        .write_all(line.as_bytes())
        .and_then(|()| stdin.flush())
        .map_err(|e| format!("writing to the handler: {e}"))
}

/// Reads one line as a JSON value; at the end of the output, `ended` says
/// why.
pub(crate) fn read_line(
    stdout: &mut BufReader<ChildStdout>,
    ended: impl FnOnce() -> String,
) -> Result<Value, String> {
    let mut answer = String::new();
    let n = stdout
        .read_line(&mut answer)
        .map_err(|e| format!("reading from the handler: {e}"))?;
    if n == 0 {
        return Err(ended());
    }
    serde_json::from_str(answer.trim()).map_err(|e| {
        format!(
            "the handler answered something that is not JSON ({e}): {:?}",
            answer.trim()
        )
    })
}

/// The message of a child's `error` answer.
pub(crate) fn child_error(v: &Value) -> String {
    format!(
        "the handler reported an error: {}",
        v["message"].as_str().unwrap_or("(no message)")
    )
}

/// The children a partition's handler has running, shared with its
/// interrupter (which kills them all when a call outlives its deadline).
pub(crate) type Children = Arc<Mutex<Vec<Arc<Mutex<Child>>>>>;

/// Stops `child`: it leaves `children`, is killed and waited for, and its
/// guardian forgets it.
pub(crate) fn stop_child(children: &Children, child: &Arc<Mutex<Child>>) {
    children
        .lock()
        .expect("children lock")
        .retain(|c| !Arc::ptr_eq(c, child));
    let mut child = child.lock().expect("child lock");
    kill(&mut child);
    let _ = child.wait();
    crate::handler::child_guard::release(&child);
}

/// How many of a child's last stderr lines a failure message quotes.
const STDERR_TAIL: usize = 5;

/// Kills the child and everything it started: it runs in a process group
/// of its own, and a shell's own child (`sh -c "a; b"`) would otherwise
/// keep the pipes open after the shell is gone. (std has no killpg; the
/// `kill` command does it without unsafe code.)
pub(crate) fn kill(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-s", "KILL", "--"])
        .arg(format!("-{}", child.id()))
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
}
