"""Running the command line in tests through click's ``CliRunner``."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner, Result

from commands.cli import cli


def invoke(args: list[str], code: int = 0, input: str | bytes | None = None, **kw: Any) -> Result:
    """Run the CLI as ``alloc-ledger``; check the exit code, and that nothing
    ever shows a traceback (an error is one line and an exit code)."""
    result = CliRunner().invoke(cli, args, input=input, prog_name="alloc-ledger", **kw)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result
