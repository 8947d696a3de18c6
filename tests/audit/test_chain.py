"""The tamper-evident log: an attacker with access to the database files
drops the append-only guards and edits, deletes, inserts and swaps stored
events and chain hashes. ``verify`` names the first position that no longer
matches; a digest kept elsewhere catches even an attacker who recomputes the
whole chain or cuts the log short."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from hashlib import sha256
from typing import Any
from urllib.parse import urlsplit

import pytest
from audit_support import (
    CLI,
    Attack,
    Attacker,
    StoreUnderTest,
    history,
    one_line_error,
    run,
    texts,
)
from cli_support import bound_by_file_modes

from ledger import chain
from ledger.application import Ledger
from ledger.chain import GENESIS, Digest, current_digest, verify
from ledger.errors import PositionMissing
from ledger.store import Store
from projections.asof import AsOf, rebuild

TRIALS = {"sqlite": 60, "postgresql": 40}


def tamper(
    attacker: Attacker, rng: random.Random, head: int, applied: int
) -> tuple[str, int | None, int]:
    """One random tampering: (what was done, the first position plain
    ``verify`` must name or None when only a digest can tell, the position a
    digest of the untouched head must name). A cut tail is named by plain
    ``verify`` where the projection tables applied past it (``applied``)."""
    kind = rng.choice(
        ["edit", "delete", "insert", "swap", "drop_hash", "extra_hash", "edit_hash",
         "rewrite", "truncate"]
    )
    position = rng.randint(1, head)
    if kind == "edit":
        attacker.edit(position, rng)
    elif kind == "delete":
        attacker.delete(position)
    elif kind == "insert":
        attacker.insert(position)
    elif kind == "swap":
        first, second = sorted(rng.sample(range(1, head + 1), 2))
        attacker.swap(first, second)
        return f"swap {first} and {second}", first, first
    elif kind == "drop_hash":
        attacker.drop_hash(position)
    elif kind == "extra_hash":
        position = head + rng.randint(1, 3)
        attacker.extra_hash(position)
        return f"extra hash at {position}", position, position
    elif kind == "edit_hash":
        attacker.edit_hash(position)
    elif kind == "rewrite":
        attacker.rewrite(position, rng)
        return f"rewrite from {position}", None, head
    else:
        count = rng.randint(1, 5)
        attacker.truncate(count)
        cut = head - count + 1
        return f"truncate {count}", cut if applied >= cut else None, cut
    return f"{kind} {position}", position, position


def test_an_untouched_log_verifies_and_extends_every_earlier_digest(
    ledger_log: tuple[StoreUnderTest, Store],
) -> None:
    target, store = ledger_log
    early = current_digest(store)
    assert early.position == 240
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(300, nodes=8)[240:]), batch=25))

    checked = verify(store, early)
    assert checked.ok, checked
    assert (checked.head, checked.verified) == (300, 300)

    shown = run("digest", url=target.url)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.decode().strip() == str(current_digest(store))
    for saved in (str(early), shown.stdout.decode().strip(), f"0:{GENESIS}"):
        proof = run("verify", "--digest", saved, url=target.url)
        assert proof.returncode == 0, proof.stderr


def test_an_empty_log_verifies_and_its_digest_is_genesis(under_test: StoreUnderTest) -> None:
    Ledger.open(under_test.url).close()  # a ledger with nothing submitted yet
    shown = run("digest", url=under_test.url)
    assert (shown.returncode, shown.stdout.decode().strip()) == (0, f"0:{GENESIS}"), shown.stderr
    assert run("verify", url=under_test.url).returncode == 0


def test_random_tampering_is_always_detected_at_the_first_changed_position(
    attack: Attack,
) -> None:
    target, store, digest, attacker = attack.target, attack.store, attack.digest, attack.attacker
    attacker.keep()
    with store.reading() as cursor:
        applied = store.known_end(cursor)[1]  # what the projection tables have applied
    rng = random.Random(20260101)
    missed = []
    for trial in range(TRIALS[target.dialect]):
        attacker.restore()
        what, plain, with_digest = tamper(attacker, rng, digest.position, applied)
        found = verify(store)
        if plain is None:
            if not found.ok:
                missed.append(f"{trial}: {what}: plain verify should pass, got {found.problem}")
        elif found.ok or found.position != plain:
            missed.append(f"{trial}: {what}: expected position {plain}, got {found.as_dict()}")
        elif found.verified != min(plain - 1, digest.position):
            missed.append(f"{trial}: {what}: verified up to {found.verified}, not {plain - 1}")
        proved = verify(store, digest)
        if proved.ok or proved.position != with_digest:
            missed.append(
                f"{trial}: {what}: digest should fail at {with_digest}, got {proved.as_dict()}"
            )
        elif proved.verified >= with_digest:  # what is verified ends before what failed
            missed.append(f"{trial}: {what}: with the digest, verified up to {proved.verified}")
    assert not missed, "\n".join(missed)
    attacker.restore()
    assert verify(store, digest).ok


def test_verify_names_the_position_on_one_line_and_exits_1(attack: Attack) -> None:
    target, digest, attacker = attack.target, attack.digest, attack.attacker
    attacker.edit(57, random.Random(3))

    checked = run("verify", url=target.url)
    assert checked.returncode == 1, checked.stderr
    line = one_line_error(checked.stderr)
    assert "position 57" in line and "does not match its chain hash" in line

    attacker.rewrite(57, random.Random(3))
    assert run("verify", url=target.url).returncode == 0
    proved = run("verify", "--digest", str(digest), url=target.url)
    assert proved.returncode == 1
    assert f"no longer extends digest {digest}" in one_line_error(proved.stderr)


def test_a_digest_beyond_the_log_proves_it_was_cut_short(attack: Attack) -> None:
    attack.attacker.truncate(3)
    proved = run("verify", "--digest", str(attack.digest), url=attack.target.url)
    assert proved.returncode == 1
    assert one_line_error(proved.stderr).endswith(
        "the log ends at position 237, before the digest's position 240: events after 237 "
        "were removed, or the digest is of another ledger"
    )


def test_a_deleted_event_is_named_by_every_replay_not_only_verify(attack: Attack) -> None:
    """Positions are gapless: a replay that finds one missing says so, rather
    than replaying what is left as if it were the whole history; also one
    that asks for the very position deleted (the log read up to 120 ends at
    119 there)."""
    attack.attacker.delete(120)

    for command in (
        ["replay"], ["audit"], ["query", "nodes", "--as-of", "200"],
        ["query", "nodes", "--as-of", "120"], ["replay", "--to", "120"],
        ["replay", "--to", "200"],
    ):
        done = run(*command, url=attack.target.url)
        assert done.returncode == 1, (command, done.stderr)
        assert one_line_error(done.stderr) == (
            "Error: position 120 is missing from the log (the next kept event is at 121); "
            "alloc-ledger verify checks whether the log was edited"
        ), command


def test_a_deleted_event_under_a_checkpoint_is_named_by_an_as_of_query_past_it(
    attack: Attack,
) -> None:
    """An as-of replay starts at the nearest checkpoint, which was kept before
    position 120 was deleted: the log under it is counted, and the replay
    from the start names the gap (helper-407: the answer came, exit 0)."""
    store = attack.store
    rebuild(store, AsOf(position=200), every=50)  # checkpoints at 50 .. 200
    attack.attacker.drop_guards()  # again: keeping them may have put them back
    attack.attacker.delete(120)

    done = run("query", "nodes", "--as-of", "230", url=attack.target.url)

    assert done.returncode == 1, done.stderr
    assert one_line_error(done.stderr) == (
        "Error: position 120 is missing from the log (the next kept event is at 121); "
        "alloc-ledger verify checks whether the log was edited")


def test_a_deleted_last_event_is_named_by_a_replay_of_the_tables_that_applied_it(
    attack: Attack,
) -> None:
    """The tables have applied 240 events; a log that now ends at 239 cannot
    be replayed to them: not a replay of 239 events reported as 240."""
    assert run("project", url=attack.target.url).returncode == 0  # PostgreSQL's tables too
    attack.attacker.drop_guards()  # again: opening the store put them back
    attack.attacker.delete(240)

    attack.attacker.drop_hash(240)  # its chain hash too: only the tables still tell

    done = run("replay", url=attack.target.url)

    assert done.returncode == 1, done.stderr
    assert one_line_error(done.stderr) == (
        "Error: the log ends at position 239, before position 240, which the projection tables "
        "have applied: its last events were deleted (or the tracking row was raised by hand: "
        "alloc-ledger replay --repair sets it to the log's head); alloc-ledger verify checks "
        "whether the log was edited"
    )


@pytest.mark.parametrize("command", [
    ["audit"], ["query", "nodes", "--as-of", "240"], ["query", "nodes", "--as-of", "500"],
    ["query", "zombie-slots", "--as-of", "9999-12-31T23:59:59Z"],
])
def test_a_deleted_last_event_is_named_by_the_audit_and_as_of_queries_at_the_head(
    attack: Attack, command: list[str],
) -> None:
    """Not a report or a state "at the head" that quietly leaves out an
    event whose chain hash is kept (or, that gone too, which the projection
    tables have applied)."""
    assert run("project", url=attack.target.url).returncode == 0
    attack.attacker.drop_guards()
    attack.attacker.delete(240)

    done = run(*command, url=attack.target.url)

    assert done.returncode == 1, done.stderr
    assert not done.stdout
    assert one_line_error(done.stderr) == (
        "Error: the log ends at position 239, before position 240, whose chain hash is kept: its "
        "last events were deleted; alloc-ledger verify checks whether the log was edited"
    ), command
    attack.attacker.drop_guards()  # again: opening the store put them back
    attack.attacker.drop_hash(240)
    done = run(*command, url=attack.target.url)
    assert one_line_error(done.stderr).startswith(
        "Error: the log ends at position 239, before position 240, which the projection tables "
        "have applied: its last events were deleted (or the tracking row was raised by hand"
    ), command


@pytest.mark.parametrize("command", [["audit", "--to", "239"], ["query", "nodes", "--as-of", "239"]])
def test_history_before_a_deleted_last_event_is_still_answered(
    attack: Attack, command: list[str],
) -> None:
    assert run("project", url=attack.target.url).returncode == 0
    attack.attacker.drop_guards()
    attack.attacker.delete(240)

    done = run(*command, "--format", "json", url=attack.target.url)

    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    if command[0] == "audit":
        assert (answer["to"], answer["head"]) == (239, 239)
    else:
        assert answer and all(row["since_position"] <= 239 for row in answer)


@pytest.mark.parametrize("point", [AsOf(at="9999-12-31T23:59:59.000000Z"), AsOf(position=200),
                                   None])
def test_a_deleted_event_where_a_replay_pauses_for_a_checkpoint_is_named(
    attack: Attack, point: AsOf | None,
) -> None:
    """A replay reads the log in stretches that end where checkpoints are
    kept: one whose stretch ends at the event deleted is not the log's end."""
    attack.attacker.delete(120)

    with pytest.raises(PositionMissing, match="^position 120 is missing from the log "
                                              r"\(the next kept event is at 121\)"):
        rebuild(attack.store, point, every=120)


