"""``alloc-ledger demo`` (placeholder until the stories land)."""

import click


@click.command()
def demo() -> None:
    """Run the built-in stories on a fresh store and print each answer."""
    raise click.ClickException("the demo is not built yet")


COMMANDS = [demo]
