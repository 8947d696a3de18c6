"""The named errors of the ledger, in one small tree."""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every error the ledger reports on purpose."""


class InvalidEvent(LedgerError):
    """The input is not a well-formed event: reported, never kept."""


class StoreUnavailable(LedgerError):
    """The store cannot be opened, reached or written."""


class NotKept(StoreUnavailable):
    """A write transaction failed before it committed: the store kept nothing
    of it (a retry is a new submission, not a duplicate)."""


class LedgerClosed(LedgerError):
    """A ledger used after ``close()``: open another."""


class LockWaitedOut(StoreUnavailable):
    """Another transaction held a lock longer than this one would wait."""


class RelationsBusy(LockWaitedOut):
    """A table or view a repair makes again is locked by another session (a
    reporting tool's open transaction): the repair lets the log's lock go,
    so writers go on, and tries again."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.relations: list[str] = []  # those it was making again, where known


class NeedsNewerRelease(StoreUnavailable):
    """A store a newer alloc-ledger wrote what this one cannot use: no wait or
    reconnection brings it back, only an upgrade."""


class MadeByNewer(NeedsNewerRelease):
    """A store whose schema a newer alloc-ledger made: this one may not touch it."""

    def __init__(self, url: str, version: int, known: int) -> None:
        super().__init__(
            f"cannot open store {url}: it was made by a newer alloc-ledger "
            f"(schema version {version}, this one knows {known}): upgrade"
        )


class RulesTooNew(NeedsNewerRelease):
    """A kept event decided by rules newer than this release knows: this one
    may not apply it (as a store made by a newer release: exit 3)."""

    def __init__(self, position: int, rules: int, known: int) -> None:
        super().__init__(
            f"the kept event at position {position} was decided by rules {rules}, newer "
            f"than this alloc-ledger's ({known}): upgrade alloc-ledger to apply it"
        )


class LogEdited(LedgerError):
    """The log, its chain hashes or its id index are not as they were kept:
    something edited them (or a bug did). ``alloc-ledger verify`` says where."""


class Refused(LogEdited):
    """A kept event that its own rules refuse when the log is replayed: it was
    decided against tables that did not match the log before it."""

    def __init__(self, position: int, violation: LedgerError) -> None:
        super().__init__(
            f"the kept event at position {position} was appended, but replaying the log "
            f"refuses it ({violation}): it was decided against tables that did not match "
            "the log (were they edited?); alloc-ledger verify checks the log itself"
        )
        self.position = position
        self.violation = violation


class TablesDisagree(LogEdited):
    """Projection tables that cannot apply a kept event: they hold more, or
    other, than the log up to their tracking position."""

    def __init__(self, refused: Refused, tracked: int) -> None:
        super().__init__(
            f"the projection tables cannot apply the kept event at position "
            f"{refused.position} ({refused.violation}): they do not match the log up to "
            f"their tracking position {tracked} (was it lowered, or were they edited?); "
            "alloc-ledger verify checks the log itself, and replay --repair makes the tables "
            "again from it"
        )


class NotADigest(LedgerError):
    """Text given as a head of the chain that is not ``POSITION:HASH``."""


class SpillFailed(LedgerError):
    """What a replay keeps on disk (an audit's findings, the allocations it
    is done with) could not be kept in its temporary file (the disk holding
    it is full, or it cannot be made there)."""

    def __init__(self, why: str) -> None:
        super().__init__(
            f"cannot keep the replay's work in a temporary file ({why}): give it room, or "
            "set TMPDIR (or SQLITE_TMPDIR) to a directory with room; nothing was changed"
        )


class GrantRefused(LedgerError):
    """A role the ledger may not make a reporting role, or may not grant to."""


class LogEndsEarly(LogEdited):
    """The log ended before a head it is known to have had (when a catch-up
    began, or as far as the projection tables have applied it): its last
    events were deleted. Nothing after ``end`` is taken as applied."""

    def __init__(self, end: int, head: int, known: str = "") -> None:
        before = {
            "chained": f"position {head}, whose chain hash is kept",
            "applied": f"position {head}, which the projection tables have applied",
            "reported": f"position {head}, which this writer appended and reported",
        }.get(known, f"its head {head} when this began")
        unless = {
            "applied": " (or the tracking row was raised by hand: alloc-ledger replay "
                       "--repair sets it to the log's head)",
            "reported": " (or an older copy of the store was restored over it while this "
                        "writer had it open: what it reported since that copy is not kept)",
        }.get(known, "")
        super().__init__(
            f"the log ends at position {end}, before {before}: its last events were "
            f"deleted{unless}; alloc-ledger verify checks whether the log was edited"
        )


class Unchained(LogEdited):
    """A kept event without its chain hash: alloc-ledger appends the two in
    one transaction, so something else wrote it into the log."""

    def __init__(self, position: int) -> None:
        super().__init__(
            f"the kept event at position {position} has no chain hash: alloc-ledger did not "
            "append it (something wrote it into the log), so the projection tables do not "
            "take it; alloc-ledger verify checks the log"
        )


class BadOption(LedgerError):
    """A value of a command-line option the ledger cannot use (a time without
    a zone, a position the log does not hold): a usage error of ``option``."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


class OutOfRange(BadOption):
    """A position given for a range of history that the log does not hold."""


class Unreadable(LogEdited):
    """A kept event that cannot be read as the ledger keeps one: its stored
    JSON, or the event in it, is not as the ledger wrote it (``problem``
    says how, in the ledger's words: ``ledger.readable``)."""

    def __init__(self, position: int | None, problem: str) -> None:
        where = "a kept event" if position is None else f"the kept event at position {position}"
        super().__init__(
            f"{where} cannot be read: {problem}; alloc-ledger verify checks whether the log "
            "was edited"
        )
        self.position = position
        self.problem = problem


class HistoryIncomplete(LogEdited):
    """A history searched in a log that lacks positions (deleted), or whose
    search found events that cannot be read: what it lists may not be all."""

    def __init__(
        self, entity: str, upto: int | None, missing: list[tuple[int, int]],
        unreadable: list[Unreadable],
    ) -> None:
        parts = []
        if missing:
            count = sum(last - first + 1 for first, last in missing)
            parts.append(f"{spans(missing)} {'is' if count == 1 else 'are'} missing from the log")
        if len(unreadable) == 1:
            parts.append(f"the kept event at position {unreadable[0].position} cannot be read "
                         f"({unreadable[0].problem})")
        elif unreadable:
            at = [str(error.position) for error in unreadable]
            parts.append(f"{len(unreadable)} kept events that may name it cannot be read (at "
                         f"positions {first_few(at)}; the first: {unreadable[0].problem})")
        when = "" if upto is None else f" up to position {upto}"
        super().__init__(
            f"the history of {entity}{when} may be incomplete: {'; '.join(parts)}; "
            "alloc-ledger verify checks whether the log was edited"
        )


class PositionMissing(LogEdited):
    """Positions are gapless: one that is not in the log was deleted."""

    def __init__(self, position: int, found: int, hint: str = "") -> None:
        super().__init__(
            f"position {position} is missing from the log (the next kept event is at {found}){hint}"
        )


class RuleViolation(LedgerError):
    """A rule refused the event: it is kept in the rejection log."""


class NodeNotRegistered(RuleViolation):
    def __init__(self, node: str) -> None:
        super().__init__(f"node {node} is not registered")


class NodeAlreadyRegistered(RuleViolation):
    def __init__(self, node: str) -> None:
        super().__init__(f"node {node} is already registered")


class NodeRemoved(RuleViolation):
    def __init__(self, node: str) -> None:
        super().__init__(f"node {node} has been removed")


class ParentUnavailable(RuleViolation):
    def __init__(self, parent: str, status: str) -> None:
        super().__init__(f"parent node {parent} is {status}")


class NodeNotReady(RuleViolation):
    def __init__(self, node: str, status: str) -> None:
        super().__init__(f"node {node} is not ready (status {status}); it takes no placements")


class NodeSuspect(RuleViolation):
    def __init__(self, node: str) -> None:
        super().__init__(f"node {node} is suspect; it takes no placements")


class SlotOutOfRange(RuleViolation):
    def __init__(self, node: str, slot: int, slots: int) -> None:
        super().__init__(f"slot {node}#{slot} is out of range (node {node} has {counted(slots, 'slot')})")


class SlotHeld(RuleViolation):
    def __init__(self, node: str, slot: int, holder: str) -> None:
        super().__init__(f"slot {node}#{slot} is already held by allocation {holder}")


class SlotReportInvalid(RuleViolation):
    pass


# Fields named in the plural: "its addresses differ", as "its slot and job differ".
PLURAL_FIELDS = ("addresses", "slots")


def first_few(names: list[str], most: int = 3) -> str:
    """``a, b, c, …``: the first few of a list a message names."""
    return ", ".join(names[:most]) + (", …" if len(names) > most else "")


def spans(ranges: list[tuple[int, int]], most: int = 3) -> str:
    """``position 7``, ``positions 7 to 9, 12 and 20``: positions in ranges
    (first, last), the first few named, with how many in all past them."""
    count = sum(last - first + 1 for first, last in ranges)
    named = [str(first) if first == last else f"{first} to {last}" for first, last in ranges]
    if count == 1:
        return f"position {named[0]}"
    if len(named) > most:
        return f"positions {', '.join(named[:most])}, … ({count} in all)"
    listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    return f"positions {listed}"


def counted(count: int, noun: str) -> str:
    """``1 slot``, ``2 slots``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def differ(fields: list[str]) -> str:
    """The verb after fields named as differing: "differs" after one named in
    the singular, "differ" otherwise."""
    return "differs" if len(fields) == 1 and fields[0] not in PLURAL_FIELDS else "differ"


class AllocationExists(RuleViolation):
    pass


class AllocationNotPlaced(RuleViolation):
    def __init__(self, alloc: str) -> None:
        super().__init__(f"allocation {alloc} is not placed")


class AllocationRemoved(RuleViolation):
    def __init__(self, alloc: str) -> None:
        super().__init__(f"allocation {alloc} has been removed")


class AddressHeld(RuleViolation):
    def __init__(self, address: str, holder: str) -> None:
        super().__init__(
            f"address {address} is still held by allocation {holder}, which has not shut down"
        )


class NodeMayNotUpdate(RuleViolation):
    def __init__(self, node: str, status: str) -> None:
        super().__init__(f"node {node} is not allowed to update allocs while in status {status}")


class TerminalStatusFinal(RuleViolation):
    def __init__(self, alloc: str, status: str) -> None:
        super().__init__(f"allocation {alloc} is {status}; a terminal status never changes")


class DesiredStatusBackwards(RuleViolation):
    def __init__(self, alloc: str, current: str, wanted: str) -> None:
        super().__init__(
            f"allocation {alloc} is already desired {current}; "
            f"desired status only moves forward (run, stop, remove), not to {wanted}"
        )


class RemovedBeforeShutdown(RuleViolation):
    def __init__(self, alloc: str, status: str, holds: str) -> None:
        super().__init__(
            f"allocation {alloc} is {status}; removing it now would free {holds} "
            "before it shuts down"
        )