def test_an_event_appended_without_its_chain_hash_never_reaches_the_tables(
    attack: Attack,
) -> None:
    """The ledger appends an event and its chain hash in one transaction: an
    event without one was written by something else, and a query that
    catches the tables up (on SQLite every query; on PostgreSQL ``--wait``
    and ``project``) refuses it instead of taking it as history."""
    assert run("project", url=attack.target.url).returncode == 0
    forged = attack.attacker.append_unchained(
        {"type": "node-registered", "node": "evil", "slots": 1, "at": "2026-06-01T00:00:00.000000Z"})
    attack.attacker.append_unchained(  # the first without a hash is named
        {"type": "heartbeat", "node": "evil", "at": "2026-06-01T00:00:01.000000Z"})

    for command in (["query", "nodes", "--wait"], ["project"]):
        done = run(*command, url=attack.target.url)
        assert done.returncode == 1, (command, done.stderr)
        assert one_line_error(done.stderr) == (
            f"Error: the kept event at position {forged} has no chain hash: alloc-ledger did not "
            "append it (something wrote it into the log), so the projection tables do not take "
            "it; alloc-ledger verify checks the log"
        ), command
    assert attack.attacker.sql("SELECT count(*) FROM nodes WHERE node = 'evil'") == [(0,)]
    with attack.store.reading() as cursor:
        assert attack.store.tracked(cursor) == forged - 1


