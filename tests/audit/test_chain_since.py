"""``verify --since DIGEST``: an auditor who keeps a digest every day checks
only what was appended after it, not the whole log again (a whole verify
reads about 53,000 events/s: 27 minutes per day of log at the mission's
rate). The log must keep the digest's hash at its position; every event
after it must chain from there, with the same checks as a whole verify."""

from __future__ import annotations

import random
from typing import Any

import pytest
from audit_support import Attack, StoreUnderTest, history, one_line_error, run, texts
from test_chain import TRIALS, tamper

from ledger.application import Ledger
from ledger.chain import GENESIS, Digest, current_digest, link, verify
from ledger.errors import BadOption
from ledger.store import Store

SINCE = 120  # of the attacked log's 240 events


def digest_at(store: Store, position: int) -> Digest:
    with store.reading() as cursor:
        kept = store.hash_at(cursor, position)
    assert kept is not None
    return Digest(position, kept)


def test_verify_since_an_earlier_digest_reads_only_the_events_after_it(
    ledger_log: tuple[StoreUnderTest, Store], monkeypatch: Any
) -> None:
    target, store = ledger_log
    early = current_digest(store)
    with Ledger.open(target.url) as ledger:
        list(ledger.submit_many(texts(history(300, nodes=8)[240:]), batch=25))
    head = current_digest(store)
    starts: list[int] = []
    read_log = type(store).read_log
    monkeypatch.setattr(type(store), "read_log", lambda self, after, *rest, **named: (
        starts.append(after), read_log(self, after, *rest, **named))[1])

    checked = verify(store, since=early)

    assert checked.ok, checked
    assert (checked.head, checked.verified, checked.hash) == (300, 300, head.hash)
    assert starts == [240]
    assert checked.as_dict()["since"] == str(early)
    shown = run("verify", "--since", str(early), url=target.url)
    assert shown.returncode == 0, shown.stderr
    for since in (f"0:{GENESIS}", str(head)):  # all of it; none of it
        assert run("verify", "--since", since, url=target.url).returncode == 0


def test_tampering_after_the_digest_is_named_where_a_whole_verify_names_it(
    attack: Attack,
) -> None:
    target, store, attacker = attack.target, attack.store, attack.attacker
    since = digest_at(store, SINCE)
    attacker.keep()
    with store.reading() as cursor:
        applied = store.known_end(cursor)[1]
    rng = random.Random(20261129)
    missed, compared = [], 0
    for trial in range(TRIALS[target.dialect]):
        attacker.restore()
        what, plain, _ = tamper(attacker, rng, attack.digest.position, applied)
        if plain is None or plain <= SINCE:
            continue  # before the digest: the tests below
        compared += 1
        whole, after = verify(store), verify(store, since=since)
        if (after.ok, after.position, after.verified) != (whole.ok, whole.position, whole.verified):
            missed.append(f"{trial}: {what}: whole {whole.as_dict()}, since {after.as_dict()}")
    assert compared >= TRIALS[target.dialect] // 3
    assert not missed, "\n".join(missed)


def test_a_log_rewritten_before_the_digest_no_longer_extends_it(attack: Attack) -> None:
    since = digest_at(attack.store, SINCE)
    attack.attacker.rewrite(SINCE - 30, random.Random(5))  # every hash after it recomputed

    assert verify(attack.store).ok  # the kept chain is consistent again
    found = verify(attack.store, since=since)

    assert (found.ok, found.position, found.verified, found.hash) == (False, SINCE, 0, GENESIS)
    refused = run("verify", "--since", str(since), url=attack.target.url)
    assert refused.returncode == 1
    assert one_line_error(refused.stderr).startswith(
        f"Error: verify failed at position {SINCE}: the log no longer extends digest {since}: "
        f"the chain hash kept for position {SINCE} is ")


def test_an_event_slipped_in_before_the_digest_moves_the_events_after_it(attack: Attack) -> None:
    since = digest_at(attack.store, SINCE)
    attack.attacker.insert(SINCE - 30)

    found = verify(attack.store, since=since)

    # the digest's own event moved: it no longer gives the digest's hash
    assert (found.ok, found.position, found.verified) == (False, SINCE, 0)
    assert "does not match its chain hash" in str(found.problem)


def test_what_lies_before_the_digest_is_not_read_again(attack: Attack) -> None:
    # the limit --since states: an edit before the digest that leaves the
    # kept hashes alone is a whole verify's to find
    since = digest_at(attack.store, SINCE)
    attack.attacker.edit(SINCE - 30, random.Random(7))

    assert verify(attack.store).position == SINCE - 30
    assert verify(attack.store, since=since).ok


@pytest.mark.parametrize("edit", [
    "DELETE FROM event_ids WHERE position = 150",
    "INSERT INTO event_ids (id, position) VALUES ('forged', 150)",
])
def test_the_client_ids_after_the_digest_are_checked(attack: Attack, edit: str) -> None:
    attack.attacker.sql(edit)

    found = verify(attack.store, since=digest_at(attack.store, SINCE))

    assert not found.ok
    assert "event_ids" in str(found.problem)


