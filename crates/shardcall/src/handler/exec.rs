//! Handlers in any language: a child process per partition speaking
//! line-delimited JSON on stdin/stdout, in the manner of the Kinesis Client
//! Library's MultiLangDaemon.
//!
//! Every request is one JSON object on a line; the child answers each with
//! one line. Bytes (keys, values, state) travel base64-encoded; `value` also
//! carries the text when the bytes are UTF-8.
//!
//! ```text
//! -> {"action":"initialize","partition":"t/3","epoch":7,"member":"w1-…","state":"<b64>"|null,"state_dir":null}
//! <- {"action":"ok"}
//! -> {"action":"process","records":[{"offset":0,"timestamp_ms":0,"key":"<b64>"|null,
//!                                     "value_b64":"<b64>","value":"text"|null}, …]}
//!    (from Kinesis, each record also has "sequence_number":"…" and
//!     "sub_sequence_number":0, as the KCL names them)
//! <- {"action":"processed","state":"<b64>"}
//! -> {"action":"revoked"}            (the partition was released; back up now)
//! <- {"action":"ok"}
//! -> {"action":"shard_ended"}        (instead of "revoked": the partition is closed and
//! <- {"action":"ok"}                  processed to its end, as the KCL's shardEnded)
//! <- {"action":"error","message":"…"}   (instead of any answer: the batch is retried)
//! ```
//!
//! With a local state store (the worker's `[state]`), the child keeps its
//! state there instead of returning it: `process` says `"store":true`, and
//! before its answer the child may read and write the partition's store;
//! the writes commit with the offset after the batch when it answers
//! `processed`, and are dropped if the batch fails. Gets and ranges are
//! answered; puts and deletes are not (send many, then read on):
//!
//! ```text
//! -> {"action":"process","store":true,"records":[…]}
//! <- {"action":"get","key":"<b64>"}                 -> {"action":"value","value":"<b64>"|null}
//! <- {"action":"put","key":"<b64>","value":"<b64>"}
//! <- {"action":"delete","key":"<b64>"}
//! <- {"action":"range","start":"<b64>","end":"<b64>"|null,"limit":100}
//!                                                   -> {"action":"entries","entries":[{"key":…,"value":…}, …]}
//! <- {"action":"processed"}
//! ```
//!
//! With a state directory (the worker's `[state]` with `kind =
//! "directory"`), the child keeps its state in files of its own (a SQLite
//! database, say) in the directory `initialize` names, and returns no
//! state bytes. The runtime restores the directory from the newest snapshot
//! before the child starts, and snapshots it between batches, so the child
//! writes it only between `process` and its answer. After any failure the
//! directory goes back to the last snapshot and the log is replayed from
//! its offset, so a batch the child applied but could not answer for is
//! not applied twice:
//!
//! ```text
//! -> {"action":"initialize",…,"state":null,"state_dir":"/var/lib/…/t/3/files"}
//! -> {"action":"process","records":[…]}
//! <- {"action":"processed"}
//! ```
//!
//! A child that exits, answers garbage or says `error` fails the call; the
//! batch is not checkpointed and is delivered again after a pause that
//! grows with each failure in a row (the worker's retry backoff), to a
//! fresh child started from the last checkpointed state.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use shardcall_spool::Record;

use crate::handler::{
    AnyStateHandler, ChosenAtRunTime, HandlerError, HandlerFactory, Interrupt, PartitionContext,
    PartitionHandler,
};
use crate::local_state::txn::StateTxn;

/// Makes an [`ExecHandler`] per partition, running `command` with `sh -c`.
#[derive(Debug, Clone)]
pub struct ExecFactory {
    /// The command line.
    pub command: String,
}

impl HandlerFactory for ExecFactory {
    type Handler = ExecHandler;

    fn create(&self, ctx: &PartitionContext) -> ExecHandler {
        ExecHandler {
            command: self.command.clone(),
            ctx: ctx.clone(),
            child: None,
            current: Arc::default(),
            state: None,
        }
    }
}

