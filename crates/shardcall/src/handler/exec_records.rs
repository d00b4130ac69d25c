//! `--exec` children under `ordering = key` or `none`: one record a
//! request, many out at once, answered in any order.
//!
//! Each request carries an id and the record's key state; the answer names
//! the id. A child written with `asyncio` (or threads) takes every record
//! in flight and answers each when its work is done:
//!
//! ```text
//! -> {"action":"record","id":7,"record":{"offset":12,"key":"<b64>"|null,…},"state":"<b64>"|null}
//! <- {"action":"processed","id":7,"state":"<b64>"}     (the key's new state)
//! <- {"action":"processed","id":7}                     (state unchanged)
//! <- {"action":"processed","id":7,"state":null}        (state deleted)
//! <- {"action":"error","id":7,"message":"…"}           (this record fails; it is retried)
//! ```
//!
//! `record` has the fields of a `process` request's records. Under
//! `ordering = none` the state is always `null` and an answer may not set
//! it (no state is kept per key there).
//!
//! A child that cannot take many at once is run as a pool instead
//! (`children` above 1): that many children per partition, each given one
//! record at a time, so it may answer in order with the same lines.
//!
//! A child that exits or answers garbage fails the records it holds (each
//! is retried, on a child started anew); one that answers nothing at all
//! for a whole call deadline is taken to hang and is killed. The last call
//! (`revoked` or `shard_ended`) goes to every child, and is answered
//! `{"action":"ok"}` without an id, as in batch mode.

use std::collections::HashMap;
use std::io::BufReader;
use std::process::{Child, ChildStdin, ChildStdout};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use shardcall_spool::Record;
use tokio::sync::oneshot;

use crate::handler::exec::{record_json, unexpected};
use crate::handler::exec_child::Children;
use crate::handler::exec_child::{
    ChildLife, Running, child_error, kill, read_line, stop_child, write_line,
};
use crate::handler::per_key::KeyState;
use crate::handler::{HandlerError, PartitionContext};

/// What the reader of a child's answers gives a waiting call: the answer,
/// or why none will come.
type Answer = Result<Value, String>;

/// The records of one partition, sent to its children.
pub(crate) struct ExecRecords {
    command: String,
    ctx: PartitionContext,
    children: Children,
    /// Each child, started when a record first needs it and again after it
    /// ended.
    slots: Vec<Mutex<Option<Arc<Pipe>>>>,
    /// Held while a slot's child starts, so it starts once.
    starting: Vec<tokio::sync::Mutex<()>>,
    /// With more than one child: the children free to take a record, and
    /// a permit for each.
    free: Option<(tokio::sync::Semaphore, Mutex<Vec<usize>>)>,
    next_id: AtomicU64,
}

impl ExecRecords {
    /// Records for `children` children of `command` (one: every record in
    /// flight to it); `running`, a child already initialized, is the first.
    pub(crate) fn new(
        command: String,
        ctx: PartitionContext,
        children: usize,
        shared: Children,
        running: Option<Running>,
    ) -> Self {
        let children_n = children.max(1);
        let slots: Vec<_> = (0..children_n).map(|_| Mutex::new(None)).collect();
        if let Some(running) = running {
            *slots[0].lock().expect("slot lock") = Some(Arc::new(Pipe::new(running, &shared)));
        }
        let free = (children_n > 1).then(|| {
            (
                tokio::sync::Semaphore::new(children_n),
                Mutex::new((0..children_n).rev().collect()),
            )
        });
        Self {
            command,
            ctx,
            children: shared,
            slots,
            starting: (0..children_n)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            free,
            next_id: AtomicU64::new(0),
        }
    }

