"""`mop passwd`: mosquitto_passwd's command line, on mop's password module."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import warnings

from mop.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail
from mop.security.password_store import read_password_file, write_password_file
from mop.security.passwords import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    PasswordFile,
    PasswordFileError,
    check_username,
    update_password_file,
)

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


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        return fail(exc, exc.code)
    except OSError as exc:
        return fail(f"{args.file}: {exc.strerror or exc}", EXIT_FAILED)
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
