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

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use shardcall_spool::Record;

use crate::handler::exec_child::{Children, Running, kill, stop_child};
use crate::handler::exec_records::ExecRecords;
use crate::handler::per_key::{KeyState, RecordCall, SharedHandler};
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
    /// Children per partition when records run one by one (`ordering =
    /// key` or `none`): with 1, one child takes every record in flight,
    /// each with an id, and may answer in any order; with more, each child
    /// takes one record at a time (for a child that cannot take many).
    /// Batches always go to one child.
    pub children: usize,
}

impl ExecFactory {
    /// One child per partition running `command`.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            children: 1,
        }
    }
}

impl HandlerFactory for ExecFactory {
    type Handler = ExecHandler;

    fn create(&self, ctx: &PartitionContext) -> ExecHandler {
        ExecHandler {
            command: self.command.clone(),
            children: self.children,
            ctx: ctx.clone(),
            child: None,
            current: Children::default(),
            records: None,
            state: None,
        }
    }

    /// Every `--exec` child may take records one by one.
    fn per_record(&self) -> bool {
        true
    }
}

/// The first request a child gets.
pub(crate) fn initialize_request(ctx: &PartitionContext, state: Option<&[u8]>) -> Value {
    json!({
        "action": "initialize",
        "partition": ctx.partition.to_string(),
        "epoch": ctx.epoch,
        "member": ctx.member.to_string(),
        "state": state.map(|s| B64.encode(s)),
        "state_dir": ctx.state_dir.as_ref().map(|d| d.display().to_string()),
    })
}

/// Kills the children a call is waiting on.
struct KillChild(Children);

impl Interrupt for KillChild {
    fn interrupt(&self) {
        for child in self.0.lock().expect("children lock").iter() {
            kill(&mut child.lock().expect("child lock"));
        }
    }
}

/// One partition's child process (or processes, for records one by one).
pub struct ExecHandler {
    command: String,
    children: usize,
    ctx: PartitionContext,
    /// The child batches go to.
    child: Option<Running>,
    /// Every running child, for the interrupter.
    current: Children,
    /// The children records go to, one by one, once records ran that way.
    records: Option<Arc<ExecRecords>>,
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
        if let Some(records) = self.records.take() {
            records.stop();
        }
        if let Some(r) = self.child.take() {
            stop_child(&self.current, &r.life.child);
        }
    }

    /// The partition's last call (`revoked` or `shard_ended`): the child
    /// answers `ok` once it backed up, and is stopped either way.
    fn last_call(&mut self, action: &str) -> Result<(), HandlerError> {
        if let Some(records) = self.records.take() {
            let out = records.last_call(action);
            self.stop();
            return out;
        }
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
        let running = Running::start_initialized(
            &self.command,
            &self.ctx,
            self.state.as_deref(),
            &self.current,
        )
        .map_err(err)?;
        self.child = Some(running);
        Ok(())
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

    fn send(&mut self, request: &Value) -> Result<(), String> {
        self.child.as_mut().ok_or("no child")?.send(request)
    }

    fn receive(&mut self) -> Result<Value, String> {
        self.child.as_mut().ok_or("no child")?.receive()
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

pub(crate) fn unexpected(v: &Value, expect: &str) -> String {
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

pub(crate) fn record_json(r: &Record) -> Value {
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

/// An [`ExecHandler`] while its records run one by one: each call goes to
/// its children.
struct SharedExec {
    handler: ExecHandler,
    records: Arc<ExecRecords>,
}

impl SharedHandler for SharedExec {
    fn call(&self, _ctx: Arc<PartitionContext>, record: Record, state: KeyState) -> RecordCall {
        let records = self.records.clone();
        Box::pin(async move { records.call(&record, state).await })
    }
}

impl AnyStateHandler for ExecHandler {
    /// The child started for the partition takes its records, the first
    /// of [`ExecFactory::children`].
    fn share(mut self) -> Result<Arc<dyn SharedHandler>, Self> {
        let records = match self.records.take() {
            Some(records) => records,
            None => {
                // The batch child, already listed, becomes the first.
                let running = self.child.take();
                Arc::new(ExecRecords::new(
                    self.command.clone(),
                    self.ctx.clone(),
                    self.children,
                    self.current.clone(),
                    running,
                ))
            }
        };
        Ok(Arc::new(SharedExec {
            handler: self,
            records,
        }))
    }

    fn unshare(shared: Arc<dyn SharedHandler>) -> Option<Self> {
        let any: Arc<dyn std::any::Any + Send + Sync> = shared;
        let SharedExec {
            mut handler,
            records,
        } = Arc::try_unwrap(any.downcast::<SharedExec>().ok()?).ok()?;
        handler.records = Some(records);
        Some(handler)
    }

    /// With a local state store the child reads and writes it through
    /// requests; without one it answers with its whole state.
    fn process(
        &mut self,
        _ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut StateTxn<'_>>,
    ) -> Result<Option<Vec<u8>>, HandlerError> {
        if let Some(records) = self.records.take() {
            records.stop();
        }
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
        let mut h = ExecFactory::new(script).create(&ctx());
        h.assigned(&ctx(), None).unwrap();
        let err = h.process(&ctx(), &batch(), None).unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");
        // A handler that reports an error is an error too, with its message.
        let script = r#"read l; echo '{"action":"ok"}'; while read l; do echo '{"action":"error","message":"boom"}'; done"#;
        let mut h = ExecFactory::new(script).create(&ctx());
        h.assigned(&ctx(), None).unwrap();
        assert!(
            h.process(&ctx(), &batch(), None)
                .unwrap_err()
                .to_string()
                .contains("boom")
        );
        // One that exits at once is reported, not waited for.
        let mut h = ExecFactory::new("exit 7").create(&ctx());
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
        let mut h = ExecFactory::new(script).create(&ctx());
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
            let mut h = ExecFactory::new(script).create(&ctx());
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
        let mut h = ExecFactory::new(script).create(&ctx());
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
