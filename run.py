#!/usr/bin/env python3
"""Quorum's command line from a checkout: `python run.py COMMAND ...` (docs/cli.md).

The commands live in quorum/cli.py; an installed Quorum has the same as its `quorum` command."""

from quorum.cli import cli

if __name__ == "__main__":
    cli()
