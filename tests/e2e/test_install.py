"""What a user of a plain (non-editable) install meets (helper-302): the
PostgreSQL driver is an extra, and the package's type hints reach the
user's type checker."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# ``pip install alloc-ledger`` without its [postgres] extra: the package absent.
WITHOUT = (
    "import sys; sys.modules[{package!r}] = None; sys.argv[0] = 'alloc-ledger'; "
    "from commands.console import main; main()"
)


@pytest.mark.parametrize("package", ["psycopg", "psycopg_pool"])
@pytest.mark.parametrize("args", [
    ["query", "nodes"], ["submit", "heartbeat", "--node", "n1"], ["verify"],
], ids=" ".join)
def test_a_postgresql_store_without_its_driver_is_one_line_exit_3(
    tmp_path: Path, package: str, args: list[str],
) -> None:
    """Was 'internal error: ModuleNotFoundError: No module named 'psycopg'', exit 1."""
    url = "postgresql://nobody:secret@127.0.0.1:1/none?schema=unused"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT.format(package=package), "--store", url, *args],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "", (
        "Error: cannot open store postgresql://nobody:***@127.0.0.1:1/none?schema=unused: "
        f"a PostgreSQL store needs the {package} package, not installed here: "
        "pip install 'alloc-ledger[postgres]'\n")), done


def test_the_packages_are_marked_typed() -> None:
    """README: tools build events with type checking (``ledger.events``'s
    TypedDicts); mypy skips an installed package without ``py.typed``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = project["tool"]["setuptools"].get("package-data", {})
    for package in ("ledger", "projections"):
        assert (ROOT / package / "py.typed").is_file(), package
        assert "py.typed" in data.get(package, []), package
