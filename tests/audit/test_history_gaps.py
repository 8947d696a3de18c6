"""A history read from a log with rows deleted or damaged by hand: it lists
what it can, and then says on one line what it could not (the positions
missing from the range it searched, the events its search found that cannot
be read), exit 1 as for a failed check; never a partial history told as
whole. Replays name the same damage by position too."""

from __future__ import annotations

import json
from typing import Any

import pytest
from audit_support import Attack, one_line_error, run

from ledger.errors import HistoryIncomplete
from projections.history import history

NODE = "n00001"
VERIFY = "; alloc-ledger verify checks whether the log was edited"


def shown(attack: Attack, *args: str) -> tuple[int, list[dict[str, Any]], bytes]:
    """``query history`` as a user runs it: exit code, the rows printed, stderr."""
    done = run("query", "history", *args, "--format", "json", url=attack.target.url)
    return done.returncode, json.loads(done.stdout or b"null"), done.stderr


def positions(rows: list[dict[str, Any]]) -> list[int]:
    return [row["position"] for row in rows]


def restate(attack: Attack, position: int, state: bytes) -> None:
    attacker = attack.attacker
    attacker.sql(f"UPDATE {attacker.events} SET state = ? WHERE originator_version = ?",
                 (state, position))


@pytest.fixture
def whole(attack: Attack) -> list[dict[str, Any]]:
    """The node's history before anything was touched: whole, and said so."""
    code, rows, stderr = shown(attack, NODE)
    assert (code, stderr) == (0, b""), stderr
    assert len(rows) > 10
    attack.attacker.drop_guards()  # again: opening the store put them back
    return rows


def test_history_names_the_positions_deleted_from_the_range_it_searched(
    attack: Attack, whole: list[dict[str, Any]]
) -> None:
    ours = positions(whole)
    gone = [ours[3], ours[3] + 1, ours[3] + 2, ours[7]]  # one of its own, the two after, another
    for position in gone:
        attack.attacker.delete(position)

    code, rows, stderr = shown(attack, NODE)

    assert code == 1, stderr
    assert rows == [row for row in whole if row["position"] not in gone]
    assert one_line_error(stderr) == (
        f"Error: the history of {NODE} may be incomplete: positions {gone[0]} to {gone[2]} and "
        f"{gone[3]} are missing from the log" + VERIFY)


def test_history_as_of_a_point_is_whole_when_only_later_positions_are_missing(
    attack: Attack, whole: list[dict[str, Any]]
) -> None:
    """Only the range searched counts: as of a point before the gap, the
    history is whole; as of one within it, the gap is named."""
    ours = positions(whole)
    attack.attacker.delete(ours[5])

    code, rows, stderr = shown(attack, NODE, "--as-of", str(ours[5] - 1))
    assert (code, stderr) == (0, b""), stderr
    assert rows == whole[:5]

    code, rows, stderr = shown(attack, NODE, "--as-of", str(ours[6]))
    assert code == 1, stderr
    assert rows == whole[:5] + [whole[6]]
    assert one_line_error(stderr) == (
        f"Error: the history of {NODE} up to position {ours[6]} may be incomplete: position "
        f"{ours[5]} is missing from the log" + VERIFY)


def test_history_names_its_last_events_deleted_after_the_tables_applied_them(
    attack: Attack, whole: list[dict[str, Any]]
) -> None:
    """The log's head went back: the positions the projection tables
    applied, which the log held, are in the range searched (as ``replay``
    names a log that ends before the tables' position)."""
    assert run("project", url=attack.target.url).returncode == 0  # PostgreSQL's tables too
    attack.attacker.drop_guards()  # again: opening the store put them back
    head = attack.attacker.head()
    attack.attacker.truncate(2)

    code, rows, stderr = shown(attack, NODE)

    assert code == 1, stderr
    assert rows == [row for row in whole if row["position"] < head - 1]
    assert one_line_error(stderr) == (
        f"Error: the history of {NODE} may be incomplete: positions {head - 1} to {head} are "
        "missing from the log" + VERIFY)


