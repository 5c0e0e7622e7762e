"""`mop ban add|remove|list`: the banned client ids, user names and addresses of a running
deployment, kept in its table `mop.bans` and written through its Pulsar port."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import trio

from mop.backends.cluster.table_client import open_tables
from mop.cli.exits import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_config_argument,
    fail,
    with_settings,
)
from mop.processor.backend import BackendError
from mop.protocols.pulsar.client import cluster_client_auth
from mop.security.abuse import BANS_TABLE, Ban, BanKind, checked_ban, parse_ban_target
from mop.security.ban_store import BanStore
from mop.settings import Settings

# Seconds `mop ban` waits for the deployment (each request, and loading the bans).
BAN_TIMEOUT = 10.0
MAX_BAN_SECONDS = 100 * 365 * 86400


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ban = commands.add_parser(
        "ban",
        help="keep clients of a running deployment out, let them in again, list bans",
        description="Bans are kept in the deployment's table mop.bans, written through its"
        " Pulsar port (a merged node's, or the brokers' of a separated deployment): every node"
        " and proxy applies them at once.",
    )
    actions = ban.add_subparsers(title="actions", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="ban a client id, a user name or an address")
    _ban_target_arguments(add)
    add.add_argument(
        "--for",
        dest="duration",
        type=_ban_seconds,
        metavar="SECONDS",
        help="how long the ban lasts (default: until it is removed)",
    )
    add.add_argument("--reason", default="manual", help="why (default: manual)")
    add.set_defaults(command=with_settings(_ban_add))
    remove = actions.add_parser("remove", help="lift the ban of a client id, user or address")
    _ban_target_arguments(remove)
    remove.set_defaults(command=with_settings(_ban_remove))
    listing = actions.add_parser("list", help="print the bans in force")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(command=with_settings(_ban_list))
    for action in (add, remove, listing):
        action.add_argument(
            "--service-url",
            metavar="URL",
            help="the deployment's Pulsar service URL (default: from the settings, the node's"
            " Pulsar port, or cluster.service_url in separated mode)",
        )
        action.add_argument(
            "--timeout",
            type=_seconds,
            default=BAN_TIMEOUT,
            metavar="SECONDS",
            help=f"how long to wait for the deployment (default: {BAN_TIMEOUT:g})",
        )
        add_config_argument(action)


def _ban_target_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--clientid", metavar="ID", help="a client id")
    target.add_argument("--username", metavar="USER", help="a user name (a Pulsar role)")
    target.add_argument(
        "--address", metavar="IP[/PREFIX]", help="an IPv4 or IPv6 address, or a CIDR network"
    )


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return seconds


def _ban_seconds(text: str) -> float:
    seconds = _seconds(text)
    if seconds > MAX_BAN_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than 100 years: leave --for out for a ban until removed"
        )
    return seconds


def _ban_target(args: argparse.Namespace) -> tuple[BanKind, str]:
    """The kind and value the command names (ValueError when not valid)."""
    kind = next(k for k in ("clientid", "username", "address") if getattr(args, k) is not None)
    return parse_ban_target(kind, getattr(args, kind))


def _ban_add(settings: Settings, args: argparse.Namespace) -> int:
    now = time.time()
    until = None if args.duration is None else now + args.duration
    try:
        kind, value = _ban_target(args)
        ban = checked_ban(Ban(kind, value, until, args.reason, now))
    except ValueError as exc:
        return fail(exc, EXIT_USAGE)

    async def add(store: BanStore) -> int:
        stored = await store.add(ban)
        print(f"banned {stored.kind} {stored.value} {_until(stored)}")
        return EXIT_OK

    return _with_bans(settings, args, add)


def _ban_remove(settings: Settings, args: argparse.Namespace) -> int:
    try:
        kind, value = _ban_target(args)
    except ValueError as exc:
        return fail(exc, EXIT_USAGE)

    async def remove(store: BanStore) -> int:
        if not await store.remove(kind, value):
            return fail(f"no ban of {kind} {value}", EXIT_FAILED)
        print(f"lifted the ban of {kind} {value}")
        return EXIT_OK

    return _with_bans(settings, args, remove)


def _ban_list(settings: Settings, args: argparse.Namespace) -> int:
    async def show(store: BanStore) -> int:
        await trio.lowlevel.checkpoint()
        bans = store.bans.entries(time.time())
        if args.json:
            print(json.dumps([dataclasses.asdict(ban) for ban in bans], indent=2))
            return EXIT_OK
        rows = [("KIND", "VALUE", "UNTIL", "REASON")]
        rows += [(ban.kind, ban.value, _time(ban.until), ban.reason) for ban in bans]
        widths = [max(len(row[column]) for row in rows) for column in range(3)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            print("  ".join([*cells, row[3]]).rstrip())
        return EXIT_OK

    return _with_bans(settings, args, show)


def _time(when: float | None) -> str:
    if when is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(when, UTC)
    except (OverflowError, ValueError, OSError):  # beyond what a date can say
        return f"{when:g}"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _until(ban: Ban) -> str:
    return "until removed" if ban.until is None else f"until {_time(ban.until)}"


def _with_bans(
    settings: Settings, args: argparse.Namespace, action: Callable[[BanStore], Awaitable[int]]
) -> int:
    """Run `action` on the bans of the deployment the settings (or --service-url) name."""
    try:
        auth = cluster_client_auth(settings.cluster)
    except ValueError as exc:
        return fail(exc, EXIT_USAGE)
    service_url = args.service_url or _service_url(settings)

    async def run() -> int:
        async with open_tables(
            service_url,
            [BANS_TABLE],
            tenant=settings.default_tenant,
            namespace=settings.default_namespace,
            operation_timeout=args.timeout,
            auth=auth,
        ) as tables:
            return await action(BanStore(tables[BANS_TABLE]))

    try:
        return trio.run(run)
    except BackendError as exc:
        return fail(exc, EXIT_FAILED)


def _service_url(settings: Settings) -> str:
    """The Pulsar service URL of the deployment `settings` describe: a separated proxy's
    brokers, or the node's own Pulsar port."""
    if settings.mode == "separated" and settings.cluster.service_url:
        return settings.cluster.service_url
    host = settings.pulsar.host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"pulsar://{host}:{settings.pulsar.port}"