    /// Sends `record` with its key's `state` to a child and waits for the
    /// answer: the key's state after it.
    pub(crate) async fn call(
        &self,
        record: &Record,
        mut state: KeyState,
    ) -> Result<KeyState, HandlerError> {
        // A pool gives each child one record at a time.
        let _permit;
        let taken = match &self.free {
            Some((permits, free)) => {
                _permit = permits.acquire().await.expect("never closed");
                Some(FreeSlot {
                    slot: free
                        .lock()
                        .expect("free lock")
                        .pop()
                        .expect("a permit each"),
                    free,
                })
            }
            None => None,
        };
        let slot = taken.as_ref().map_or(0, |t| t.slot);
        let pipe = self.pipe(slot).await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = json!({
            "action": "record",
            "id": id,
            "record": record_json(record),
            "state": state.get().map(|s| B64.encode(s)),
        });
        let waiting = pipe.send(id, request).await?;
        let answer = waiting.answer().await.map_err(HandlerError::msg)?;
        match answer.get("state") {
            None => {}
            Some(Value::Null) => state.delete(),
            Some(Value::String(s)) => state.set(B64.decode(s).map_err(|e| {
                HandlerError::msg(format!("the handler's state is not base64: {e}"))
            })?),
            Some(other) => {
                return Err(HandlerError::msg(format!(
                    "the handler answered a state that is not base64 text: {other}"
                )));
            }
        }
        Ok(state)
    }

    /// The child of `slot`, started (and initialized) if it is not running.
    async fn pipe(&self, slot: usize) -> Result<Arc<Pipe>, HandlerError> {
        let _starting = self.starting[slot].lock().await;
        let ended = {
            let mut held = self.slots[slot].lock().expect("slot lock");
            match held.as_ref() {
                Some(pipe) if !pipe.closed() => return Ok(pipe.clone()),
                _ => held.take(),
            }
        };
        // The child that ended is forgotten by the interrupter and the
        // guardian before another takes its place.
        if let Some(ended) = ended {
            tokio::task::spawn_blocking(move || ended.stop())
                .await
                .map_err(HandlerError::from)?;
        }
        let (command, ctx) = (self.command.clone(), self.ctx.clone());
        let children = self.children.clone();
        let started = tokio::task::spawn_blocking(move || {
            Running::start_initialized(&command, &ctx, None, &children)
        })
        .await
        .map_err(HandlerError::from)?
        .map_err(HandlerError::msg)?;
        let pipe = Arc::new(Pipe::new(started, &self.children));
        *self.slots[slot].lock().expect("slot lock") = Some(pipe.clone());
        Ok(pipe)
    }

    /// The partition's last call, to every child running (`revoked` or
    /// `shard_ended`): each answers `ok` once it backed up, and is stopped
    /// either way. Called on a blocking thread.
    pub(crate) fn last_call(&self, action: &str) -> Result<(), HandlerError> {
        let mut first_error = None;
        for slot in &self.slots {
            let Some(pipe) = slot.lock().expect("slot lock").take() else {
                continue;
            };
            // A child that ended hears nothing, but is stopped all the same.
            if !pipe.closed()
                && let Err(why) = pipe.control(&json!({ "action": action }))
            {
                first_error.get_or_insert(why);
            }
            pipe.stop();
        }
        first_error.map_or(Ok(()), |why| Err(HandlerError::msg(why)))
    }

    /// Stops every child.
    pub(crate) fn stop(&self) {
        for slot in &self.slots {
            if let Some(pipe) = slot.lock().expect("slot lock").take() {
                pipe.stop();
            }
        }
    }
}

/// A child of a pool, taken for one record and given back after it.
struct FreeSlot<'a> {
    slot: usize,
    free: &'a Mutex<Vec<usize>>,
}

impl Drop for FreeSlot<'_> {
    fn drop(&mut self) {
        self.free.lock().expect("free lock").push(self.slot);
    }
}

/// Who waits for which answer of one child.
#[derive(Default)]
struct Waiters {
    calls: HashMap<u64, oneshot::Sender<Answer>>,
    /// The last call, answered without an id.
    control: Option<std::sync::mpsc::Sender<Answer>>,
    /// Why the child's answers ended (set once, when they did).
    closed: Option<String>,
}

/// One running child with its answers read on a thread of their own.
struct Pipe {
    stdin: Arc<Mutex<ChildStdin>>,
    child: Arc<Mutex<Child>>,
    waiters: Arc<Mutex<Waiters>>,
    /// Answers read so far: a call that saw none come while it waited its
    /// whole deadline found the child hung.
    answered: Arc<AtomicU64>,
    children: Children,
}