def kept_hash(attack: Attack, position: int) -> str:
    return str(attack.attacker.sql(
        "SELECT hash FROM event_hashes WHERE position = ?", (position,))[0][0])


def client_id(attack: Attack, position: int) -> str:
    return str(json.loads(attack.attacker.event(position)[1])["event"]["id"])


@pytest.mark.parametrize(("edit", "problem"), [
    ("DELETE FROM event_ids WHERE id = ?", "but event_ids does not hold it"),
    ("UPDATE event_ids SET position = 7 WHERE id = ?", "but event_ids holds it for position 7"),
])
def test_verify_names_an_event_whose_client_id_the_index_lost_or_moved(
    attack: Attack, edit: str, problem: str
) -> None:
    """Without its row in event_ids, a retry with the same id would append
    the event a second time."""
    client = client_id(attack, 50)
    attack.attacker.sql(edit, (client,))

    checked = run("verify", url=attack.target.url)

    assert checked.returncode == 1
    assert one_line_error(checked.stderr) == (
        f"Error: verify failed at position 50: the event at position 50 has id '{client}', "
        f"{problem} (a retry with that id would not be answered duplicate of it)"
    )


def test_a_retry_whose_id_the_index_places_where_the_log_has_nothing_fails_naming_it(
    attack: Attack,
) -> None:
    """Answering duplicate would drop the event; answering as new would use
    the id twice: the damage is named instead, and nothing is appended."""
    client = client_id(attack, 50)
    attack.attacker.sql("UPDATE event_ids SET position = 99999 WHERE id = ?", (client,))

    retried = run("submit", "heartbeat", "--node", "n1", "--id", client, url=attack.target.url)

    assert retried.returncode == 1, retried.stderr
    assert one_line_error(retried.stderr) == (
        f"Error: the client-id index names position 99999 for id '{client}', which the log "
        "lacks; alloc-ledger verify checks whether the log was edited")
    assert retried.stdout == b""


