"""The README's table of events says what the models accept."""

from __future__ import annotations

import re
from pathlib import Path

from ledger.events import EVENT_TYPES, fields_of

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_lists_every_event_type_with_its_fields():
    text = README.read_text(encoding="utf-8")
    table = text[text.index("| type | fields | what it records |"):].split("\n\n", 1)[0]
    rows = [row.split("|")[1:3] for row in table.splitlines()[2:]]
    listed = {}
    for kind, fields in rows:
        required, _, optional = fields.partition("[")
        listed[kind.strip(" `")] = (re.findall(r"`(\w+)`", required),
                                    re.findall(r"`(\w+)`", optional))
    assert listed == {kind: fields_of(kind) for kind in EVENT_TYPES}