impl Pipe {
    /// Takes over an initialized child (listed in `children` by
    /// [`Running::start_initialized`]): its answers are read from now on.
    fn new(running: Running, children: &Children) -> Self {
        let Running {
            stdin,
            stdout,
            life,
        } = running;
        // Listed among the children since it started.
        let child = life.child.clone();
        let waiters = Arc::new(Mutex::new(Waiters::default()));
        let answered = Arc::new(AtomicU64::new(0));
        let (w, a) = (waiters.clone(), answered.clone());
        std::thread::spawn(move || read_answers(stdout, &life, &w, &a));
        Self {
            stdin: Arc::new(Mutex::new(stdin)),
            child,
            waiters,
            answered,
            children: children.clone(),
        }
    }

    fn closed(&self) -> bool {
        self.waiters.lock().expect("waiters lock").closed.is_some()
    }

    /// Sends a record's request, the answer to come to the returned call.
    async fn send(self: &Arc<Self>, id: u64, request: Value) -> Result<Waiting, HandlerError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut waiters = self.waiters.lock().expect("waiters lock");
            if let Some(why) = &waiters.closed {
                return Err(HandlerError::msg(why.clone()));
            }
            waiters.calls.insert(id, tx);
        }
        let waiting = Waiting {
            pipe: self.clone(),
            id,
            answered_before: self.answered.load(Ordering::Acquire),
            rx: Some(rx),
        };
        // A write blocks while the child's input is full: off the runtime.
        let stdin = self.stdin.clone();
        tokio::task::spawn_blocking(move || {
            write_line(&mut stdin.lock().expect("stdin lock"), &request)
        })
        .await
        .map_err(HandlerError::from)?
        .map_err(HandlerError::msg)?;
        Ok(waiting)
    }

    /// Sends a request answered without an id and waits for its `ok`.
    fn control(&self, request: &Value) -> Result<(), String> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.waiters.lock().expect("waiters lock").control = Some(tx);
        write_line(&mut self.stdin.lock().expect("stdin lock"), request)?;
        let v = rx
            .recv()
            .map_err(|_| "the handler ended before it answered".to_owned())??;
        if v["action"] == "ok" {
            Ok(())
        } else {
            Err(unexpected(&v, "ok"))
        }
    }

    /// Kills the child; its reader then fails whatever still waits.
    fn stop(&self) {
        stop_child(&self.children, &self.child);
    }
}

/// A record's request sent, its answer not yet in.
struct Waiting {
    pipe: Arc<Pipe>,
    id: u64,
    answered_before: u64,
    rx: Option<oneshot::Receiver<Answer>>,
}

impl Waiting {
    async fn answer(mut self) -> Answer {
        let rx = self.rx.as_mut().expect("taken once");
        let answer = rx
            .await
            .unwrap_or_else(|_| Err("the handler ended before it answered".to_owned()));
        self.rx = None;
        answer
    }
}

impl Drop for Waiting {
    /// A call given up before its answer (its deadline passed, or the
    /// partition ended): its answer will find no one. A child that answered
    /// nothing at all meanwhile is taken to hang, and is killed so that the
    /// retry finds a new one.
    fn drop(&mut self) {
        if self.rx.is_none() {
            return;
        }
        self.pipe
            .waiters
            .lock()
            .expect("waiters lock")
            .calls
            .remove(&self.id);
        if self.pipe.answered.load(Ordering::Acquire) == self.answered_before {
            tracing::warn!(
                "an --exec child answered nothing while a record waited its whole call; it is restarted"
            );
            self.pipe.stop();
        }
    }
}

