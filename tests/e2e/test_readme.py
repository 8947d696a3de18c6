"""The README's table of events says what the models accept, and its SQL
for reporting tools runs as written on both stores."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ledger.application import Ledger
from ledger.events import EVENT_TYPES, fields_of
from scripts.simulate import generate

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


def test_the_readmes_links_to_files_of_the_repository_resolve():
    linked = re.findall(r"\]\(([^)#:]+)\)", README.read_text(encoding="utf-8"))
    assert "docs/SPEC.md" in linked
    assert [path for path in linked if not (README.parent / path).is_file()] == []


def test_the_contract_in_the_repository_is_the_products_own():
    """``docs/SPEC.md`` is a copy of the product's contract, so that a checkout
    has it; where the product's is beside the checkout, they are the same."""
    product = README.parent.parent / "shared" / "SPEC.md"
    if not product.is_file():
        pytest.skip(f"the product's SPEC.md is not beside this checkout ({product})")
    assert (README.parent / "docs" / "SPEC.md").read_text(encoding="utf-8") == product.read_text(
        encoding="utf-8"), "the contract changed: read it, then copy it to docs/SPEC.md"


def test_the_readmes_python_example_runs_as_its_comments_say(tmp_path, monkeypatch):
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Python API"):]
    code = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    monkeypatch.chdir(tmp_path)  # its store: sqlite:///alloc-ledger.db, a new file
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md (Python API)", "exec"), scope)  # noqa: S102 - the README's own
    assert [r.status for r in scope["receipts"]] == ["appended", "appended"]
    receipt = scope["receipt"]
    assert "# ('appended', 3, None) on a new file" in code
    assert (receipt.status, receipt.position, receipt.error) == ("appended", 3, None)
    assert "# True, {'status': 'appended', ...}" in code
    assert receipt.ok and receipt.as_dict() == {"status": "appended", "position": 3, "error": None}
    # the questions, asked of the ledger the example above made
    asking = section.split("```python\n", 2)[2].split("\n```", 1)[0]
    exec(compile(asking, "README.md (Python API, questions)", "exec"), scope)  # noqa: S102
    assert "# [{'node': 'n1', 'status': 'ready', ...}]" in asking
    assert [(n["node"], n["status"]) for n in scope["nodes"]] == [("n1", "ready")]
    assert scope["waiting"] == [] and scope["a1"] is None
    assert "# ('initializing', 1)" in asking and scope["then"] == ("initializing", 1)


# -- the SQL for reporting tools runs as written, on both stores ----------------------

SPREAD = timedelta(seconds=0.3)  # the history's events 0.3 s apart: 15 minutes of 3,000
START = datetime(2026, 1, 1, tzinfo=UTC)


def sql_blocks() -> tuple[list[str], dict[str, tuple[str, str]]]:
    """The README's portable statements, and its table of the SQL that
    differs (what it is for -> the SQLite form, the PostgreSQL form)."""
    text = README.read_text(encoding="utf-8")
    portable = text[text.index("Queries that run unchanged on both stores"):]
    block = portable.split("```sql\n", 1)[1].split("\n```", 1)[0]
    statements = [s.strip() for s in re.sub(r"--[^\n]*", "", block).split(";") if s.strip()]
    table = text[text.index("| to | SQLite | PostgreSQL |"):].split("\n\n", 1)[0]
    differing = {}
    for row in table.splitlines()[2:]:
        purpose, sqlite_form, pg_form = (cell.strip() for cell in row.strip("|").split(" | "))
        differing[purpose] = tuple(
            re.fullmatch(r"`(.*)`", cell)[1].replace("\\|", "|")  # type: ignore[index]
            for cell in (sqlite_form, pg_form))
    return statements, differing


def spread_history() -> list[str]:
    """A simulated history spread over 15 minutes of 2026-01-01, then two
    allocations waiting to reconnect since ten minutes ago, one of them
    for longer than it may ("late"), the other not ("waiting"): the SQL
    that compares with the current time must tell them apart, also on the
    same day (where a text compared with ``datetime('now')`` would not)."""
    lines = []
    for n, event in enumerate(generate(3000, nodes=30, slots=3, seed=4)):
        event["at"] = (START + n * SPREAD).isoformat().replace("+00:00", "Z")
        lines.append(json.dumps(event))
    missed = (datetime.now(UTC) - timedelta(minutes=10)).isoformat()
    for alloc, seconds in (("late", 60), ("waiting", 3600)):
        node = f"n-{alloc}"
        lines += [json.dumps(e) for e in (
            {"type": "node-registered", "node": node, "slots": 1},
            {"type": "heartbeat", "node": node},
            {"type": "alloc-placed", "alloc": alloc, "node": node, "slot": 0,
             "max_disconnect": seconds},
            {"type": "alloc-updated", "alloc": alloc, "client_status": "running"},
            {"type": "heartbeat-missed", "node": node, "at": missed},
        )]
    return lines