def test_an_id_forged_before_the_digest_is_a_whole_verifys_to_find(attack: Attack) -> None:
    attack.attacker.sql("INSERT INTO event_ids (id, position) VALUES ('forged', 3)")

    assert not verify(attack.store).ok
    assert verify(attack.store, since=digest_at(attack.store, SINCE)).ok


@pytest.mark.parametrize("cut", [3, 130])  # the digest's position left, and cut off
def test_a_log_cut_short_is_named(attack: Attack, cut: int) -> None:
    since = digest_at(attack.store, SINCE)
    assert run("project", url=attack.target.url).returncode == 0  # the tables apply it all
    attack.attacker.truncate(cut)
    head = 240 - cut

    found = verify(attack.store, since=since)

    if head >= SINCE:
        assert found.position == head + 1  # the tables applied past the log's head
        assert "its last events were deleted" in str(found.problem)
        assert found.verified == verify(attack.store).verified == head
    else:
        assert (found.position, found.verified) == (head + 1, 0)
        assert str(found.problem) == (
            f"the log ends at position {head}, before the digest's position {SINCE}: events "
            f"after {head} were removed, or the digest is of another ledger")


def test_a_digest_of_another_history_does_not_start_a_check(
    ledger_log: tuple[StoreUnderTest, Store],
) -> None:
    _, store = ledger_log
    for forged in (Digest(SINCE, "ef" * 32), Digest(0, "ef" * 32)):
        found = verify(store, since=forged)
        assert (found.ok, found.position, found.verified) == (False, forged.position, 0)
        assert f"no longer extends digest {forged}" in str(found.problem)


def test_digest_and_since_together_are_a_usage_error(sqlite_under_test: StoreUnderTest) -> None:
    both = ["--digest", f"0:{GENESIS}", "--since", f"0:{GENESIS}"]
    refused = run("verify", *both, url=sqlite_under_test.url)
    assert refused.returncode == 2
    assert "give --digest or --since, not both" in one_line_error(refused.stderr)
    with pytest.raises(BadOption):
        verify(None, Digest(0, GENESIS), Digest(0, GENESIS))  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["12", "12:abc", "x:" + "a" * 64])
def test_a_malformed_since_is_a_usage_error(text: str, sqlite_under_test: StoreUnderTest) -> None:
    refused = run("verify", "--since", text, url=sqlite_under_test.url)
    assert refused.returncode == 2
    assert "is not a digest" in one_line_error(refused.stderr)


@pytest.mark.parametrize("edit", [
    "INSERT INTO event_hashes (position, hash) VALUES (0, 'ab')",
    "INSERT INTO event_hashes (position, hash) VALUES (-7, 'ab')",
    "INSERT INTO event_ids (id, position) VALUES ('forged', 0)",
    "INSERT INTO event_ids (id, position) VALUES ('forged', -7)",
])
def test_rows_below_position_1_in_hashes_or_ids_are_named_as_by_a_whole_verify(
    attack: Attack, edit: str
) -> None:
    # no event's position, before the digest or not (helper-h611: passed)
    attack.attacker.sql(edit)

    whole = verify(attack.store)
    found = verify(attack.store, since=digest_at(attack.store, SINCE))

    assert not whole.ok
    assert (found.ok, found.position) == (whole.ok, whole.position)


def test_an_extra_id_after_the_digest_is_the_one_named(attack: Attack) -> None:
    attack.attacker.sql("INSERT INTO event_ids (id, position) VALUES ('early', 3)")
    attack.attacker.sql("INSERT INTO event_ids (id, position) VALUES ('late', 150)")

    found = verify(attack.store, since=digest_at(attack.store, SINCE))

    assert not found.ok
    assert "('late' for position 150, first)" in str(found.problem)


@pytest.mark.parametrize("how", ["edit", "delete"])
def test_the_event_the_digest_vouches_for_is_checked(attack: Attack, how: str) -> None:
    since = digest_at(attack.store, SINCE)
    if how == "edit":
        attack.attacker.edit(SINCE, random.Random(3))
    else:
        attack.attacker.delete(SINCE)

    assert verify(attack.store).position == SINCE
    found = verify(attack.store, since=since)

    assert (found.ok, found.position, found.verified) == (False, SINCE, 0)


def test_a_rewrite_before_the_digest_that_spares_its_hash_is_named(attack: Attack) -> None:
    # the kept hashes recomputed up to the one before the digest's position,
    # whose own kept hash is left as the digest has it: the chain breaks there
    attacker, start = attack.attacker, SINCE - 30
    since = digest_at(attack.store, SINCE)
    attacker.edit(start, random.Random(11))
    previous = str(attacker.sql("SELECT hash FROM event_hashes WHERE position = ?",
                                (start - 1,))[0][0])
    for at in range(start, SINCE):
        topic, state = attacker.event(at)
        previous = link(previous, at, topic, state)
        attacker.sql("UPDATE event_hashes SET hash = ? WHERE position = ?", (previous, at))

    assert verify(attack.store).position == SINCE
    found = verify(attack.store, since=since)

    assert (found.ok, found.position, found.verified) == (False, SINCE, 0)
