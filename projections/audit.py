"""The audit report: everything unusual in a range of history.

History is replayed from the start (the state before the range matters) into
an in-memory cluster; after each event the changes it made are read, and the
report keeps what happened inside the range:

* ``rejections``: refused events and why;
* ``reconnects``: each time an allocation was ``unknown`` (its node
  disconnected), until it reconnected or was lost, and for how long;
* ``zombie_slots``: each time a node reported a slot as held although history
  said otherwise, when it appeared and when it cleared (the reasons of the
  ``zombie_slots`` view);
* ``releasing_addresses``: addresses still held after a stop or remove
  request, until their allocation shut down;
* ``suspects``: nodes marked suspect, and when they were cleared;
* ``downs``: nodes going down or removed, with the child nodes and the
  allocations they took with them (cascades).

Episodes (reconnects, zombies, holds, suspects) are reported when they
overlap the range; one still going at the end of the range has no end and
its duration runs to the latest ``at`` up to the range's end (``ongoing``),
the time ``needs-reconnect --as-of`` judges deadlines at there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ledger.collection import fewer_collections
from ledger.domain import Changes, Cluster
from ledger.errors import OutOfRange
from ledger.model import HEALTH_REASON, TIME_FORM, Allocation
from ledger.records import Record, decode, gapless, replay
from ledger.store import Store
from projections.asof import head_within
from projections.spill import DoneWith, Findings, Spill

SECTIONS = (
    "rejections", "reconnects", "zombie_slots", "releasing_addresses", "suspects", "downs",
)
COLUMNS: dict[str, tuple[str, ...]] = {
    "rejections": ("position", "at", "type", "entity", "reason"),
    "reconnects": (
        "alloc", "node", "unknown_position", "unknown_at", "resolved_position", "resolved_at",
        "outcome", "seconds", "max_disconnect", "past_deadline", "ongoing",
    ),
    "zombie_slots": (
        "node", "slot", "alloc", "reason", "appeared_position", "appeared_at",
        "cleared_position", "cleared_at", "seconds", "ongoing",
    ),
    "releasing_addresses": (
        "address", "alloc", "node", "requested", "requested_position", "requested_at",
        "released_position", "released_at", "outcome", "seconds", "ongoing",
    ),
    "suspects": (
        "node", "reason", "suspect_position", "suspect_at", "cleared_position", "cleared_at",
        "seconds", "ongoing",
    ),
    "downs": ("position", "at", "node", "status", "reason", "cascade", "lost_allocs"),
}


def elapsed(start: str, end: str) -> timedelta | None:
    try:
        return datetime.strptime(end, TIME_FORM) - datetime.strptime(start, TIME_FORM)
    except ValueError:
        return None


@dataclass(slots=True)
class Episode:
    """Something unusual that began at one event and may end at a later one."""

    fields: dict[str, Any]
    start: str  # name prefix of the start columns (``unknown``, ``appeared``, …)
    end: str
    position: int
    at: str

    def close(self, position: int, at: str, **more: Any) -> dict[str, Any]:
        return self.fields | {
            f"{self.start}_position": self.position,
            f"{self.start}_at": self.at,
            f"{self.end}_position": position,
            f"{self.end}_at": at,
            # judged unrounded (``past_deadline``), shown to the millisecond
            "elapsed": (waited := elapsed(self.at, at)),
            "seconds": None if waited is None else round(waited.total_seconds(), 3),
            "ongoing": False,
        } | more

    def still_open(self, at: str) -> dict[str, Any]:
        return self.close(0, at) | {
            f"{self.end}_position": None, f"{self.end}_at": None, "ongoing": True,
        }


@dataclass
class AuditReport:
    """The range audited and what was found in it: kept on disk, read a
    section at a time (``rows``), never all held at once."""

    start: int
    end: int
    head: int
    findings: Findings

    def summary(self) -> dict[str, Any]:
        """The range, and how many findings each section has."""
        summary = {
            "from": self.start,
            "to": self.end,
            "head": self.head,
            "events": max(0, self.end - self.start + 1),
        }
        return summary | {f"{name}_count": self.findings.counts[name] for name in SECTIONS}

    def rows(self, section: str) -> Iterator[dict[str, Any]]:
        """A section's findings in its order, read as they are taken."""
        return self.findings.rows(section)

    @property
    def sections(self) -> dict[str, list[dict[str, Any]]]:
        """Every section's findings as lists: all held at once."""
        return {name: list(self.rows(name)) for name in SECTIONS}

    def as_dict(self) -> dict[str, Any]:
        """The summary, then the sections as lists (all held at once)."""
        return self.summary() | self.sections

    def close(self) -> None:
        """Let the findings' temporary file go (also when the report is collected)."""
        self.findings.spill.close()