/// Reads a child's answers until its output ends, giving each to its call;
/// then fails every call still waiting with why.
fn read_answers(
    mut stdout: BufReader<ChildStdout>,
    life: &ChildLife,
    waiters: &Mutex<Waiters>,
    answered: &AtomicU64,
) {
    let why = loop {
        let v = match read_line(&mut stdout, || life.ended()) {
            Ok(v) => v,
            Err(why) => break why,
        };
        let answer = if v["action"] == "error" {
            Err(child_error(&v))
        } else {
            Ok(v.clone())
        };
        answered.fetch_add(1, Ordering::AcqRel);
        let mut w = waiters.lock().expect("waiters lock");
        match v.get("id").and_then(Value::as_u64) {
            // An answer to a call given up on finds no one.
            Some(id) => {
                if let Some(tx) = w.calls.remove(&id) {
                    let _ = tx.send(answer);
                }
            }
            None => match w.control.take() {
                Some(tx) => {
                    let _ = tx.send(answer);
                }
                None => {
                    break format!(
                        "the handler answered {v} with no id, where every answer names its record's id"
                    );
                }
            },
        }
    };
    kill(&mut life.child.lock().expect("child lock"));
    let mut w = waiters.lock().expect("waiters lock");
    w.closed = Some(why.clone());
    for (_, tx) in w.calls.drain() {
        let _ = tx.send(Err(why.clone()));
    }
    if let Some(tx) = w.control.take() {
        let _ = tx.send(Err(why));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::collections::BTreeSet;
    use std::time::Duration;

    use crate::handler::test_context as ctx;

    fn record(offset: u64) -> Record {
        Record {
            offset,
            timestamp_ms: 0,
            key: Some(Bytes::from(format!("k{offset}"))),
            payload: Bytes::from_static(b"x"),
            sequence: None,
        }
    }

    /// A Python child from `body` (run after the initialize is answered;
    /// `send` writes a line).
    fn python(dir: &tempfile::TempDir, body: &str) -> String {
        let script = dir.path().join("child.py");
        let prelude = "import json, os, sys, time\n\
            def send(o):\n    sys.stdout.write(json.dumps(o) + '\\n'); sys.stdout.flush()\n\
            sys.stdin.readline(); send({'action': 'ok'})\n";
        std::fs::write(&script, format!("{prelude}{body}")).unwrap();
        format!("python3 {}", script.display())
    }

    fn records(command: String, children: usize) -> Arc<ExecRecords> {
        Arc::new(ExecRecords::new(
            command,
            ctx(),
            children,
            Children::default(),
            None,
        ))
    }

    fn text(state: &KeyState) -> String {
        String::from_utf8(state.get().unwrap_or_default().to_vec()).unwrap()
    }

    /// Three records out at once, answered last first: each answer reaches
    /// its own record, with the state the child set.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_in_any_order_reach_their_own_records() {
        let dir = tempfile::tempdir().unwrap();
        let child = python(
            &dir,
            "import base64\n\
             got = [json.loads(sys.stdin.readline()) for _ in range(3)]\n\
             for m in reversed(got):\n    \
                 s = base64.b64encode(b'state of %d' % m['record']['offset']).decode()\n    \
                 send({'action': 'processed', 'id': m['id'], 'state': s})\n\
             sys.stdin.read()\n",
        );
        let r = records(child, 1);
        let calls: Vec<_> = (0..3)
            .map(|o| {
                let r = r.clone();
                tokio::spawn(async move { r.call(&record(o), KeyState::new(None)).await })
            })
            .collect();
        for (o, call) in calls.into_iter().enumerate() {
            let state = call.await.unwrap().unwrap();
            assert_eq!(text(&state), format!("state of {o}"));
        }
        r.stop();
    }

    /// A state left out is unchanged; `null` deletes it; an `error` fails
    /// only its record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_keeps_deletes_or_fails_its_record_alone() {
        let dir = tempfile::tempdir().unwrap();
        let child = python(
            &dir,
            "for line in sys.stdin:\n    \
                 m = json.loads(line); o = m['record']['offset']\n    \
                 if o == 0: send({'action': 'processed', 'id': m['id']})\n    \
                 elif o == 1: send({'action': 'processed', 'id': m['id'], 'state': None})\n    \
                 else: send({'action': 'error', 'id': m['id'], 'message': 'no service'})\n",
        );
        let r = records(child, 1);
        let kept = r
            .call(&record(0), KeyState::new(Some(b"old".to_vec())))
            .await
            .unwrap();
        assert_eq!(kept, KeyState::new(Some(b"old".to_vec())), "unchanged");
        let deleted = r
            .call(&record(1), KeyState::new(Some(b"old".to_vec())))
            .await
            .unwrap();
        assert_eq!(deleted.get(), None);
        let err = r.call(&record(2), KeyState::new(None)).await.unwrap_err();
        assert!(err.to_string().contains("no service"), "{err}");
        // The child goes on after a record's error.
        r.call(&record(0), KeyState::new(None)).await.unwrap();
        r.stop();
    }

    /// A child that exits fails every record it holds, with its last words;
    /// the next record starts a new child.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_that_exits_fails_what_it_holds_and_the_next_record_starts_another() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("died-once");
        let child = python(
            &dir,
            &format!(
                "marker = {marker:?}\n\
                 if not os.path.exists(marker):\n    \
                     sys.stdin.readline(); sys.stdin.readline()\n    \
                     open(marker, 'w').close()\n    \
                     sys.stderr.write('lost my connection\\n'); sys.stderr.flush(); sys.exit(4)\n\
                 for line in sys.stdin:\n    \
                     m = json.loads(line); send({{'action': 'processed', 'id': m['id']}})\n",
                marker = marker.display().to_string()
            ),
        );
        let r = records(child, 1);
        let (zero, one) = (record(0), record(1));
        let (a, b) = tokio::join!(
            r.call(&zero, KeyState::new(None)),
            r.call(&one, KeyState::new(None))
        );
        for failed in [a.unwrap_err(), b.unwrap_err()] {
            let why = failed.to_string();
            assert!(why.contains("exit status: 4"), "{why}");
            assert!(why.contains("lost my connection"), "{why}");
        }
        r.call(&record(0), KeyState::new(None)).await.unwrap();
        assert_eq!(
            r.children.lock().unwrap().len(),
            1,
            "the child that exited is still listed"
        );
        r.stop();
    }

    /// A record given up on (its deadline passed) while the child answered
    /// nothing at all: the child hangs, and is killed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_that_answers_nothing_for_a_whole_call_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let child = python(&dir, "time.sleep(600)\n");
        let children = Children::default();
        let r = ExecRecords::new(child, ctx(), 1, children.clone(), None);
        let zero = record(0);
        let call = r.call(&zero, KeyState::new(None));
        assert!(
            tokio::time::timeout(Duration::from_millis(500), call)
                .await
                .is_err()
        );
        assert!(
            children.lock().unwrap().is_empty(),
            "the hung child still runs"
        );
        // Its reader sees the end, so the next record starts another.
        let pipe = r.slots[0].lock().unwrap().clone().unwrap();
        crate::eventually::eventually(Duration::from_secs(5), || {
            let closed = pipe.closed();
            async move {
                if closed {
                    Ok(())
                } else {
                    Err("the killed child's answers never ended".to_owned())
                }
            }
        })
        .await;
    }

    /// A pool gives each child one record at a time: a child that answers
    /// in order, one request after another, still serves records at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pool_gives_each_child_one_record_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        // Fails a record that comes while another is being worked on.
        let child = python(
            &dir,
            "import base64, select\n\
             for line in sys.stdin:\n    \
                 m = json.loads(line); time.sleep(0.2)\n    \
                 if select.select([sys.stdin], [], [], 0)[0]:\n        \
                     send({'action': 'error', 'id': m['id'], 'message': 'two at once'}); continue\n    \
                 pid = base64.b64encode(str(os.getpid()).encode()).decode()\n    \
                 send({'action': 'processed', 'id': m['id'], 'state': pid})\n",
        );
        let r = records(child, 2);
        let calls: Vec<_> = (0..4)
            .map(|o| {
                let r = r.clone();
                tokio::spawn(async move { r.call(&record(o), KeyState::new(None)).await })
            })
            .collect();
        let mut pids = BTreeSet::new();
        for call in calls {
            pids.insert(text(&call.await.unwrap().unwrap()));
        }
        assert_eq!(pids.len(), 2, "two children served the records: {pids:?}");
        r.stop();
    }
}