def test_an_id_problem_before_a_chain_break_is_named_first(
    attack: Attack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids are looked up a page at a time; a break of the chain later in the
    page does not hide an id lost earlier."""
    monkeypatch.setattr(chain, "PAGE", 50)
    attack.attacker.sql("DELETE FROM event_ids WHERE id = ?", (client_id(attack, 10),))
    attack.attacker.edit(20, random.Random(1))

    found = verify(attack.store)

    assert (found.position, found.verified, found.hash) == (10, 9, kept_hash(attack, 9))
    assert found.problem is not None and "but event_ids does not hold it" in found.problem


def test_what_is_verified_ends_before_an_id_problem_found_a_page_later(
    attack: Attack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chain is walked ahead of the id lookups, a page at a time."""
    monkeypatch.setattr(chain, "PAGE", 50)
    attack.attacker.sql("DELETE FROM event_ids WHERE id = ?", (client_id(attack, 30),))

    found = verify(attack.store)

    assert (found.position, found.verified, found.hash) == (30, 29, kept_hash(attack, 29))


@pytest.mark.parametrize(("column", "problem"), [
    ("topic", "has no topic (edited)"),
    ("state", "does not match its chain hash (edited, inserted, moved, or its hash altered)"),
])
def test_an_event_without_topic_or_state_is_named_by_position(
    attack: Attack, column: str, problem: str
) -> None:
    attack.attacker.sql(
        f"UPDATE {attack.attacker.events} SET {column} = NULL WHERE originator_version = 40")

    checked = run("verify", url=attack.target.url)

    assert checked.returncode == 1, checked.stderr
    assert one_line_error(checked.stderr) == (
        f"Error: verify failed at position 40: the event at position 40 {problem}")


def test_verify_names_ids_in_the_index_that_no_kept_event_has(attack: Attack) -> None:
    attack.attacker.sql("INSERT INTO event_ids (id, position) VALUES ('forged', 3)")

    checked = run("verify", url=attack.target.url)

    assert checked.returncode == 1
    assert one_line_error(checked.stderr) == (
        "Error: verify failed: event_ids holds 1 id(s) that no kept event has ('forged' for "
        "position 3, first)")


@pytest.mark.parametrize("position", [0, -1])
def test_verify_names_rows_inserted_before_position_1_and_history_leaves_them_out(
    attack: Attack, position: int
) -> None:
    """An INSERT is not refused: a forged rejection of a1 at position 0
    passed verify and showed in a1's history."""
    table, head = attack.attacker.events, attack.attacker.head()
    node = json.loads(attack.attacker.event(1)[1])["event"]["node"]
    attack.attacker.sql(
        f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
        f"SELECT originator_id, {position}, topic, state FROM {table} WHERE originator_version = 1")

    checked = run("verify", url=attack.target.url)

    assert checked.returncode == 1
    assert one_line_error(checked.stderr) == (
        "Error: verify failed: stored_events holds 1 row(s) besides the log's positions 1 to "
        f"{head} (the lowest at position {position}): inserted by hand")
    shown = run("query", "history", node, "--format", "json", url=attack.target.url)
    assert shown.returncode == 0, shown.stderr
    assert position not in [row["position"] for row in json.loads(shown.stdout)]


def test_verify_names_the_first_id_no_kept_event_has_a_few_pages_on(
    attack: Attack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chain, "PAGE", 50)
    attack.attacker.sql("INSERT INTO event_ids (id, position) VALUES ('forged-2', 180)")
    attack.attacker.sql("INSERT INTO event_ids (id, position) VALUES ('forged-1', 120)")

    found = verify(attack.store)

    assert found.position is None
    assert found.problem == (
        "event_ids holds 2 id(s) that no kept event has ('forged-1' for position 120, first)")


def test_verify_names_an_id_kept_for_a_position_that_is_no_number(
    sqlite_under_test: Any,
) -> None:
    """SQLite takes text in an INTEGER column: not an internal error."""
    attacker = simulated_and_unguarded(sqlite_under_test, 60)
    attacker.sql("INSERT INTO event_ids (id, position) VALUES ('forged', 'abc')")

    checked = run("verify", url=sqlite_under_test.url)

    assert checked.returncode == 1
    assert one_line_error(checked.stderr) == (
        "Error: verify failed: event_ids holds 1 id(s) that no kept event has ('forged' for "
        "position abc, first)")


def test_verify_names_a_row_kept_under_another_stream(attack: Attack) -> None:
    other = "'another-stream'" if attack.target.dialect == "sqlite" else "gen_random_uuid()"
    table, head = attack.attacker.events, attack.attacker.head()
    attack.attacker.sql(
        f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
        f"SELECT {other}, 7, topic, state FROM {table} WHERE originator_version = 7")

    found = verify(attack.store)

    assert (found.position, found.problem) == (None, (
        f"stored_events holds 1 row(s) besides the log's positions 1 to {head} (the lowest at "
        "position 7): inserted by hand"))


@pytest.mark.parametrize("position", [120, 0])  # 0: the empty log's digest is the genesis hash
def test_a_digest_for_another_history_does_not_verify(
    ledger_log: tuple[StoreUnderTest, Store], position: int
) -> None:
    target, store = ledger_log
    forged = Digest(position, "ef" * 32)
    assert not verify(store, forged).ok
    refused = run("verify", "--digest", str(forged), url=target.url)
    assert refused.returncode == 1
    line = one_line_error(refused.stderr)
    assert f"no longer extends digest {forged}" in line
    assert line.endswith("(the log was rewritten up to there, or the digest is of another "
                         "ledger)"), line


@pytest.mark.parametrize("position", [0, -3])
def test_a_chain_hash_below_position_1_is_named_where_it_is(attack: Attack, position: int) -> None:
    attack.attacker.extra_hash(position)

    found = verify(attack.store)

    assert (found.ok, found.position) == (False, position)
    assert f"position {position} has a chain hash but no event" in found.problem


@pytest.mark.parametrize("text", ["12", "12:abc", "x:" + "a" * 64, "-1:" + "a" * 64,
                                  "\u0663:" + "a" * 64])
def test_a_malformed_digest_is_a_usage_error(text: str, sqlite_under_test: Any) -> None:
    refused = run("verify", "--digest", text, url=sqlite_under_test.url)
    assert refused.returncode == 2
    assert "is not a digest" in refused.stderr.decode()


@pytest.mark.parametrize("text", ["12:" + "AB" * 32, " 12:" + "aB" * 32 + "\n"])
def test_a_digest_is_read_whatever_the_case_of_its_hex_and_the_space_around_it(text: str) -> None:
    """As copied from a terminal, a note or a tool that prints hex in capitals."""
    assert Digest.parse(text) == Digest(12, "ab" * 32)


def simulated_and_unguarded(target: StoreUnderTest, events: int) -> Attacker:
    """A simulated history of ``events`` on 4 nodes, its guards dropped."""
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(events, nodes=4)), batch=20))
    attacker = Attacker(target)
    attacker.drop_guards()
    return attacker


