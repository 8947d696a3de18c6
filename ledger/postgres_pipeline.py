"""PostgreSQL transactions in pipeline mode that leave the server's
idle-in-transaction timer running: a client stopped inside one (SIGSTOP, a
machine cut off) has its session ended by the server, and its locks (the
log's) let go, instead of holding them until it resumes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.generators import send


class SyncingCursor(psycopg.Cursor[Any]):
    """A cursor whose reads in a pipeline end it with a Sync, where psycopg's
    own send a Flush (one round trip either way).

    After a Flush the server waits for the next statement *active*, and
    PostgreSQL (15) runs no timer there: ``statement_timeout`` stops when each
    statement completes, the idle timer starts only at a Sync. A writer
    stopped between two reads held its transaction, and the log's lock, until
    it resumed. After a Sync the server waits *idle in transaction*, and
    ``idle_in_transaction_session_timeout`` ends a session whose client stopped
    (SIGSTOP, a machine cut off). (psycopg has no public switch: this replaces
    the one step that sends the Flush. A Sync after every statement would
    close the rest of the gap, but psycopg hands results that come back
    before they are read to the cursor's next statement.)"""

    def _fetch_pipeline(self) -> None:
        pipeline = self._conn._pipeline
        if (
            isinstance(pipeline, psycopg.Pipeline)
            and self._execmany_returning is not False
            and not self.pgresult
        ):
            synced(self._conn, pipeline)


def synced(connection: psycopg.Connection[Any], pipeline: psycopg.Pipeline) -> None:
    """``pipeline.sync()``, once what the pipeline holds is sent whole.

    psycopg's (3.3.9) sync stops sending once its queue of commands is
    empty, whatever libpq's buffer still holds, and then waits for results:
    a statement larger than the socket takes in a few writes (a replay's
    write of 40 rejected 1 MiB events, 50 MB of text alone) was left half
    sent, and the server waited for its rest (ClientRead) as long as the
    client waited for its answer. Sent first, only the Sync is left to it."""
    with connection.lock:
        connection.wait(send(connection.pgconn))
    pipeline.sync()


class _Pipelined:
    """A transaction in pipeline mode: BEGIN goes with its first statements,
    COMMIT (or ROLLBACK) with a Sync.

    Not psycopg's ``transaction()``, which in a pipeline ends with a Sync,
    then a Flush, then COMMIT: PostgreSQL stops the idle-in-transaction timer
    when the Flush arrives and starts it again only at the next Sync, so a
    client stopped before its COMMIT held the transaction, and the log's
    lock, until it resumed. Here the server waits for the client inside the
    transaction after a Sync (``SyncingCursor``), or for as long as the client
    takes between two statements."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection
        self.committed = False

    def commit(self) -> None:
        """Send the COMMIT now (the server commits when it arrives); its
        answer is read when the transaction ends. ``committed`` from the
        moment it is being sent: from then on a connection lost may have
        left the transaction committed."""
        if not self.committed:
            self.committed = True
            self.connection.execute("COMMIT")

    @classmethod
    @contextmanager
    def begin(cls, connection: psycopg.Connection[Any]) -> Iterator[_Pipelined]:
        with connection.pipeline() as pipeline:
            transaction = cls(connection)
            connection.execute("BEGIN")
            try:
                yield transaction
                transaction.commit()
                synced(connection, pipeline)
            except BaseException:
                with suppress(psycopg.Error):  # the server skips what follows an error until a Sync
                    synced(connection, pipeline)
                with suppress(psycopg.Error):  # a connection lost is rolled back by the server
                    connection.execute("ROLLBACK")
                    synced(connection, pipeline)
                raise
