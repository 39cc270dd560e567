"""`python -m trainformer` = the `trainformer` command."""

from trainformer.cli import command

command()
