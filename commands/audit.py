"""Audit commands: replay, verify, digest, audit (being built)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
