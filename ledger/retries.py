"""Safe retries by ``id``: a second submission of an id answers as the first did.

SPEC section 2 makes an ``id`` the key of safe retries: a second submission
with an id already in the ledger appends nothing and reports ``duplicate``.
Two cases a retry loop must not take for success are told apart (README,
"Choices where the SPEC is silent"), as idempotency keys are elsewhere:

* the same id with **another event** (a counter reset, two tools choosing
  the same key) is ``invalid``, naming the event kept under that id and the
  fields that differ: answering ``duplicate`` would drop it silently;
* a retry of an event that was **rejected** is ``duplicate`` with the
  rejection as its ``error`` (and ``submit`` exits 1): it did not take effect.

A retry is the same event when every field it gives is what was kept, but
``at`` where the retry leaves it out: the ledger stamped the first with the
time it was received.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ledger.errors import differ
from ledger.model import Event, Receipt, address_set

# What was kept under an id: its position, the event as kept (``at`` in its
# text form) and, if it was rejected, the reason. A plain tuple: one is made
# per event with an id, and a frozen dataclass's __init__ costs ten times as much.
First = tuple[int, dict[str, Any], str | None]

if TYPE_CHECKING:
    from ledger.records import Record


def first(record: Record) -> First:
    """What a kept record answers a retry of its id with."""
    return (record.position, record.event, record.reason)


def answer(retry: Event, first: First) -> Receipt:
    """The receipt of a submission whose id is already in the ledger."""
    position, kept, reason = first
    differing = differences(retry, kept)
    if differing:
        return Receipt(
            "invalid",
            error=(
                f"id '{retry['id']}' is already used by another event ({kept['type']} at "
                f"position {position}; {', '.join(differing)} {differ(differing)}): "
                "a retry must repeat the event, a new event needs a new id"
            ),
        )
    if reason is not None:
        return Receipt("duplicate", position, f"rejected at position {position}: {reason}")
    return Receipt("duplicate", position)


def differences(retry: Event, kept: dict[str, Any]) -> list[str]:
    """The fields in which a retry is not the kept event. Addresses are a set,
    as for placing an allocation again (README); a slot report is a table
    (which allocation each slot holds), whatever order it lists them in."""
    if retry == kept:  # a retry as it was sent the first time, ``at`` and all
        return []
    names = retry.keys() | kept.keys()
    if "at" not in retry:
        names.discard("at")
    return sorted(name for name in names if not _same(name, retry.get(name), kept.get(name)))


def _same(name: str, mine: Any, theirs: Any) -> bool:
    if name == "addresses" and isinstance(mine, list) and isinstance(theirs, list):
        return address_set(mine) == address_set(theirs)
    if name == "slots" and isinstance(mine, list) and isinstance(theirs, list):
        return _table(mine) == _table(theirs)
    return mine == theirs


def _table(report: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A slot report in slot order."""
    return sorted(report, key=lambda entry: (entry["slot"], entry["alloc"] or ""))
