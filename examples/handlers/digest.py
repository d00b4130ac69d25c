#!/usr/bin/env python3
"""A shardcall handler in Python, speaking the line-delimited JSON protocol
(see crates/shardcall/src/exec.rs). Its state is the same order-sensitive
digest as the built-in reference handler: a record count and FNV-1a over
each record's offset (8 bytes, little endian) and value, so a run can be
checked against processing every record exactly once.

Run it with:  shardcall worker ... --exec "python3 examples/handlers/digest.py"

For the tests: if CRASH_AT_OFFSET is set, the process exits (once, marked by
the file CRASH_MARKER) when a batch holds that offset.
"""
import base64
import json
import os
import struct
import sys

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    count, digest = 0, 0
    crash_at = os.environ.get("CRASH_AT_OFFSET")
    marker = os.environ.get("CRASH_MARKER")
    for line in sys.stdin:
        msg = json.loads(line)
        action = msg.get("action")
        if action == "initialize":
            state = msg.get("state")
            if state:
                count, digest = struct.unpack("<QQ", base64.b64decode(state))
            else:
                count, digest = 0, 0
            answer({"action": "ok"})
        elif action == "process":
            records = msg["records"]
            if crash_at is not None and marker and not os.path.exists(marker):
                if any(r["offset"] == int(crash_at) for r in records):
                    open(marker, "w").close()
                    sys.exit(3)  # a crash in the middle of a batch
            for r in records:
                h = FNV_OFFSET if count == 0 else digest
                for b in struct.pack("<Q", r["offset"]) + base64.b64decode(r["value_b64"]):
                    h ^= b
                    h = (h * FNV_PRIME) & MASK
                digest = h
                count += 1
            answer({"action": "processed",
                    "state": base64.b64encode(struct.pack("<QQ", count, digest)).decode()})
        elif action in ("revoked", "shard_ended"):
            # The partition was released: back up here, then confirm.
            answer({"action": "ok"})
        else:
            answer({"action": "error", "message": "unknown action %r" % action})


if __name__ == "__main__":
    main()
