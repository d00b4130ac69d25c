#!/usr/bin/env python3
"""A shardcall handler in Python that keeps its state in the partition's
local state store (run the worker with --state-dir and --backup-dir), over
the line-delimited JSON protocol (see crates/shardcall/src/exec.rs).

It counts records per key ("count/KEY", 8 bytes little endian) and marks
each offset it processed ("seen/OFFSET"), so a test can check the state
holds every record exactly once. Finding an offset's mark already there
means the state already held that record: it says so on stderr and fails
the batch.

Run it with:  shardcall worker ... --state-dir S --backup-dir B --exec "python3 examples/handlers/counts.py"
"""
import base64
import json
import struct
import sys


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def receive():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


def b64(raw):
    return base64.b64encode(raw).decode()


def get(key):
    send({"action": "get", "key": b64(key)})
    answer = receive()
    value = answer.get("value")
    return None if value is None else base64.b64decode(value)


def put(key, value):
    send({"action": "put", "key": b64(key), "value": b64(value)})


def main():
    while True:
        msg = receive()
        action = msg.get("action")
        if action == "initialize":
            send({"action": "ok"})
        elif action == "process":
            if not msg.get("store"):
                send({"action": "error", "message": "counts.py keeps its state in a local state store: run the worker with --state-dir and --backup-dir"})
                continue
            counts = {}
            failed = None
            for r in msg["records"]:
                mark = b"seen/%020d" % r["offset"]
                if get(mark) is not None:
                    failed = "offset %d was already in the state" % r["offset"]
                    print(failed, file=sys.stderr, flush=True)
                    break
                put(mark, b"1")
                key = b"count/" + (base64.b64decode(r["key"]) if r["key"] else b"-")
                if key not in counts:
                    stored = get(key)
                    counts[key] = struct.unpack("<Q", stored)[0] if stored else 0
                counts[key] += 1
            if failed:
                send({"action": "error", "message": failed})
                continue
            for key, n in counts.items():
                put(key, struct.pack("<Q", n))
            send({"action": "processed"})
        elif action in ("revoked", "shard_ended"):
            send({"action": "ok"})
        else:
            send({"action": "error", "message": "unknown action %r" % action})


if __name__ == "__main__":
    main()