@pytest.mark.parametrize(("edit", "kind"), [
    # SQLite's replace() returns TEXT: the natural edit changes the column's type too
    ("replace(state, '\"at\"', '\"at\" ')", "text"),
    ("NULL", "null"),
    ("x'7b7d'", "blob"),  # {}: JSON, but not a kept event
])
def test_an_edited_state_is_named_by_position_not_an_internal_error(
    sqlite_under_test: Any, edit: str, kind: str
) -> None:
    attacker = simulated_and_unguarded(sqlite_under_test, 60)
    attacker.sql(f"UPDATE stored_events SET state = {edit} WHERE originator_version = 14")
    assert attacker.sql("SELECT typeof(state) FROM stored_events WHERE originator_version = 14") == [
        (kind,)
    ]

    checked = run("verify", url=sqlite_under_test.url)
    assert checked.returncode == 1, checked.stderr
    line = one_line_error(checked.stderr)
    assert "position 14" in line and "does not match its chain hash" in line
    for command in (["replay"], ["query", "nodes", "--as-of", "20"], ["audit"]):
        replayed = run(*command, url=sqlite_under_test.url)
        if kind == "text":  # the same bytes as kept, but for one space: still JSON, replays
            continue
        assert replayed.returncode == 1, (command, replayed.stderr)
        assert one_line_error(replayed.stderr) == (
            "Error: the kept event at position 14 cannot be read: "
            + ("its stored state is empty" if kind == "null" else "its stored JSON holds no event")
            + "; alloc-ledger verify checks whether the log was edited"), command


def test_an_event_of_an_edited_type_is_named_by_every_replay_and_the_audit(
    sqlite_under_test: Any,
) -> None:
    attacker = simulated_and_unguarded(sqlite_under_test, 60)
    attacker.sql("UPDATE stored_events SET state = CAST(replace(CAST(state AS TEXT), "
                 "'\"type\":\"', '\"type\":\"bogus-') AS BLOB) WHERE originator_version = 14")
    kind = json.loads(attacker.event(14)[1])["event"]["type"]
    assert kind.startswith("bogus-")

    for command in (["replay"], ["query", "nodes", "--as-of", "20"], ["audit"]):
        replayed = run(*command, url=sqlite_under_test.url)
        assert replayed.returncode == 1, (command, replayed.stderr)
        assert one_line_error(replayed.stderr) == (
            f"Error: the kept event at position 14 cannot be read: unknown event type '{kind}'; "
            "alloc-ledger verify checks whether the log was edited"), command


def test_a_slot_edited_below_0_is_named_by_every_replay_and_the_audit(
    sqlite_under_test: Any,
) -> None:
    """Not read as a slot counted from the end (Python's -3 of 4 is slot 1)."""
    attacker = simulated_and_unguarded(sqlite_under_test, 300)
    position, state = attacker.sql(
        "SELECT originator_version, CAST(state AS TEXT) FROM stored_events WHERE topic = "
        "'alloc-placed' AND CAST(state AS TEXT) LIKE '%\"slot\":%' ORDER BY originator_version LIMIT 1")[0]
    event = json.loads(state)["event"]
    attacker.sql("UPDATE stored_events SET state = CAST(replace(CAST(state AS TEXT), ?, ?) "
                 "AS BLOB) WHERE originator_version = ?",
                 (f'"slot":{event["slot"]}', '"slot":-3', position))

    for command in (["replay"], ["query", "nodes", "--as-of", str(position)], ["audit"]):
        replayed = run(*command, url=sqlite_under_test.url)
        assert replayed.returncode == 1, (command, replayed.stderr)
        line = one_line_error(replayed.stderr)
        assert line.startswith(
            f"Error: the kept event at position {position} was appended, but replaying the log "
            f"refuses it (slot {event['node']}#-3 is out of range"), (command, line)


@pytest.mark.parametrize("where", ["head", "before the head"])
def test_digest_refuses_a_head_whose_kept_hash_does_not_follow(attack: Attack, where: str) -> None:
    """A digest saved elsewhere must be one the log can match: the last link is checked."""
    head = attack.attacker.head()
    assert run("digest", url=attack.target.url).returncode == 0
    attack.attacker.drop_guards()  # again: opening the store put them back
    attack.attacker.edit_hash(head if where == "head" else head - 1)

    printed = run("digest", url=attack.target.url)

    assert printed.returncode == 1
    assert one_line_error(printed.stderr) == (
        f"Error: the chain hash kept for position {head} does not follow from the event there "
        "and the hash before it; run `alloc-ledger verify` to see where the log was tampered with")


@pytest.mark.parametrize("where", ["head", "before the head"])
def test_digest_names_the_position_whose_chain_hash_is_gone(attack: Attack, where: str) -> None:
    """No digest of a head whose last link cannot be checked; the error names
    the position that lacks its hash, the head's or the one before it."""
    head = attack.attacker.head()
    assert run("digest", url=attack.target.url).returncode == 0
    attack.attacker.drop_guards()  # again: opening the store put them back
    lacking = head if where == "head" else head - 1
    attack.attacker.drop_hash(lacking)

    printed = run("digest", url=attack.target.url)

    assert printed.returncode == 1
    assert one_line_error(printed.stderr) == (
        f"Error: position {lacking} has no chain hash; run `alloc-ledger verify` to see where "
        "the log was tampered with")


def test_verify_says_a_chain_hash_is_missing_rather_than_that_the_event_was_edited(
    attack: Attack,
) -> None:
    """A chain hash deleted from the middle of the log: the event there is
    as kept, and verify says what is missing, not that it was edited."""
    attack.attacker.drop_hash(57)

    found = verify(attack.store)

    assert (found.position, found.verified) == (57, 56)
    assert found.problem == "position 57 has no chain hash"


