#!/usr/bin/env python3
"""A shardcall handler in Python that keeps its state in a SQLite database
of its own, in the directory the runtime gives it (run the worker with
--state-dir, --backup-dir and --set state.kind=directory), over the
line-delimited JSON protocol (see crates/shardcall/src/exec.rs).

It counts records per key (table counts) and writes down each offset it
processed in the order it processed them (table seen), each batch in one
transaction, so a test can check the state holds every record once and in
order. The runtime snapshots the directory between batches and restores it
before the first; after any failure it goes back to the last snapshot and
replays the log, so this handler needs no offset bookkeeping of its own.

For tests: with SQLITE_COUNTS_LOSE_ANSWER_AT=N and SQLITE_COUNTS_FLAGS=DIR,
the first batch of each partition that holds offset N is committed and then
the process exits without answering, once per partition (a flag file in DIR
says it happened): the batch is in the database, but the runtime never
heard so.

Run it with:  shardcall worker ... --state-dir S --backup-dir B \
  --set state.kind=directory --exec "python3 examples/handlers/sqlite_counts.py"
"""
import base64
import json
import os
import sqlite3
import sys


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def receive():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


def open_db(state_dir):
    db = sqlite3.connect(os.path.join(state_dir, "counts.db"), isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS counts (key TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    db.execute("CREATE TABLE IF NOT EXISTS seen (record_offset INTEGER NOT NULL)")
    return db


def lose_answer_here(partition, records):
    at = os.environ.get("SQLITE_COUNTS_LOSE_ANSWER_AT")
    flags = os.environ.get("SQLITE_COUNTS_FLAGS")
    if at is None or flags is None or not any(r["offset"] == int(at) for r in records):
        return False
    flag = os.path.join(flags, partition.replace("/", "-"))
    if os.path.exists(flag):
        return False
    open(flag, "w").close()
    return True


def main():
    db = None
    partition = None
    while True:
        msg = receive()
        action = msg.get("action")
        if action == "initialize":
            if not msg.get("state_dir"):
                send({"action": "error", "message": "sqlite_counts.py keeps its state in a directory of its own: run the worker with --state-dir, --backup-dir and --set state.kind=directory"})
                continue
            partition = msg["partition"]
            db = open_db(msg["state_dir"])
            send({"action": "ok"})
        elif action == "process":
            db.execute("BEGIN")
            for r in msg["records"]:
                key = base64.b64decode(r["key"]).decode() if r["key"] else "-"
                db.execute("INSERT INTO seen (record_offset) VALUES (?)", (r["offset"],))
                db.execute(
                    "INSERT INTO counts (key, n) VALUES (?, 1) "
                    "ON CONFLICT (key) DO UPDATE SET n = n + 1",
                    (key,),
                )
            db.execute("COMMIT")
            if lose_answer_here(partition, msg["records"]):
                os._exit(3)
            send({"action": "processed"})
        elif action in ("revoked", "shard_ended"):
            send({"action": "ok"})
        else:
            send({"action": "error", "message": "unknown action %r" % action})


if __name__ == "__main__":
    main()
