#!/usr/bin/env python3
"""A shardcall handler in Python with asyncio, for topics whose records run
by key (ordering = "key" in the worker's [ordering]): each record calls a
slow service, and many calls are out at once, so a slow call holds up its
own key and nothing else.

Each record's value may be JSON with "call_ms": how long its service call
takes (simulated with asyncio.sleep; CALL_MS in the environment sets a
default). The handler counts each key's records in the key's state, as
JSON {"count": n, "last": offset, "out_of_order": k}: a record that comes
after a later one of its key is counted in out_of_order, so a test can
check the order held and every record counted once.

The protocol (the worker's docs/exec.md): under ordering = "key" or
"none" each record comes alone with an id and its key's state, and the
answer names the id, in any order. Under ordering = "partition" records
come in batches, and the key's counts live in the partition's local state
store, read and written with get and put requests.

For tests, KEYED_COUNTS_REFUSE in the environment names a value prefix:
records whose value starts with it fail every time (a poison record).

Run it with:
  shardcall worker ... --state-dir S --backup-dir B \\
      --set ordering.default=key --exec "python3 examples/handlers/keyed_counts.py"
"""
import asyncio
import base64
import json
import os
import sys

DEFAULT_CALL_MS = float(os.environ.get("CALL_MS", "0"))
REFUSE = os.environ.get("KEYED_COUNTS_REFUSE")


def refused(record):
    """Whether the record is a poison record the test asked to fail."""
    return bool(REFUSE) and (record.get("value") or "").startswith(REFUSE)


def b64(raw):
    return base64.b64encode(raw).decode()


def call_ms(record):
    """How long the record's service call takes."""
    try:
        value = json.loads(record.get("value") or "")
        return float(value.get("call_ms", DEFAULT_CALL_MS))
    except (ValueError, AttributeError):
        return DEFAULT_CALL_MS


def counted(state, offset):
    """The key's state with the record at `offset` counted."""
    s = json.loads(state) if state else {"count": 0, "last": -1, "out_of_order": 0}
    if offset <= s["last"]:
        s["out_of_order"] += 1
    s["count"] += 1
    s["last"] = offset
    return json.dumps(s).encode()


class Handler:
    def __init__(self, reader):
        self.reader = reader

    def send(self, obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    async def receive(self):
        line = await self.reader.readline()
        if not line:
            return None
        return json.loads(line)

    async def record(self, msg):
        """One record of ordering = key: answered when its call is done,
        whatever came in since."""
        r = msg["record"]
        await asyncio.sleep(call_ms(r) / 1000)
        if refused(r):
            self.send({"action": "error", "id": msg["id"], "message": f"refused {r['value']!r}"})
            return
        state = msg.get("state")
        old = base64.b64decode(state) if state else None
        self.send({"action": "processed", "id": msg["id"], "state": b64(counted(old, r["offset"]))})

    async def batch(self, msg):
        """A batch of ordering = partition: one record after another, each
        key's counts in the local state store."""
        if not msg.get("store"):
            self.send({"action": "error", "message": "keyed_counts.py keeps its counts in a local state store: run the worker with --state-dir and --backup-dir"})
            return
        for r in msg["records"]:
            await asyncio.sleep(call_ms(r) / 1000)
            at = b"key/" + (base64.b64decode(r["key"]) if r["key"] else b"")
            self.send({"action": "get", "key": b64(at)})
            answer = await self.receive()
            value = answer.get("value") if answer else None
            old = base64.b64decode(value) if value else None
            self.send({"action": "put", "key": b64(at), "value": b64(counted(old, r["offset"]))})
        self.send({"action": "processed"})

    async def run(self):
        calls = set()
        while True:
            msg = await self.receive()
            if msg is None:
                return
            action = msg.get("action")
            if action == "record":
                call = asyncio.create_task(self.record(msg))
                calls.add(call)
                call.add_done_callback(calls.discard)
            elif action == "process":
                await self.batch(msg)
            elif action in ("initialize", "revoked", "shard_ended"):
                self.send({"action": "ok"})
            else:
                self.send({"action": "error", "message": f"unknown action {action!r}"})


async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await Handler(reader).run()


if __name__ == "__main__":
    asyncio.run(main())
