"""The `mop` command: run a node (`mop run`), show the effective settings (`mop config`), manage
a password file (`mop passwd`), ban clients of a running deployment (`mop ban add|remove|list`).

Exit codes (`mop.cli.exits`): 0 after a clean stop (or a command done), 1 when the node cannot
start or a command cannot be carried out, 2 for bad settings or usage.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import signal

import trio

from mop.cli import bans, passwd
from mop.cli.exits import (
    EXIT_OK,
    EXIT_STARTUP_FAILED,
    EXIT_USAGE,
    Command,
    add_config_argument,
    fail,
    with_settings,
)
from mop.config import dump_settings, hide_secrets, settings_document
from mop.exception_groups import leaves
from mop.observability.logs import configure_logging
from mop.settings import Settings
from mop.version import VERSION

__all__ = ["main"]

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: `sys.argv[1:]`) and return the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        # argparse has already printed the help, the version or the usage error.
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    command: Command = args.command
    return command(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mop",
        description="MQTT and Pulsar messaging broker.",
        epilog="Settings: embedded defaults, ./settings.toml, --config FILE, then MOP_* variables.",
    )
    parser.add_argument("--version", action="version", version=f"mop {VERSION}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    run = commands.add_parser("run", help="run a node until SIGINT or SIGTERM")
    run.set_defaults(command=with_settings(_run))

    show = commands.add_parser("config", help="print the effective settings")
    show.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    show.add_argument(
        "--show-secrets", action="store_true", help="print secrets (JWT secret, passwords) too"
    )
    show.set_defaults(command=with_settings(_show_config))
    for command in (run, show):
        add_config_argument(command)
    bans.add_parser(commands)
    passwd.add_parser(commands)
    return parser


def _show_config(settings: Settings, args: argparse.Namespace) -> int:
    if not args.show_secrets:
        settings = hide_secrets(settings)
    if args.json:
        print(json.dumps(settings_document(settings), indent=2))
    else:
        print(dump_settings(settings), end="")
    return EXIT_OK


def _run(settings: Settings, args: argparse.Namespace) -> int:
    # The node (OpenTelemetry, the HTTP server, the protocols) is imported only to run one:
    # `mop ban`, `mop passwd` and `mop config` start in a fraction of the time without it.
    from mop.node import StartupError

    configure_logging(settings.log_level, settings.log_format)
    # A node holds many long-lived objects per connection; with the default thresholds full
    # collections walk all of them again and again (a quarter of the CPU of a connection
    # storm). What exists at startup never becomes garbage: keep it out of collections, and
    # collect the young generation less often. (This is the process's choice, so it is made
    # here and not where a node may be embedded.)
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    failures: list[BaseException] = []
    try:
        trio.run(_serve, settings)
    except* StartupError as group:
        failures.extend(leaves(group))
    except* KeyboardInterrupt:
        # Ctrl-C before the signal handlers are installed: stop quietly, as a later one would.
        pass
    for failure in failures:
        fail(failure, EXIT_STARTUP_FAILED)
    return EXIT_STARTUP_FAILED if failures else EXIT_OK


async def _serve(settings: Settings) -> None:
    from mop.node import serve_node

    async with trio.open_nursery() as nursery:
        await nursery.start(_cancel_on_signal, nursery.cancel_scope)
        await nursery.start(serve_node, settings)


async def _cancel_on_signal(
    scope: trio.CancelScope, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Cancel `scope` (stopping the node) at the first SIGINT or SIGTERM."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            logger.info("received %s, stopping", signal.Signals(signum).name)
            scope.cancel()
            return