struct Running {
    /// Shared with the handler's [`Interrupt`], which kills it from another
    /// thread when a call outlives its deadline.
    child: Arc<Mutex<Child>>,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The last lines the child wrote to stderr (each also goes to the
    /// worker's own stderr, named after the partition).
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_reader: std::thread::JoinHandle<()>,
}

/// How many of a child's last stderr lines a failure message quotes.
const STDERR_TAIL: usize = 5;

/// Kills the child a call is waiting on.
struct KillChild(Arc<Mutex<Option<Arc<Mutex<Child>>>>>);

impl Interrupt for KillChild {
    fn interrupt(&self) {
        if let Some(child) = self.0.lock().expect("child lock").as_ref() {
            kill(&mut child.lock().expect("child lock"));
        }
    }
}

/// Kills the child and everything it started: it runs in a process group
/// of its own, and a shell's own child (`sh -c "a; b"`) would otherwise
/// keep the pipes open after the shell is gone. (std has no killpg; the
/// `kill` command does it without unsafe code.)
fn kill(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-s", "KILL", "--"])
        .arg(format!("-{}", child.id()))
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
}

/// One partition's child process.
pub struct ExecHandler {
    command: String,
    ctx: PartitionContext,
    child: Option<Running>,
    /// The running child, for the interrupter.
    current: Arc<Mutex<Option<Arc<Mutex<Child>>>>>,
    /// The last state the child returned (or was restored with).
    state: Option<Vec<u8>>,
}

impl std::fmt::Debug for ExecHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecHandler")
            .field("command", &self.command)
            .field("partition", &self.ctx.partition)
            .finish_non_exhaustive()
    }
}

impl Drop for ExecHandler {
    fn drop(&mut self) {
        self.stop();
    }
}

fn err(msg: impl Into<String>) -> HandlerError {
    HandlerError::msg(msg.into())
}

impl ExecHandler {
    fn stop(&mut self) {
        *self.current.lock().expect("child lock") = None;
        if let Some(r) = self.child.take() {
            let mut child = r.child.lock().expect("child lock");
            kill(&mut child);
            let _ = child.wait();
            crate::handler::child_guard::release(&child);
        }
    }

    /// The partition's last call (`revoked` or `shard_ended`): the child
    /// answers `ok` once it backed up, and is stopped either way.
    fn last_call(&mut self, action: &str) -> Result<(), HandlerError> {
        self.ensure_started()?;
        let out = self.call(&json!({ "action": action }), "ok").map(|_| ());
        self.stop();
        out
    }

    /// A failure: the child is stopped (the runtime pauses and retries).
    fn failed(&mut self, why: String) -> HandlerError {
        self.stop();
        err(why)
    }

    /// Starts the child if needed and initializes it with the last state.
    fn ensure_started(&mut self) -> Result<(), HandlerError> {
        if self.child.is_some() {
            return Ok(());
        }
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| err(format!("starting {:?}: {e}", self.command)))?;
        crate::handler::child_guard::guard(&child);
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let stderr = BufReader::new(child.stderr.take().expect("piped"));
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let (tail, partition) = (stderr_tail.clone(), self.ctx.partition.clone());
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
        let child = Arc::new(Mutex::new(child));
        *self.current.lock().expect("child lock") = Some(child.clone());
        self.child = Some(Running {
            child,
            stdin,
            stdout,
            stderr_tail,
            stderr_reader,
        });
        let init = json!({
            "action": "initialize",
            "partition": self.ctx.partition.to_string(),
            "epoch": self.ctx.epoch,
            "member": self.ctx.member.to_string(),
            "state": self.state.as_ref().map(|s| B64.encode(s)),
            "state_dir": self.ctx.state_dir.as_ref().map(|d| d.display().to_string()),
        });
        self.call(&init, "ok").map(|_| ())
    }

    /// Sends one request and reads its answer, which must be `expect`.
    fn call(&mut self, request: &Value, expect: &str) -> Result<Value, HandlerError> {
        let result = self.send(request).and_then(|()| {
            let v = self.receive()?;
            match v["action"].as_str() {
                Some(a) if a == expect => Ok(v),
                _ => Err(unexpected(&v, expect)),
            }
        });
        result.map_err(|why| self.failed(why))
    }

    /// Writes one line to the child.
    fn send(&mut self, request: &Value) -> Result<(), String> {
        let r = self.child.as_mut().ok_or("no child")?;
        let mut line = serde_json::to_string(request).map_err(|e| e.to_string())?;
        line.push('\n');
        r.stdin
            .write_all(line.as_bytes())
            .and_then(|()| r.stdin.flush())
            .map_err(|e| format!("writing to the handler: {e}"))
    }

    /// Reads one line from the child: a JSON object (an `error` from the
    /// child is an error here, with its message).
    fn receive(&mut self) -> Result<Value, String> {
        let r = self.child.as_mut().ok_or("no child")?;
        let mut answer = String::new();
        let n = r
            .stdout
            .read_line(&mut answer)
            .map_err(|e| format!("reading from the handler: {e}"))?;
        if n == 0 {
            let status = r
                .child
                .lock()
                .expect("child lock")
                .wait()
                .map(|s| s.to_string())
                .unwrap_or_default();
            // Its last words, once its stderr is drained (a grandchild
            // holding the pipe open gets a moment, not a wait).
            let waited = crate::clock::now();
            while !r.stderr_reader.is_finished() && waited.elapsed() < Duration::from_millis(200) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let tail: Vec<String> = r
                .stderr_tail
                .lock()
                .expect("stderr lock")
                .iter()
                .cloned()
                .collect();
            return Err(if tail.is_empty() {
                format!("the handler exited ({status}) without a word on stderr")
            } else {
                format!(
                    "the handler exited ({status}); its last stderr lines: {}",
                    tail.join(" | ")
                )
            });
        }
        let v: Value = serde_json::from_str(answer.trim()).map_err(|e| {
            format!(
                "the handler answered something that is not JSON ({e}): {:?}",
                answer.trim()
            )
        })?;
        if v["action"].as_str() == Some("error") {
            return Err(format!(
                "the handler reported an error: {}",
                v["message"].as_str().unwrap_or("(no message)")
            ));
        }
        Ok(v)
    }

    /// One batch whose state requests the child makes while it runs:
    /// answered from (and written to) the batch's transaction.
    fn process_with_store(
        &mut self,
        batch: &[Record],
        state: &mut StateTxn<'_>,
    ) -> Result<(), String> {
        let request = json!({
            "action": "process",
            "store": true,
            "records": batch.iter().map(record_json).collect::<Vec<_>>(),
        });
        self.send(&request)?;
        // A refused write fails the batch once the child is done with it
        // (its answers must still be read, to keep the lines in step).
        let mut refused: Option<String> = None;
        loop {
            let v = self.receive()?;
            let key = || field_bytes(&v, "key");
            match v["action"].as_str() {
                Some("processed") => return refused.map_or(Ok(()), Err),
                Some("get") => {
                    let value = state.get(&key()?).map_err(|e| e.to_string())?;
                    self.send(&json!({"action": "value", "value": value.map(|b| B64.encode(b))}))?;
                }
                Some("put") => {
                    let value = field_bytes(&v, "value")?;
                    if let Err(e) = state.put(&key()?, &value) {
                        refused.get_or_insert(format!("the handler's put was refused: {e}"));
                    }
                }
                Some("delete") => {
                    if let Err(e) = state.delete(&key()?) {
                        refused.get_or_insert(format!("the handler's delete was refused: {e}"));
                    }
                }
                Some("range") => {
                    let start = field_bytes(&v, "start")?;
                    let end = match v["end"].as_str() {
                        Some(_) => Some(field_bytes(&v, "end")?),
                        None => None,
                    };
                    let limit = v["limit"].as_u64().unwrap_or(1000).min(100_000) as usize;
                    let entries = state
                        .range(&start, end.as_deref(), limit)
                        .map_err(|e| e.to_string())?;
                    let entries: Vec<Value> = entries
                        .iter()
                        .map(|(k, v)| json!({"key": B64.encode(k), "value": B64.encode(v)}))
                        .collect();
                    self.send(&json!({"action": "entries", "entries": entries}))?;
                }
                _ => return Err(unexpected(&v, "processed, get, put, delete or range")),
            }
        }
    }
}