# How a DBA takes a guard away by hand "to fix a row": on PostgreSQL every
# trigger runs one function, which can be dropped (with its triggers) or
# replaced, and a trigger can be disabled rather than dropped; on SQLite a
# trigger can be replaced under its name by one that refuses nothing.
UNGUARDING = {
    "every guard dropped": ("sqlite", "postgresql"),
    "its update guard dropped": ("sqlite", "postgresql"),
    "its update guard replaced": ("sqlite",),
    "its guards disabled": ("postgresql",),
    "its update guard made to fire only for replicas": ("postgresql",),
    "its update guard given a condition": ("postgresql",),
    "its update guard narrowed to deletes": ("postgresql",),
    "its update guard narrowed to another column": ("postgresql",),
    "the guards' function dropped": ("postgresql",),
    "the guards' function replaced": ("postgresql",),
}
UNCHANGED = {"stored_events": "topic", "event_hashes": "hash", "event_ids": "position"}
OTHER_COLUMN = {"stored_events": "state", "event_hashes": "position", "event_ids": "id"}


def unguard(attacker: Attacker, how: str, table: str) -> None:
    sqlite = attacker.target.dialect == "sqlite"
    if how == "every guard dropped":
        attacker.drop_guards()
    elif how == "its update guard dropped":
        attacker.sql(f"DROP TRIGGER {table}_append_only_update" if sqlite else
                     f"DROP TRIGGER {table}_append_only ON {table}")
    elif how == "its update guard replaced":
        attacker.sql(f"DROP TRIGGER {table}_append_only_update")
        attacker.sql(f"CREATE TRIGGER {table}_append_only_update BEFORE UPDATE ON {table} "
                     "BEGIN SELECT 1; END")
    elif how == "its guards disabled":
        attacker.sql(f"ALTER TABLE {table} DISABLE TRIGGER USER")
    elif how == "its update guard made to fire only for replicas":
        attacker.sql(f"ALTER TABLE {table} ENABLE REPLICA TRIGGER {table}_append_only")
    elif how.startswith("its update guard "):  # replaced under its name, refusing less
        fires = {"its update guard given a condition": "UPDATE OR DELETE",
                 "its update guard narrowed to deletes": "DELETE",
                 "its update guard narrowed to another column":
                     f"UPDATE OF {OTHER_COLUMN[table]} OR DELETE"}[how]
        when = "WHEN (false) " if how.endswith("condition") else ""
        attacker.sql(f"CREATE OR REPLACE TRIGGER {table}_append_only BEFORE {fires} ON {table} "
                     f"FOR EACH ROW {when}EXECUTE FUNCTION refuse_change()")
    elif how == "the guards' function dropped":
        attacker.sql("DROP FUNCTION refuse_change() CASCADE")
    else:
        attacker.sql("CREATE OR REPLACE FUNCTION refuse_change() RETURNS trigger "
                     "LANGUAGE plpgsql AS $$ BEGIN RETURN COALESCE(NEW, OLD); END $$")


def refused(target: StoreUnderTest) -> type[Exception]:
    """What the database raises for a statement a guard refuses."""
    if target.dialect == "sqlite":
        return sqlite3.IntegrityError
    import psycopg

    return psycopg.errors.InsufficientPrivilege


@pytest.mark.parametrize("table", ["stored_events", "event_hashes", "event_ids"])
@pytest.mark.parametrize(("dialect", "how"), [
    pytest.param(dialect, how, marks=[pytest.mark.postgres] if dialect == "postgresql" else [])
    for how, dialects in UNGUARDING.items() for dialect in dialects
])
def test_guards_taken_away_by_hand_are_made_again_when_the_store_is_next_opened(
    request: pytest.FixtureRequest, dialect: str, how: str, table: str,
) -> None:
    """A DBA who drops a trigger to "fix a row" does not leave the log
    unguarded: the next command that opens the store guards it again, and
    the log, untouched, still verifies."""
    target = request.getfixturevalue("sqlite_under_test" if dialect == "sqlite" else "pg_under_test")
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(20, nodes=4)), batch=20))
    attacker = Attacker(target)
    unchanged = f"UPDATE {table} SET {UNCHANGED[table]} = {UNCHANGED[table]}"
    with pytest.raises(refused(target), match="the event log is append-only"):
        attacker.sql(unchanged)
    unguard(attacker, how, table)
    attacker.sql(unchanged)  # unguarded: let through

    assert run("query", "nodes", url=target.url).returncode == 0

    for statement in (unchanged, f"DELETE FROM {table}",
                      *([f"TRUNCATE {table}"] if dialect == "postgresql" else [])):
        with pytest.raises(refused(target), match="the event log is append-only"):
            attacker.sql(statement)
    checked = run("verify", url=target.url)
    assert checked.returncode == 0, checked.stderr


LOG = ("stored_events", "event_hashes", "event_ids")


def lacking(dialect: str, how: str, table: str) -> list[str]:
    """What ``verify`` names of the guards once ``unguard`` took them away."""
    if dialect == "sqlite":
        every = [f"{t}_append_only_{op}" for t in LOG for op in ("update", "delete")]
        return {
            "every guard dropped": [f"{name}: missing" for name in every],
            "its update guard dropped": [f"{table}_append_only_update: missing"],
            "its update guard replaced": [f"{table}_append_only_update: altered"],
        }[how]
    triggers = [f"{t}_{kind}" for t in LOG for kind in ("append_only", "no_truncate")]
    if how == "every guard dropped":
        return [f"{name}: missing" for name in triggers]
    if how == "the guards' function dropped":  # with its triggers
        return ["refuse_change(): missing", *(f"{name}: missing" for name in triggers)]
    if how == "the guards' function replaced":
        return ["refuse_change(): altered"]
    if how == "its guards disabled":
        return [f"{table}_append_only: disabled", f"{table}_no_truncate: disabled"]
    state = {"its update guard dropped": "missing",
             "its update guard made to fire only for replicas": "disabled"}.get(how, "altered")
    return [f"{table}_append_only: {state}"]


