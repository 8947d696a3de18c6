"""The tamper-evident hash chain over the log.

Each event's hash covers the previous hash, its position, its topic and its
stored bytes, so editing, deleting, inserting or swapping any kept event
changes every hash from there on (as in QLDB journal digests or immudb).
"""

from __future__ import annotations

from hashlib import sha256

GENESIS = "0" * 64


def link(previous: str, position: int, topic: str, state: bytes) -> str:
    return sha256(b"%s\n%d\n%s\n%s" % (previous.encode(), position, topic.encode(), state)).hexdigest()