fn unexpected(v: &Value, expect: &str) -> String {
    format!("the handler answered {v} where {expect:?} was due")
}

/// A base64 field of a child's request, decoded.
fn field_bytes(v: &Value, name: &str) -> Result<Vec<u8>, String> {
    let text = v[name]
        .as_str()
        .ok_or_else(|| format!("the handler's {:?} request has no {name:?}", v["action"]))?;
    B64.decode(text)
        .map_err(|e| format!("the handler's {name:?} is not base64: {e}"))
}

fn record_json(r: &Record) -> Value {
    let mut out = json!({
        "offset": r.offset,
        "timestamp_ms": r.timestamp_ms,
        "key": r.key.as_ref().map(|k| B64.encode(k)),
        "value_b64": B64.encode(&r.payload),
        "value": std::str::from_utf8(&r.payload).ok(),
    });
    // A Kinesis record's names, as the KCL gives them: records are not
    // de-aggregated, so each is its own subsequence 0.
    if let Some(seq) = &r.sequence {
        out["sequence_number"] = json!(seq);
        out["sub_sequence_number"] = json!(0);
    }
    out
}

impl PartitionHandler for ExecHandler {
    type Keeps = ChosenAtRunTime;

    fn assigned(
        &mut self,
        ctx: &PartitionContext,
        state: Option<&[u8]>,
    ) -> Result<(), HandlerError> {
        self.ctx = ctx.clone();
        self.state = state.map(<[u8]>::to_vec);
        self.stop();
        self.ensure_started()
    }

    fn revoked(&mut self, _ctx: &PartitionContext) -> Result<(), HandlerError> {
        self.last_call("revoked")
    }

    fn shard_ended(&mut self, _ctx: &PartitionContext) -> Result<(), HandlerError> {
        self.last_call("shard_ended")
    }

    fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
        Some(Arc::new(KillChild(self.current.clone())))
    }
}