def verified_where_guards_cannot_be_made(target: StoreUnderTest) -> subprocess.CompletedProcess[bytes]:
    """``verify`` run by someone whose open does not make the guards again: on
    SQLite a user who may not write the file, on PostgreSQL a role that may
    read the log but does not own its tables."""
    if target.dialect == "sqlite":
        assert target.path is not None
        target.path.chmod(0o444)
        try:
            return subprocess.run(bound_by_file_modes(  # noqa: PLW1510 - the test judges it
                [*CLI, "--store", target.url, "verify", "--format", "json"]),
                capture_output=True, timeout=60)
        finally:
            target.path.chmod(0o644)
    with reader(target, f"ALL TABLES IN SCHEMA {target.schema}") as url:
        return run("verify", "--format", "json", url=url)


@contextmanager
def reader(target: StoreUnderTest, readable: str) -> Iterator[str]:
    """The store's URL for a new role that may read ``readable`` and nothing
    more (PostgreSQL), dropped afterwards."""
    auditor = f"auditor_{uuid.uuid4().hex[:10]}"
    target.sql(f"CREATE ROLE {auditor} LOGIN")
    try:
        target.sql(f"GRANT USAGE ON SCHEMA {target.schema} TO {auditor}")
        target.sql(f"GRANT SELECT ON {readable} TO {auditor}")
        parts = urlsplit(target.url)
        yield parts._replace(netloc=f"{auditor}@{parts.hostname}:{parts.port or 5432}").geturl()
    finally:
        target.sql(f"DROP OWNED BY {auditor}")
        target.sql(f"DROP ROLE {auditor}")


def remedy(target: StoreUnderTest) -> str:
    if target.dialect == "sqlite":
        return ("open the store where its file may be written: any alloc-ledger command run by "
                f"a user who may write {target.path} makes them again")
    return ("open the store as the role that owns its tables (postgres): any alloc-ledger "
            "command run as it makes them again")


@pytest.mark.parametrize(("dialect", "how"), [
    pytest.param(dialect, how, marks=[pytest.mark.postgres] if dialect == "postgresql" else [])
    for how, dialects in UNGUARDING.items() for dialect in dialects
])
def test_verify_names_the_guards_an_open_that_may_not_make_them_left_missing(
    request: pytest.FixtureRequest, dialect: str, how: str,
) -> None:
    """Missing guards prove no edit (exit 0, the chain verifies), but nothing
    stops one: ``guards`` names them, and a warning says how to get them
    back; the owner's next open makes them again."""
    target = request.getfixturevalue("sqlite_under_test" if dialect == "sqlite" else "pg_under_test")
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(20, nodes=4)), batch=20))
    unguard(Attacker(target), how, "stored_events")
    named = lacking(dialect, how, "stored_events")

    checked = verified_where_guards_cannot_be_made(target)

    assert checked.returncode == 0, checked.stderr
    answer = json.loads(checked.stdout)
    assert (answer["ok"], answer["verified"], answer["guards_lacking"]) == (True, 20, named)
    assert checked.stderr.decode() == (
        f"warning: the log's append-only guards are not in place ({', '.join(named)}): "
        f"nothing stops an edit of the log until they are made again; {remedy(target)}\n")

    again = run("verify", "--format", "json", url=target.url)
    assert (again.returncode, again.stderr) == (0, b"")
    assert json.loads(again.stdout)["guards_lacking"] == []


def test_an_edited_log_whose_guards_are_gone_fails_verify_and_warns_of_the_guards(
    sqlite_under_test: StoreUnderTest,
) -> None:
    """The edit is what fails it (exit 1); the guards are said besides."""
    target = sqlite_under_test
    attacker = simulated_and_unguarded(target, 40)
    attacker.edit(12, random.Random(3))

    checked = verified_where_guards_cannot_be_made(target)

    assert checked.returncode == 1, checked.stderr
    answer = json.loads(checked.stdout)
    assert (answer["ok"], answer["position"]) == (False, 12)
    assert answer["guards_lacking"] == lacking("sqlite", "every guard dropped", "")
    warning, error = checked.stderr.decode().splitlines()
    assert warning.startswith("warning: the log's append-only guards are not in place (")
    assert error.startswith("Error: verify failed at position 12: ")


def test_a_tracking_position_lowered_by_hand_is_named_not_the_log(
    sqlite_under_test: StoreUnderTest,
) -> None:
    """The tables hold every event, but their tracking row says fewer: the
    projector's next catch-up applies events again, which their rules refuse;
    the error says the tables and their position disagree, not that the log
    was decided wrongly."""
    attacker = simulated_and_unguarded(sqlite_under_test, 60)
    attacker.sql("UPDATE tracking SET notification_id = 10")

    done = run("query", "nodes", url=sqlite_under_test.url)

    assert done.returncode == 1, done.stderr
    line = one_line_error(done.stderr)
    assert line.startswith("Error: the projection tables cannot apply the kept event at position "), line
    assert line.endswith(
        "they do not match the log up to their tracking position 10 (was it lowered, or were "
        "they edited?); alloc-ledger verify checks the log itself, and replay --repair makes "
        "the tables again from it"), line


