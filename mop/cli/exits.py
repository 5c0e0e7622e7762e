"""Exit codes and one-line errors shared by the `mop` commands.

0: done (a node: after a clean stop); 1: the node cannot start, or a command cannot be carried
out (the deployment does not answer, there is no such ban); 2: bad settings or usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from mop.config import ConfigError, load_settings
from mop.settings import Settings

EXIT_OK = 0
EXIT_STARTUP_FAILED = 1
EXIT_FAILED = 1  # a command that could not be carried out
EXIT_USAGE = 2

Command = Callable[[argparse.Namespace], int]


def fail(error: object, code: int) -> int:
    """Print `error` as one `mop: error:` line and return `code`."""
    print(f"mop: error: {error}", file=sys.stderr)
    return code


def with_settings(command: Callable[[Settings, argparse.Namespace], int]) -> Command:
    """`command` run with the settings that `--config` and the environment give."""

    def load_and_run(args: argparse.Namespace) -> int:
        try:
            settings = load_settings(args.config)
        except ConfigError as exc:
            return fail(exc, EXIT_USAGE)
        return command(settings, args)

    return load_and_run


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="settings file (TOML) overriding ./settings.toml"
    )
