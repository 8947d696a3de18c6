"""The tamper-evident hash chain over the log.

Each event's hash covers the previous hash, its position, its topic and its
stored bytes, so editing, deleting, inserting or swapping any kept event
changes every hash from there on (as in QLDB journal digests or immudb).
"""

from __future__ import annotations

from hashlib import sha256

GENESIS = "0" * 64


def link(previous: str, position: int, topic: str, state: bytes) -> str:
    digest = sha256(previous.encode())
    digest.update(b"\n%d\n" % position)
    digest.update(topic.encode())
    digest.update(b"\n")
    digest.update(state)
    return digest.hexdigest()