@pytest.mark.parametrize(("damage", "problem"), [
    (lambda state: state.replace(b'"type":"', b'"type":"x-', 1), "unknown event type 'x-{type}'"),
    (lambda state: state.replace(b'"node":', b'"nod":', 1), "field 'node' is missing"),
    (lambda state: state.replace(b'"at":"', b'"at":["', 1).replace(b'Z"', b'Z"]', 1),
     "field 'at' is not a text"),
    (lambda state: state[:-1], "its stored JSON is not valid: unexpected end of data at character {end}"),
])
def test_history_names_an_event_its_search_found_that_cannot_be_read(
    attack: Attack, whole: list[dict[str, Any]], damage: Any, problem: str
) -> None:
    """The event holds the name, so it may be the entity's: it is not left
    out quietly, nor does it stop the history."""
    row = whole[4]
    _, state = attack.attacker.event(row["position"])
    restate(attack, row["position"], damage(state))

    code, rows, stderr = shown(attack, NODE)

    assert code == 1, stderr
    assert rows == [other for other in whole if other is not row]
    said = problem.format(type=row["type"], end=len(state))
    assert one_line_error(stderr) == (
        f"Error: the history of {NODE} may be incomplete: the kept event at position "
        f"{row['position']} cannot be read ({said})" + VERIFY)
    replayed = run("replay", url=attack.target.url)  # a replay names it alike
    assert replayed.returncode == 1
    assert one_line_error(replayed.stderr) == (
        f"Error: the kept event at position {row['position']} cannot be read: {said}" + VERIFY)


def test_history_counts_the_events_it_cannot_read_and_names_the_deleted_ones_too(
    attack: Attack, whole: list[dict[str, Any]]
) -> None:
    damaged = [row["position"] for row in whole[2:6]]
    for position in damaged:
        _, state = attack.attacker.event(position)
        restate(attack, position, state.replace(b'"type":"', b'"type":"x-', 1))
    gone = whole[8]["position"]
    attack.attacker.delete(gone)
    first = whole[2]["type"]

    code, rows, stderr = shown(attack, NODE)

    assert code == 1, stderr
    assert positions(rows) == [p for p in positions(whole) if p not in [*damaged, gone]]
    assert one_line_error(stderr) == (
        f"Error: the history of {NODE} may be incomplete: position {gone} is missing from the "
        f"log; 4 kept events that may name it cannot be read (at positions {damaged[0]}, "
        f"{damaged[1]}, {damaged[2]}, …; the first: unknown event type 'x-{first}')" + VERIFY)


def test_an_allocation_is_answered_with_its_history_and_what_the_history_lacks(
    attack: Attack,
) -> None:
    assert run("project", url=attack.target.url).returncode == 0  # PostgreSQL's tables too
    allocs = json.loads(run("query", "allocs", "--format", "json", url=attack.target.url).stdout)
    alloc = allocs[0]["alloc"]
    answered = run("query", "alloc", alloc, "--format", "json", url=attack.target.url)
    assert (answered.returncode, answered.stderr) == (0, b""), answered.stderr
    before = json.loads(answered.stdout)
    gone = before["history"][-1]["position"]
    attack.attacker.drop_guards()  # again: the query opened the store
    attack.attacker.delete(gone)

    answered = run("query", "alloc", alloc, "--format", "json", url=attack.target.url)

    assert answered.returncode == 1, answered.stderr
    assert json.loads(answered.stdout)["history"] == before["history"][:-1]
    assert one_line_error(answered.stderr) == (
        f"Error: the history of {alloc} may be incomplete: position {gone} is missing from the "
        "log" + VERIFY)


def test_history_names_the_first_position_deleted_from_the_log(
    attack: Attack, whole: list[dict[str, Any]]
) -> None:
    """A gap at the very start of the log is a gap too (position 1, before any kept event)."""
    attack.attacker.delete(1)

    code, rows, stderr = shown(attack, NODE)

    assert code == 1, stderr
    assert rows == [row for row in whole if row["position"] != 1]
    assert one_line_error(stderr) == (
        f"Error: the history of {NODE} may be incomplete: position 1 is missing from the log"
        + VERIFY)


def test_the_history_function_refuses_a_history_the_log_cannot_give_whole(
    attack: Attack, whole: list[dict[str, Any]]
) -> None:
    """``projections.history.history`` (what ``demo`` asks) raises rather than
    return a partial history as whole."""
    attack.attacker.delete(positions(whole)[3])

    with pytest.raises(HistoryIncomplete, match="is missing from the log"):
        history(attack.store, NODE)