@pytest.mark.postgres
def test_a_role_that_may_read_only_the_log_can_still_verify_it(pg_under_test: StoreUnderTest) -> None:
    """verify and audit read the log, its hashes and ids, never tracking
    (whose 'repairs' row head() once read with the head)."""
    target = pg_under_test
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(20, nodes=4)), batch=20))
    with reader(target, ", ".join(f"{target.schema}.{t}" for t in LOG)) as url:
        checked = run("verify", "--format", "json", url=url)
        audited = run("audit", "--format", "json", url=url)  # the tail checked by its hashes

    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["verified"] == 20
    assert audited.returncode == 0, audited.stderr
    assert json.loads(audited.stdout)["to"] == 20


def test_verify_does_not_pass_a_log_cut_below_what_the_tables_applied(attack: Attack) -> None:
    """replay says "its last events were deleted ...; alloc-ledger verify checks
    whether the log was edited": verify, run on that advice, must not answer
    ok with exit 0 when the ledger's own tracking row shows the cut."""
    assert run("project", url=attack.target.url).returncode == 0
    attack.attacker.truncate(2)

    replayed = run("replay", url=attack.target.url)
    assert replayed.returncode == 1
    assert "verify checks whether the log was edited" in one_line_error(replayed.stderr)

    verified = run("verify", url=attack.target.url)

    assert verified.returncode == 1, verified.stdout
    assert json.loads(verified.stdout)["ok"] is False


def test_project_over_a_log_cut_below_the_tables_does_not_report_success(attack: Attack) -> None:
    """replay, audit and --as-of refuse a log that ends before what the tables
    applied; project printed {"from": 240, "to": 238, "applied": -2}, exit 0."""
    assert run("project", url=attack.target.url).returncode == 0
    attack.attacker.truncate(2)  # the log now ends at 238; the tables applied 240

    projected = run("project", url=attack.target.url)

    assert projected.returncode == 1, projected.stdout
    assert "before position 240, which the projection tables have applied" in one_line_error(
        projected.stderr)


def test_an_event_appended_after_a_cut_is_not_silently_missing_from_queries(
    attack: Attack,
) -> None:
    """On PostgreSQL the writers accept the next event at position 239, which the
    tables count as applied: it never reaches them, and `query nodes` leaves it
    out with exit 0 and no lag line. Either refuse the append or the answer."""
    assert run("project", url=attack.target.url).returncode == 0
    attack.attacker.truncate(2)

    submitted = run("submit", "node-registered", "--node", "late", "--slots", "1",
                    url=attack.target.url)
    if submitted.returncode != 0:  # refusing the append is one right answer (SQLite does)
        assert b"Traceback" not in submitted.stderr
        return
    run("project", url=attack.target.url)
    asked = run("query", "nodes", "--format", "json", url=attack.target.url)

    shown = asked.returncode == 0 and any(
        row["node"] == "late" for row in json.loads(asked.stdout))
    assert shown or asked.returncode != 0, "node late is missing and the answer exits 0"


def test_an_event_deleted_with_its_chain_hash_and_id_is_named_as_missing(attack: Attack) -> None:
    """Deleted with its chain hash and client id, an event leaves no orphan
    hash to point at the gap: verify names the missing position itself,
    where what is verified ends, not the next event as if it were edited."""
    attack.attacker.delete(120)
    attack.attacker.drop_hash(120)
    attack.attacker.sql("DELETE FROM event_ids WHERE position = ?", (120,))

    found = verify(attack.store)

    assert (found.position, found.verified) == (120, 119)
    assert found.problem == "position 120 is missing from the log (the next kept event is at 121)"


def test_each_kept_hash_is_sha256_over_the_previous_hash_position_topic_and_bytes(
    under_test: StoreUnderTest,
) -> None:
    """docs/audit.md, "What is hashed", computed here from that text alone: a
    digest kept elsewhere, and every store an earlier release wrote, holds
    hashes made this way, so a change to it fails them all, not only this
    release's own round trip."""
    with Ledger.open(under_test.url) as ledger:
        list(ledger.submit_many(texts(history(12, nodes=2)), batch=5))
        store = ledger.store
        with store.reading() as cursor:
            kept = [(store.hash_at(cursor, e.originator_version), e)
                    for e in store.read_log(0, store.head(cursor))]
        digest = current_digest(store)
    previous = GENESIS
    for position, (hashed, event) in enumerate(kept, start=1):
        previous = sha256(
            b"%s\n%d\n%s\n%s" % (previous.encode(), position, event.topic.encode(),
                                 bytes(event.state))).hexdigest()
        assert hashed == previous, position
    assert str(digest) == f"{len(kept)}:{previous}"


def test_a_digest_proves_even_the_last_event_alone_was_cut_once_the_tables_were_repaired(
    attack: Attack,
) -> None:
    """With the tables made again from the cut log (``replay --repair``),
    they no longer tell that its last event is gone: the digest kept at the
    old head still does, however few events were cut."""
    attack.attacker.truncate(1)
    repaired = run("replay", "--repair", url=attack.target.url)
    assert repaired.returncode == 0, repaired.stderr
    assert run("verify", url=attack.target.url).returncode == 0  # the cut log holds

    proved = run("verify", "--digest", str(attack.digest), url=attack.target.url)

    assert proved.returncode == 1, proved.stderr
    assert one_line_error(proved.stderr).endswith(
        "the log ends at position 239, before the digest's position 240: events after 239 "
        "were removed, or the digest is of another ledger"
    )