@pytest.fixture(scope="module")
def two_stores(
    tmp_path_factory: pytest.TempPathFactory, pg_dsn: str
) -> Iterator[dict[str, Any]]:
    """The same history in a SQLite file and a PostgreSQL schema, each read
    with its own driver, as a reporting tool would."""
    dsn = pg_dsn
    path = tmp_path_factory.mktemp("readme") / "ledger.db"
    schema = f"t_{uuid.uuid4().hex[:16]}"
    urls = [f"sqlite:///{path}",
            f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}&projections=inline"]
    history = spread_history()
    for url in urls:
        with Ledger.open(url) as ledger:
            assert sum(r.status == "invalid" for r in ledger.submit_many(history)) == 0
    import psycopg

    lite = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    pg = psycopg.connect(dsn, autocommit=True)
    pg.execute(f"SET search_path TO {schema}")
    try:
        yield {"sqlite": lite, "postgresql": pg}
    finally:
        lite.close()
        pg.execute(f"DROP SCHEMA {schema} CASCADE")
        pg.close()


def answers(connection: Any, statement: str) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in connection.execute(statement).fetchall()]


def test_the_readme_s_portable_sql_gives_the_same_answers_on_both_stores(two_stores):
    statements, _ = sql_blocks()
    assert len(statements) == 7

    found = [(answers(two_stores["sqlite"], s), answers(two_stores["postgresql"], s))
             for s in statements]

    for statement, (lite, pg) in zip(statements, found, strict=True):
        assert lite == pg, statement
        assert lite, f"nothing to compare: {statement}"
    expired = {row[0] for row in found[1][0]}
    assert "late" in expired and "waiting" not in expired
    in_range = [at for (at,) in answers(two_stores["sqlite"], "SELECT at FROM alloc_states")
                if timedelta(minutes=5) <= datetime.fromisoformat(at) - START
                < timedelta(minutes=10)]
    assert found[0][0] == [(len(in_range),)]  # the text comparison is the time comparison


def test_the_readme_s_table_of_differing_sql_means_the_same_on_both_stores(two_stores):
    _, differing = sql_blocks()
    asked = {  # what each row is for -> a statement around its forms
        "seconds since 1970": "SELECT {} FROM alloc_states ORDER BY alloc, position",
        "current time": "SELECT alloc FROM allocations WHERE {} ORDER BY alloc",
        "field of a JSON column": "SELECT {} FROM rejections ORDER BY position",
        "count a JSON list": "SELECT node, {} FROM nodes ORDER BY node",
    }
    for purpose, (sqlite_form, pg_form) in differing.items():
        template = next(t for key, t in asked.items() if key in purpose)
        lite = answers(two_stores["sqlite"], template.format(sqlite_form))
        pg = answers(two_stores["postgresql"], template.format(pg_form))
        if "seconds" in purpose:  # SQLite's are whole seconds
            pg = [(int(value),) for (value,) in pg]
        assert lite == pg and lite, purpose
        if "current time" in purpose:
            assert ("late",) in lite and ("waiting",) not in lite
    assert len(differing) == len(asked)


# -- the usage block runs as written --------------------------------------------------


def test_the_usage_block_runs_as_pasted_into_a_shell(tmp_path: Path) -> None:
    """The README's first shell block under Usage, in an empty folder, with
    this environment's ``alloc-ledger`` on the PATH: every command exits 0."""
    text = README.read_text(encoding="utf-8")
    usage = text[text.index("## Usage"):]
    block = usage.split("```sh\n", 1)[1].split("\n```", 1)[0]
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "alloc-ledger").exists():
        pytest.skip(f"no alloc-ledger console script beside {sys.executable} (not installed)")
    env = {k: v for k, v in os.environ.items() if k != "ALLOC_LEDGER_STORE"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
    results = [json.loads(line) for line in done.stdout.splitlines()[:13]]
    assert [r["status"] for r in results] == ["appended"] * 5 + ["duplicate"] * 5 + ["appended"] * 3
    assert '"unknown_since_position": 5' in done.stdout  # needs-reconnect answers a1
