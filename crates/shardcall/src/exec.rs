//! Handlers in any language: a child process per partition speaking
//! line-delimited JSON on stdin/stdout, in the manner of the Kinesis Client
//! Library's MultiLangDaemon.
//!
//! Every request is one JSON object on a line; the child answers each with
//! one line. Bytes (keys, values, state) travel base64-encoded; `value` also
//! carries the text when the bytes are UTF-8.
//!
//! ```text
//! -> {"action":"initialize","partition":"t/3","epoch":7,"member":"w1-…","state":"<b64>"|null}
//! <- {"action":"ok"}
//! -> {"action":"process","records":[{"offset":0,"timestamp_ms":0,"key":"<b64>"|null,
//!                                     "value_b64":"<b64>","value":"text"|null}, …]}
//! <- {"action":"processed","state":"<b64>"}
//! -> {"action":"revoked"}            (the partition was released; back up now)
//! <- {"action":"ok"}
//! <- {"action":"error","message":"…"}   (instead of any answer: the batch is retried)
//! ```
//!
//! A child that exits, answers garbage or says `error` fails the call; the
//! batch is not checkpointed and is delivered again after a pause that
//! grows with each failure in a row (the worker's retry backoff), to a
//! fresh child started from the last checkpointed state.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use shardcall_spool::Record;

use crate::handler::{HandlerError, HandlerFactory, PartitionContext, PartitionHandler};

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
            state: None,
        }
    }
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// One partition's child process.
pub struct ExecHandler {
    command: String,
    ctx: PartitionContext,
    child: Option<Running>,
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
    HandlerError(msg.into())
}

impl ExecHandler {
    fn stop(&mut self) {
        if let Some(mut r) = self.child.take() {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
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
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| err(format!("starting {:?}: {e}", self.command)))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        self.child = Some(Running {
            child,
            stdin,
            stdout,
        });
        let init = json!({
            "action": "initialize",
            "partition": self.ctx.partition.to_string(),
            "epoch": self.ctx.epoch,
            "member": self.ctx.member.to_string(),
            "state": self.state.as_ref().map(|s| B64.encode(s)),
        });
        self.call(&init, "ok").map(|_| ())
    }

    /// Sends one request and reads its answer, which must be `expect`.
    fn call(&mut self, request: &Value, expect: &str) -> Result<Value, HandlerError> {
        let result = (|| {
            let r = self.child.as_mut().ok_or("no child")?;
            let mut line = serde_json::to_string(request).map_err(|e| e.to_string())?;
            line.push('\n');
            r.stdin
                .write_all(line.as_bytes())
                .and_then(|()| r.stdin.flush())
                .map_err(|e| format!("writing to the handler: {e}"))?;
            let mut answer = String::new();
            let n = r
                .stdout
                .read_line(&mut answer)
                .map_err(|e| format!("reading from the handler: {e}"))?;
            if n == 0 {
                let status = r.child.wait().map(|s| s.to_string()).unwrap_or_default();
                return Err(format!("the handler exited ({status})"));
            }
            let v: Value = serde_json::from_str(answer.trim()).map_err(|e| {
                format!(
                    "the handler answered something that is not JSON ({e}): {:?}",
                    answer.trim()
                )
            })?;
            match v["action"].as_str() {
                Some(a) if a == expect => Ok(v),
                Some("error") => Err(format!(
                    "the handler reported an error: {}",
                    v["message"].as_str().unwrap_or("(no message)")
                )),
                _ => Err(format!("the handler answered {v} where {expect:?} was due")),
            }
        })();
        result.map_err(|why| self.failed(why))
    }
}

fn record_json(r: &Record) -> Value {
    json!({
        "offset": r.offset,
        "timestamp_ms": r.timestamp_ms,
        "key": r.key.as_ref().map(|k| B64.encode(k)),
        "value_b64": B64.encode(&r.payload),
        "value": std::str::from_utf8(&r.payload).ok(),
    })
}

impl PartitionHandler for ExecHandler {
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

    fn process(
        &mut self,
        _ctx: &PartitionContext,
        batch: &[Record],
    ) -> Result<Vec<u8>, HandlerError> {
        self.ensure_started()?;
        let request = json!({"action": "process", "records": batch.iter().map(record_json).collect::<Vec<_>>()});
        let answer = self.call(&request, "processed")?;
        let state = match answer["state"].as_str() {
            Some(s) => B64
                .decode(s)
                .map_err(|e| self.failed(format!("the handler's state is not base64: {e}")))?,
            None => Vec::new(),
        };
        self.state = Some(state.clone());
        Ok(state)
    }

    fn revoked(&mut self, _ctx: &PartitionContext) -> Result<(), HandlerError> {
        self.ensure_started()?;
        let out = self.call(&json!({"action": "revoked"}), "ok").map(|_| ());
        self.stop();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use shardcall_core::{MemberId, PartitionId};

    fn ctx() -> PartitionContext {
        PartitionContext {
            partition: PartitionId::new("t", 0),
            epoch: 1,
            member: MemberId::new("m"),
        }
    }

    fn batch() -> Vec<Record> {
        vec![Record {
            offset: 0,
            timestamp_ms: 0,
            key: None,
            payload: Bytes::from_static(b"x"),
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
        let err = h.process(&ctx(), &batch()).unwrap_err();
        assert!(err.0.contains("not JSON"), "{}", err.0);
        // A handler that reports an error is an error too, with its message.
        let script = r#"read l; echo '{"action":"ok"}'; while read l; do echo '{"action":"error","message":"boom"}'; done"#;
        let mut h = ExecFactory {
            command: script.into(),
        }
        .create(&ctx());
        h.assigned(&ctx(), None).unwrap();
        assert!(h.process(&ctx(), &batch()).unwrap_err().0.contains("boom"));
        // One that exits at once is reported, not waited for.
        let mut h = ExecFactory {
            command: "exit 7".into(),
        }
        .create(&ctx());
        let err = h.assigned(&ctx(), None).unwrap_err();
        assert!(
            err.0.contains("exited") || err.0.contains("writing"),
            "{}",
            err.0
        );
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
        assert_eq!(h.process(&ctx(), &batch()).unwrap(), b"restored");
        h.stop(); // as if it had crashed
        assert_eq!(h.process(&ctx(), &batch()).unwrap(), b"restored");
    }
}