class Auditor:
    """Watches a replay event by event and writes down what is unusual."""

    def __init__(self, start: int, forget: bool = True) -> None:
        """``forget``: keep what the replay is done with on disk (``DoneWith``)."""
        self.start = start
        self.spill = Spill()
        self.found = Findings(self.spill, SECTIONS)
        self.done_with = DoneWith(self.spill) if forget else None
        self.cluster = Cluster(self.done_with)
        self.open: dict[str, dict[Any, Episode]] = {
            name: {} for name in ("reconnects", "zombie_slots", "releasing_addresses", "suspects")
        }
        self.node_state: dict[str, tuple[str, str]] = {}
        # What each node reports, indexed both ways and per node, so that a
        # report is judged against its own node's report only.
        self.reports: dict[str, dict[int, str]] = {}  # node -> slot -> reported alloc
        self.reporting: dict[str, dict[str, set[int]]] = {}  # alloc -> node -> its slots
        self.last_at = ""

    # -- the walk --------------------------------------------------------------

    def see(self, record: Record) -> None:
        replay(self.cluster, record)
        changes = self.cluster.take_changes()
        at, position = record.event["at"], record.position
        # the point's time, as --as-of POSITION judges it: the latest ``at``
        # so far, not the last event's (events may come out of time order)
        self.last_at = max(self.last_at, at)
        if record.rejected:
            self._note("rejections", position, {
                "position": position, "at": at, "type": record.event.get("type"),
                "entity": str(record.event.get("alloc") or record.event.get("node") or ""),
                "reason": record.reason,
            })
        self._alloc_states(changes, position)
        self._zombies(changes, position, at)
        self._addresses(changes, position, at)
        self._nodes(changes, record, position, at)
        done = self.done_with
        if done is not None and (
            changes.allocs or done.looked_up or changes.released or done.addresses_looked_up
        ):
            done.forget(self.cluster, changes)

    def finish(self) -> Findings:
        """What was found, with the episodes still going at the range's end."""
        for name, episodes in self.open.items():
            for episode in episodes.values():
                self._found(name, episode, episode.still_open(self.last_at))
            episodes.clear()
        self.found.finish()
        return self.found

    # -- sections ----------------------------------------------------------------

    def _note(self, section: str, position: int, row: dict[str, Any]) -> None:
        if position >= self.start:
            # listed as found: in log order
            self.found.add(section, {column: row.get(column) for column in COLUMNS[section]})

    def _begin(self, section: str, key: Any, episode: Episode) -> None:
        self.open[section][key] = episode

    def _end(self, section: str, key: Any, position: int, at: str, **more: Any) -> None:
        episode = self.open[section].pop(key, None)
        if episode is not None and position >= self.start:
            self._found(section, episode, episode.close(position, at, **more))

    def _found(self, section: str, episode: Episode, row: dict[str, Any]) -> None:
        """An episode's row, listed by its start, then its allocation's or node's name."""
        if section == "reconnects":
            waited, limit = row["elapsed"], row["max_disconnect"]
            row["past_deadline"] = (
                None if waited is None or limit is None else waited >= timedelta(seconds=limit))
        name = str(row.get("alloc") or row.get("node") or "")
        self.found.add(
            section, {column: row.get(column) for column in COLUMNS[section]},
            episode.position, name)

    def _alloc_states(self, changes: Changes, position: int) -> None:
        for state in changes.alloc_states:
            alloc = self.cluster.allocs[state.alloc]
            if state.value == "unknown" and alloc is not None:
                self._begin("reconnects", state.alloc, Episode(
                    {"alloc": state.alloc, "node": alloc.node,
                     "max_disconnect": alloc.max_disconnect},
                    "unknown", "resolved", position, state.at,
                ))
                continue
            self._end("reconnects", state.alloc, position, state.at, outcome=state.value)

    def _zombies(self, changes: Changes, position: int, at: str) -> None:
        affected: set[tuple[str, int]] = set()
        for slot in changes.slots:
            key = (slot.node, slot.slot)
            before = self.reports.get(slot.node, {}).get(slot.slot)
            if before != slot.reported_alloc:
                if before is not None:
                    affected |= self._unreport(slot.node, slot.slot, before)
                if slot.reported_alloc is not None:
                    affected |= self._report(slot.node, slot.slot, slot.reported_alloc)
            affected.add(key)
        for alloc in changes.allocs:
            for reporter, slots in self.reporting.get(alloc.alloc, {}).items():
                affected.update((reporter, slot) for slot in slots)
        for node in changes.nodes:  # a removed node's report is no zombie any more
            if node.status == "removed":
                affected.update((node.node, slot) for slot in self.reports.get(node.node, ()))
        for key in sorted(affected):
            self._judge_slot(key, position, at)

    def _report(self, node: str, slot: int, alloc: str) -> set[tuple[str, int]]:
        """Note a slot's report; the node's slots reporting that allocation."""
        self.reports.setdefault(node, {})[slot] = alloc
        slots = self.reporting.setdefault(alloc, {}).setdefault(node, set())
        slots.add(slot)
        return {(node, other) for other in slots}

    def _unreport(self, node: str, slot: int, alloc: str) -> set[tuple[str, int]]:
        """Forget a slot's report; the node's slots still reporting that allocation."""
        reported = self.reports[node]
        del reported[slot]
        if not reported:
            del self.reports[node]
        by_node = self.reporting[alloc]
        slots = by_node[node]
        slots.discard(slot)
        if not slots:
            del by_node[node]
            if not by_node:
                del self.reporting[alloc]
        return {(node, other) for other in slots}

    def _judge_slot(self, key: tuple[str, int], position: int, at: str) -> None:
        alloc_id = self.reports.get(key[0], {}).get(key[1])
        reason = None if alloc_id is None else self.zombie_reason(key, alloc_id)
        current = self.open["zombie_slots"].get(key)
        if current is not None and (
            current.fields["alloc"], current.fields["reason"]) == (alloc_id, reason):
            return
        if current is not None:
            self._end("zombie_slots", key, position, at)
        if reason is not None:
            self._begin("zombie_slots", key, Episode(
                {"node": key[0], "slot": key[1], "alloc": alloc_id, "reason": reason},
                "appeared", "cleared", position, at,
            ))

    def zombie_reason(self, key: tuple[str, int], alloc_id: str) -> str | None:
        """Why a reported slot is a zombie; the reasons of the ``zombie_slots`` view."""
        node, slot = key
        reporter = self.cluster.nodes.get(node)
        if reporter is not None and reporter.status == "removed":
            return None
        # (a name that is not text, only an edited log's report, was never placed)
        alloc: Allocation | None = (
            self.cluster.allocs[alloc_id] if type(alloc_id) is str else None)
        if alloc is None:
            return "unknown-alloc"
        if alloc.removed or alloc.terminal:
            return "released"
        here = alloc.node == node and alloc.slot == slot
        twice = len(self.reporting.get(alloc_id, {}).get(node, ())) > 1
        if twice and not here:
            return "duplicate"
        return None if here else "moved"

    def _addresses(self, changes: Changes, position: int, at: str) -> None:
        for hold in changes.held:
            if hold.state != "releasing" or hold.address in self.open["releasing_addresses"]:
                continue
            alloc = self.cluster.allocs[hold.alloc]
            self._begin("releasing_addresses", hold.address, Episode(
                {"address": hold.address, "alloc": hold.alloc, "node": hold.node,
                 "requested": None if alloc is None else alloc.desired_status},
                "requested", "released", position, at,
            ))
        for address in changes.released:
            episode = self.open["releasing_addresses"].get(address)
            if episode is None:
                continue
            alloc = self.cluster.allocs[episode.fields["alloc"]]
            outcome = None if alloc is None else alloc.client_status
            self._end("releasing_addresses", address, position, at, outcome=outcome)

    def _nodes(self, changes: Changes, record: Record, position: int, at: str) -> None:
        taken = []
        for node in changes.nodes:
            status, health = self.node_state.get(node.node, ("", "ok"))
            self.node_state[node.node] = (node.status, node.health)
            if node.health == "suspect" and health != "suspect":
                why = node.health_reason if record.rules >= HEALTH_REASON else None  # 2 kept none
                self._begin("suspects", node.node, Episode(
                    {"node": node.node, "reason": why or node.reason},
                    "suspect", "cleared", position, at,
                ))
            elif node.health != "suspect" and health == "suspect":
                self._end("suspects", node.node, position, at)
            if node.status in ("down", "removed") and status != node.status:
                taken.append(node)
        if not taken:
            return
        root = str(record.event.get("node") or taken[0].node)
        first = next((n for n in taken if n.node == root), taken[0])
        lost = sorted({s.alloc for s in changes.alloc_states if s.value == "lost"})
        self._note("downs", position, {
            "position": position, "at": at, "node": first.node, "status": first.status,
            "reason": first.reason,
            "cascade": sorted(n.node for n in taken if n is not first),
            "lost_allocs": lost,
        })


@fewer_collections()
def audit(
    store: Store, start: int | None = None, end: int | None = None, forget: bool = True,
) -> AuditReport:
    """Replay the log up to ``end`` and report what was unusual from ``start``
    on (``forget``: keep the allocations the replay is done with on disk)."""
    head = head_within(store, end, "--to")
    first = 1 if start is None else start
    last = head if end is None else end
    if first < 1:
        raise OutOfRange("--from", "the first position is 1")
    if first > last and head > 0:
        if end is None:
            raise OutOfRange("--from", f"position {first} is beyond the head of the log ({head})")
        if start is None:
            raise OutOfRange("--to", f"position {last} is before the first position (1)")
        raise OutOfRange("--from", f"position {first} is after --to {last}")
    auditor = Auditor(first, forget)
    try:
        for stored in gapless(store.read_log(0, last)):
            auditor.see(decode(stored))
        return AuditReport(first, last, head, auditor.finish())
    except BaseException:
        auditor.spill.close()
        raise
