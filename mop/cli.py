"""The `mop` command: run a node (`mop run`), show the effective settings (`mop config`), manage
a password file (`mop passwd`).

Exit codes: 0 on success (a node: after a clean stop), 1 when the node cannot start or the
command fails, 2 for bad settings or usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import getpass
import json
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable

import trio

from mop.config import ConfigError, dump_settings, load_settings
from mop.exception_groups import leaves
from mop.node import StartupError, serve_node
from mop.security.password_store import read_password_file, write_password_file
from mop.security.passwords import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    PasswordFile,
    PasswordFileError,
    check_username,
    update_password_file,
)
from mop.settings import Settings
from mop.version import VERSION

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_STARTUP_FAILED = EXIT_FAILED
EXIT_USAGE = 2
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

logger = logging.getLogger(__name__)

Command = Callable[[argparse.Namespace], int]


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


def _with_settings(command: Callable[[Settings, argparse.Namespace], int]) -> Command:
    """`command` run with the settings that `--config` and the environment give."""

    def load_and_run(args: argparse.Namespace) -> int:
        try:
            settings = load_settings(args.config)
        except ConfigError as exc:
            return _fail(exc, EXIT_USAGE)
        return command(settings, args)

    return load_and_run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mop",
        description="MQTT and Pulsar messaging broker.",
        epilog="Settings: embedded defaults, ./settings.toml, --config FILE, then MOP_* variables.",
    )
    parser.add_argument("--version", action="version", version=f"mop {VERSION}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    run = commands.add_parser("run", help="run a node until SIGINT or SIGTERM")
    run.set_defaults(command=_with_settings(_run))

    show = commands.add_parser("config", help="print the effective settings")
    show.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    show.set_defaults(command=_with_settings(_show_config))

    for command in (run, show):
        command.add_argument(
            "--config", metavar="FILE", help="settings file (TOML) overriding ./settings.toml"
        )
    _add_passwd(commands)
    return parser


def _fail(error: object, code: int) -> int:
    print(f"mop: error: {error}", file=sys.stderr)
    return code


def _show_config(settings: Settings, args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(dataclasses.asdict(settings), indent=2))
    else:
        print(dump_settings(settings), end="")
    return EXIT_OK


def _run(settings: Settings, args: argparse.Namespace) -> int:
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
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
        _fail(failure, EXIT_STARTUP_FAILED)
    return EXIT_STARTUP_FAILED if failures else EXIT_OK


async def _serve(settings: Settings) -> None:
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


# `mop passwd`: mosquitto_passwd's command line, on mop's password module.

PASSWD_HELP = "add, change or delete a user of a password file (mosquitto format)"
PASSWD_DESCRIPTION = (
    "Set USER's password in FILE, a mosquitto-compatible password file (PBKDF2-SHA512, $7$), "
    "or delete USER with -D. The password is asked twice on the terminal, unless -b or "
    "--stdin says where to take it from. Other lines of the file are kept as they are."
)


class _CommandError(Exception):
    """A failure `mop passwd` reports in one line (with the exit code it calls for)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def _add_passwd(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    passwd = commands.add_parser("passwd", help=PASSWD_HELP, description=PASSWD_DESCRIPTION)
    passwd.add_argument(
        "-c", dest="create", action="store_true", help="create FILE, overwriting an existing one"
    )
    passwd.add_argument("-D", dest="delete", action="store_true", help="delete USER")
    passwd.add_argument(
        "-b",
        dest="batch",
        action="store_true",
        help="take PASSWORD from the command line (other users of the host may see it)",
    )
    passwd.add_argument(
        "--stdin", action="store_true", help="read the password from the first line of stdin"
    )
    passwd.add_argument(
        "--iterations",
        type=_iterations,
        default=DEFAULT_ITERATIONS,
        metavar="N",
        help=f"PBKDF2 iterations (default: {DEFAULT_ITERATIONS}, as mosquitto_passwd)",
    )
    passwd.add_argument("file", metavar="FILE")
    passwd.add_argument("user", metavar="USER")
    passwd.add_argument("password", metavar="PASSWORD", nargs="?", help="with -b only")
    passwd.set_defaults(command=_passwd)


def _iterations(text: str) -> int:
    try:
        iterations = int(text)
    except ValueError:
        iterations = 0
    if not 0 < iterations <= MAX_ITERATIONS:
        raise argparse.ArgumentTypeError(
            f"must be an integer between 1 and {MAX_ITERATIONS} (got {text!r})"
        )
    return iterations


def _passwd(args: argparse.Namespace) -> int:
    try:
        _check_passwd_usage(args)
        text = "" if args.create else _read_existing(args.file, args.user, delete=args.delete)
        password = None if args.delete else _password(args)
        try:
            text = update_password_file(text, args.user, password, iterations=args.iterations)
        except KeyError:  # _read_existing has looked already; this keeps the message one line
            raise _CommandError(f"{args.file}: no user {args.user!r}") from None
        write_password_file(args.file, text)
    except _CommandError as exc:
        return _fail(exc, exc.code)
    except OSError as exc:
        return _fail(f"{args.file}: {exc.strerror or exc}", EXIT_FAILED)
    return EXIT_OK


def _check_passwd_usage(args: argparse.Namespace) -> None:
    conflicts = [
        (args.create and args.delete, "-c and -D cannot be used together"),
        (args.batch and args.stdin, "-b and --stdin cannot be used together"),
        (args.delete and (args.batch or args.stdin), "-D takes no password"),
        (args.batch and args.password is None, "-b needs a PASSWORD argument"),
        (not args.batch and args.password is not None, "PASSWORD is taken with -b only"),
    ]
    for conflict, message in conflicts:
        if conflict:
            raise _CommandError(message, EXIT_USAGE)
    try:
        check_username(args.user)
    except ValueError as exc:
        raise _CommandError(str(exc), EXIT_USAGE) from None


def _read_existing(path: str, user: str, *, delete: bool) -> str:
    """The text of the password file to change, checked before any password is asked for."""
    try:
        text = read_password_file(path)
    except FileNotFoundError:
        raise _CommandError(f"{path}: no such file (-c creates it)") from None
    try:
        passwords = PasswordFile.parse(text)
    except PasswordFileError as exc:
        raise _CommandError(f"{path}: {exc}") from None
    for warning in passwords.warnings:
        print(f"mop: warning: {path}: {warning}", file=sys.stderr)
    if delete and user not in passwords:
        raise _CommandError(f"{path}: no user {user!r}")
    return text


def _password(args: argparse.Namespace) -> bytes:
    if args.batch:
        # The argument's bytes as the command line gave them, whatever the locale.
        password = os.fsencode(args.password)
    elif args.stdin:
        line = sys.stdin.buffer.readline()
        if not line:
            raise _CommandError("no password on standard input")
        password = line.removesuffix(b"\n").removesuffix(b"\r")
    else:
        password = _prompt_password()
    if not password:
        raise _CommandError("the password is empty")
    return password


def _prompt_password() -> bytes:
    try:
        with warnings.catch_warnings():
            # Without a terminal, getpass would warn and read the password with echo on.
            warnings.simplefilter("error", getpass.GetPassWarning)
            first = getpass.getpass("Password: ")
            second = getpass.getpass("Reenter password: ")
    except getpass.GetPassWarning:
        raise _CommandError("no terminal to ask for the password on (use -b or --stdin)") from None
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)
        raise _CommandError("no password entered") from None
    if first != second:
        raise _CommandError("the passwords do not match")
    return first.encode("utf-8", "surrogateescape")