impl AnyStateHandler for ExecHandler {
    /// With a local state store the child reads and writes it through
    /// requests; without one it answers with its whole state.
    fn process(
        &mut self,
        _ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut StateTxn<'_>>,
    ) -> Result<Option<Vec<u8>>, HandlerError> {
        self.ensure_started()?;
        if let Some(txn) = store {
            self.process_with_store(batch, txn)
                .map_err(|why| self.failed(why))?;
            return Ok(None);
        }
        let request = json!({"action": "process", "records": batch.iter().map(record_json).collect::<Vec<_>>()});
        let answer = self.call(&request, "processed")?;
        let state = match answer["state"].as_str() {
            Some(s) => B64
                .decode(s)
                .map_err(|e| self.failed(format!("the handler's state is not base64: {e}")))?,
            None => Vec::new(),
        };
        self.state = Some(state.clone());
        Ok(Some(state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    use crate::handler::test_context as ctx;

    fn batch() -> Vec<Record> {
        vec![Record {
            offset: 0,
            timestamp_ms: 0,
            key: None,
            payload: Bytes::from_static(b"x"),
            sequence: None,
        }]
    }

    #[test]
    fn a_misbehaving_child_fails_the_batch_clearly() {
        // Answers the initialize, then garbage.
        let script = r#"read l; echo '{"action":"ok"}'; while read l; do echo 'not json'; done"#;
        let mut h = ExecFactory {
            command: script.into(),
        }
        .create(&ctx());
        h.assigned(&ctx(), None).unwrap();
        let err = h.process(&ctx(), &batch(), None).unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");
        // A handler that reports an error is an error too, with its message.
        let script = r#"read l; echo '{"action":"ok"}'; while read l; do echo '{"action":"error","message":"boom"}'; done"#;
        let mut h = ExecFactory {
            command: script.into(),
        }
        .create(&ctx());
        h.assigned(&ctx(), None).unwrap();
        assert!(
            h.process(&ctx(), &batch(), None)
                .unwrap_err()
                .to_string()
                .contains("boom")
        );
        // One that exits at once is reported, not waited for.
        let mut h = ExecFactory {
            command: "exit 7".into(),
        }
        .create(&ctx());
        let err = h.assigned(&ctx(), None).unwrap_err();
        assert!(
            err.to_string().contains("exited") || err.to_string().contains("writing"),
            "{}",
            err.0
        );
    }

    #[test]
    fn a_child_that_dies_is_reported_with_its_status_and_last_words() {
        let script =
            r#"read l; echo '{"action":"ok"}'; read l; echo "no such table: orders" >&2; exit 3"#;
        let mut h = ExecFactory {
            command: script.into(),
        }
        .create(&ctx());
        h.assigned(&ctx(), None).unwrap();
        let err = h.process(&ctx(), &batch(), None).unwrap_err();
        assert!(err.to_string().contains("exit status: 3"), "{err}");
        assert!(err.to_string().contains("no such table: orders"), "{err}");
    }

    /// The last call names why the partition went: `shard_ended` for one
    /// processed to its end, `revoked` for one that moved; a child that
    /// answers anything but `ok` fails it.
    #[test]
    fn the_last_call_says_whether_the_partition_ended_or_moved() {
        // Answers ok to the initialize and to `shard_ended` only.
        let script = r#"read l; echo '{"action":"ok"}'; read l
            case "$l" in
              *'"action":"shard_ended"'*) echo '{"action":"ok"}';;
              *'"action":"revoked"'*) echo '{"action":"error","message":"told revoked"}';;
            esac"#;
        let child = || {
            let mut h = ExecFactory {
                command: script.into(),
            }
            .create(&ctx());
            h.assigned(&ctx(), None).unwrap();
            h
        };
        child().shard_ended(&ctx()).unwrap();
        let err = child().revoked(&ctx()).unwrap_err();
        assert!(err.to_string().contains("told revoked"), "{err}");
    }

    #[test]
    fn a_restarted_child_starts_from_the_last_state() {
        // Echoes the state it was initialized with as its new state, so what
        // a restarted child returns shows what the restart restored.
        let script = r#"
            while read l; do
              case "$l" in
                *initialize*) s=$(echo "$l" | sed -n 's/.*"state":"\([^"]*\)".*/\1/p'); echo '{"action":"ok"}';;
                *process*) echo "{\"action\":\"processed\",\"state\":\"$s\"}";;
              esac
            done"#;
        let mut h = ExecFactory {
            command: script.into(),
        }
        .create(&ctx());
        h.assigned(&ctx(), Some(b"restored")).unwrap();
        assert_eq!(
            h.process(&ctx(), &batch(), None).unwrap(),
            Some(b"restored".to_vec())
        );
        h.stop(); // as if it had crashed
        assert_eq!(
            h.process(&ctx(), &batch(), None).unwrap(),
            Some(b"restored".to_vec())
        );
    }
}
