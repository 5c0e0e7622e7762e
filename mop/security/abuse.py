"""Who is kept out, as pure rules: bans (of a client id, a user name, an address or a network),
the flapping rule and the limit of failed authentications per address. No I/O and no clock
(time comes in as `now`, seconds since the epoch); memory stays bounded whatever clients do."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, TypeAlias, get_args

__all__ = [
    "BANS_TABLE",
    "MAX_TRACKED",
    "MAX_VALUE_LENGTH",
    "Ban",
    "BanKind",
    "BanList",
    "FailureLimiter",
    "FlappingDetector",
    "ban_key",
    "checked_ban",
    "decode_ban",
    "encode_ban",
    "parse_ban_target",
]

# The table of the deployment's bans: key `ban_key(kind, value)`, value `encode_ban(ban)`.
BANS_TABLE: Final = "mop.bans"
# The longest client id, user name or address a ban may name (characters).
MAX_VALUE_LENGTH: Final = 1024
# Keys (client ids, addresses) the flapping detector and the failure limiter follow at most.
MAX_TRACKED: Final = 100_000

BanKind: TypeAlias = Literal["clientid", "username", "address"]
BAN_KINDS: Final[tuple[BanKind, ...]] = get_args(BanKind)

_IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
_IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

# Client ids longer than this are followed by a digest of theirs (see `FlappingDetector`).
_SHORT_KEY: Final = 64


@dataclass(frozen=True, slots=True)
class Ban:
    """One client id, user name or address (an IP, or a CIDR network: `value`) kept out until
    `until` (seconds since the epoch; None: until the ban is removed)."""

    kind: BanKind
    value: str
    until: float | None
    # Why: "manual" (an operator's), "flapping", "auth-failures"...
    reason: str = ""
    created_at: float = 0.0

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until


# -- targets and keys ----------------------------------------------------------------------


def _ip(text: str) -> _IPAddress | None:
    """The address in `text` as a listener reports a peer ("1.2.3.4", "::1", "[::1]",
    "fe80::1%eth0"), an IPv4-mapped IPv6 address as IPv4; None for anything else."""
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.partition("%")[0]  # an IPv6 zone names the local interface, not the peer
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _network(text: str) -> _IPNetwork:
    """The network a ban target names: an address (a network of one) or `address/prefix`,
    host bits cleared. Raises ValueError."""
    address, slash, prefix = text.strip().partition("/")
    ip = _ip(address)
    if ip is None or (slash and not (prefix.isascii() and prefix.isdigit())):
        raise ValueError(f"{text!r} is neither an IP address nor a CIDR network")
    if not slash:
        return ipaddress.ip_network(ip)
    length = int(prefix)
    mapped = isinstance(ip, ipaddress.IPv4Address) and ":" in address
    if mapped:
        # ::ffff:a.b.c.d/n names IPv4 addresses: clients connect from those as IPv4.
        if length < 96:
            raise ValueError(f"{text!r}: an IPv4-mapped network needs a prefix of 96 or more")
        length -= 96
    try:
        return ipaddress.ip_network((ip, length), strict=False)
    except ValueError:
        raise ValueError(f"{text!r}: prefix /{prefix} is too long") from None


def _network_text(network: _IPNetwork) -> str:
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)
    return str(network)


def parse_ban_target(kind: str, value: str) -> tuple[BanKind, str]:
    """Check what a ban names and return it in its one written form (an address or network
    normalised: "10.1.2.3/8" is "10.0.0.0/8", "::ffff:1.2.3.4" is "1.2.3.4"). Raises
    ValueError with a message for the operator."""
    if kind not in BAN_KINDS:
        raise ValueError(f"unknown ban kind {kind!r}: clientid, username or address")
    if not value:
        raise ValueError(f"the {kind} of a ban must not be empty")
    if len(value) > MAX_VALUE_LENGTH:
        raise ValueError(f"the {kind} of a ban is longer than {MAX_VALUE_LENGTH} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"the {kind} of a ban is not valid UTF-8 text") from None
    if kind == "address":
        return kind, _network_text(_network(value))
    return kind, value


def ban_key(kind: BanKind, value: str) -> str:
    """The key of a ban in `BANS_TABLE`: "clientid:abc", "address:10.0.0.0/8"... (the value
    normalised, see `parse_ban_target`, which raises ValueError)."""
    kind, value = parse_ban_target(kind, value)
    return f"{kind}:{value}"


def encode_ban(ban: Ban) -> bytes:
    record = {
        "kind": ban.kind,
        "value": ban.value,
        "until": ban.until,
        "reason": ban.reason,
        "created_at": ban.created_at,
    }
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode()


def checked_ban(ban: Ban) -> Ban:
    """`ban` as every node reads it back from the table (its target normalised); ValueError
    when they would not (a target that is not valid, a reason too long, a time that is not
    finite), so that no unreadable ban is written."""
    kind, value = parse_ban_target(ban.kind, ban.value)
    return decode_ban(f"{kind}:{value}", encode_ban(replace(ban, value=value)))


def _time(record: dict[str, Any], field: str, default: float | None) -> float | None:
    value = record.get(field, default)
    if value is None and field == "until":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"ban field {field!r} is not a time: {value!r:.40}")
    return float(value)


def decode_ban(key: str, value: bytes) -> Ban:
    """The ban `encode_ban` wrote under `key`. Raises ValueError for anything else (not JSON,
    a field missing or of the wrong type, a target that is not valid, another key's ban)."""
    try:
        record = json.loads(value)
    except ValueError:
        raise ValueError(f"ban {key!r:.80} is not JSON") from None
    if not isinstance(record, dict):
        raise ValueError(f"ban {key!r:.80} is not a JSON object")
    kind, target, reason = record.get("kind"), record.get("value"), record.get("reason", "")
    if not isinstance(kind, str) or not isinstance(target, str) or not isinstance(reason, str):
        raise ValueError(f"ban {key!r:.80}: kind, value and reason must be strings")
    if len(reason) > MAX_VALUE_LENGTH:
        raise ValueError(f"ban {key!r:.80}: the reason is too long")
    kind, target = parse_ban_target(kind, target)
    if f"{kind}:{target}" != key:
        raise ValueError(f"ban of {kind} {target!r:.80} stored under another key, {key!r:.80}")
    until = _time(record, "until", None)
    created_at = _time(record, "created_at", 0.0)
    assert created_at is not None
    return Ban(kind, target, until, reason, created_at)


# -- the ban list --------------------------------------------------------------------------


class _Networks:
    """Address bans of one IP version, by prefix length: matching an address costs a lookup
    per prefix length in use (one when only single addresses are banned; at most 33 for IPv4
    and 129 for IPv6), however many bans there are. The longest prefix is tried first."""

    __slots__ = ("_bits", "_by_length", "_lengths")

    def __init__(self, bits: int) -> None:
        self._bits = bits
        self._by_length: dict[int, dict[int, Ban]] = {}
        self._lengths: list[int] = []  # longest first

    def __bool__(self) -> bool:
        return bool(self._lengths)

    def _slot(self, network: _IPNetwork) -> tuple[int, int]:
        return network.prefixlen, int(network.network_address) >> (self._bits - network.prefixlen)

    def put(self, network: _IPNetwork, ban: Ban) -> None:
        length, prefix = self._slot(network)
        bans = self._by_length.get(length)
        if bans is None:
            bans = self._by_length[length] = {}
            self._lengths = sorted(self._by_length, reverse=True)
        bans[prefix] = ban

    def remove(self, network: _IPNetwork) -> None:
        length, prefix = self._slot(network)
        bans = self._by_length.get(length)
        if bans is None:
            return
        bans.pop(prefix, None)
        if not bans:
            del self._by_length[length]
            self._lengths = sorted(self._by_length, reverse=True)

    def match(self, address: int, now: float) -> Ban | None:
        bits, by_length = self._bits, self._by_length
        for length in self._lengths:
            ban = by_length[length].get(address >> (bits - length))
            if ban is not None and ban.active(now):
                return ban
        return None


class BanList:
    """The bans in force, indexed for `match` on every connect: a dictionary lookup for the
    client id and one for the user name, and for the address one per prefix length in use
    (see `_Networks`). It follows `BANS_TABLE` through `apply`."""

    def __init__(self) -> None:
        self._bans: dict[str, Ban] = {}  # by `ban_key`
        self._client_ids: dict[str, Ban] = {}
        self._usernames: dict[str, Ban] = {}
        self._v4 = _Networks(32)
        self._v6 = _Networks(128)

    def __len__(self) -> int:
        return len(self._bans)

    def put(self, ban: Ban) -> None:
        """Add `ban` (its target normalised), replacing any ban of the same target. Raises
        ValueError for a target that is not valid."""
        kind, value = parse_ban_target(ban.kind, ban.value)
        if value != ban.value:
            ban = replace(ban, value=value)
        key = f"{kind}:{value}"
        self._drop(key)
        self._bans[key] = ban
        if kind == "clientid":
            self._client_ids[value] = ban
        elif kind == "username":
            self._usernames[value] = ban
        else:
            network = _network(value)
            (self._v4 if network.version == 4 else self._v6).put(network, ban)

    def remove(self, kind: BanKind, value: str) -> bool:
        """Lift the ban of this target; whether there was one. Raises ValueError for a target
        that is not valid."""
        return self._drop(ban_key(kind, value))

    def apply(self, key: str, value: bytes | None) -> None:
        """Follow a change of `BANS_TABLE` (value None: the key was deleted). A value that is
        no ban leaves the key without one."""
        if value is not None:
            try:
                ban = decode_ban(key, value)
            except ValueError:
                pass
            else:
                self.put(ban)
                return
        self._drop(key)

    def _drop(self, key: str) -> bool:
        ban = self._bans.pop(key, None)
        if ban is None:
            return False
        if ban.kind == "clientid":
            del self._client_ids[ban.value]
        elif ban.kind == "username":
            del self._usernames[ban.value]
        else:
            network = _network(ban.value)
            (self._v4 if network.version == 4 else self._v6).remove(network)
        return True

    def match(
        self, *, client_id: str, username: str | None, address: str, now: float
    ) -> Ban | None:
        """The ban in force that keeps this client out, if any: of its client id, else of its
        user name, else of the longest banned network that holds its address ("1.2.3.4",
        "::1", "[::1]", "fe80::1%eth0"; an IPv4-mapped IPv6 address counts as IPv4)."""
        ban = self._client_ids.get(client_id)
        if ban is not None and ban.active(now):
            return ban
        if username is not None:
            ban = self._usernames.get(username)
            if ban is not None and ban.active(now):
                return ban
        if self._v4 or self._v6:
            ip = _ip(address)
            if ip is not None:
                networks = self._v4 if ip.version == 4 else self._v6
                return networks.match(int(ip), now)
        return None

    def entries(self, now: float) -> list[Ban]:
        """The bans in force, by kind and target."""
        active = [ban for ban in self._bans.values() if ban.active(now)]
        return sorted(active, key=lambda ban: (BAN_KINDS.index(ban.kind), ban.value))

    def expired_keys(self, now: float) -> list[str]:
        """The keys of bans that are over (for removal from the table)."""
        return [key for key, ban in self._bans.items() if not ban.active(now)]


# -- rates ---------------------------------------------------------------------------------


class _RecentEvents:
    """When each key's events of the last `window` seconds happened, for at most `capacity`
    keys: the key seen least recently is forgotten first, and keys whose events all left the
    window are forgotten as calls go by. (Users forget a key once it reaches their limit, so
    a key holds fewer events than that.)"""

    __slots__ = ("_capacity", "_times", "_window")

    def __init__(self, window: float, capacity: int) -> None:
        self._window = window
        self._capacity = capacity
        # In the order of each key's latest event (oldest first), while `now` does not go back.
        self._times: OrderedDict[str, list[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._times)

    def add(self, key: str, now: float) -> int:
        """Record an event of `key` at `now`; how many it has had in the window up to now."""
        horizon = now - self._window
        self._prune(horizon)
        times = self._times.get(key)
        if times is None:
            times = self._times[key] = []
            if len(self._times) > self._capacity:
                self._times.popitem(last=False)
        else:
            self._times.move_to_end(key)
            stale = 0
            while stale < len(times) and times[stale] <= horizon:
                stale += 1
            del times[:stale]
        times.append(now)
        return len(times)

    def forget(self, key: str) -> None:
        self._times.pop(key, None)

    def _prune(self, horizon: float) -> None:
        times = self._times
        while times:
            key, first = next(iter(times.items()))
            if first[-1] > horizon:
                return
            del times[key]


class FlappingDetector:
    """EMQX's flapping rule: a client id that connects `max_count` times within `window`
    seconds is banned for `ban_time` seconds.

    Client ids up to 64 characters are followed as they are, longer ones by a digest (so a
    followed key costs little memory); ids that no ban can name (empty, or longer than
    `MAX_VALUE_LENGTH`) are not followed.
    """

    def __init__(
        self, max_count: int, window: float, ban_time: float, *, capacity: int = MAX_TRACKED
    ) -> None:
        if max_count < 1 or window <= 0 or ban_time <= 0 or capacity < 1:
            raise ValueError("flapping: max_count, window, ban_time must be positive")
        self.max_count = max_count
        self.window = window
        self.ban_time = ban_time
        self._connects = _RecentEvents(window, capacity)

    def __len__(self) -> int:
        """How many client ids are followed."""
        return len(self._connects)

    def connected(self, client_id: str, now: float) -> Ban | None:
        """Count a connect of `client_id` at `now`; the ban to impose when this one is the
        `max_count`-th within the window (the count then starts again)."""
        if not client_id or len(client_id) > MAX_VALUE_LENGTH:
            return None
        key = client_id
        if len(client_id) > _SHORT_KEY:
            # U+0000 is in no MQTT string: no short id looks like a digest.
            digest = hashlib.blake2b(client_id.encode("utf-8", "surrogatepass"), digest_size=16)
            key = "\x00" + digest.hexdigest()
        if self._connects.add(key, now) < self.max_count:
            return None
        self._connects.forget(key)
        return Ban("clientid", client_id, now + self.ban_time, "flapping", now)


class FailureLimiter:
    """Failed authentications per address: `max_failures` of them within `window` seconds
    block the address for `block_time` seconds (0 failures: no limit). Loopback is no
    exception. A client address that is no IP address is not limited."""

    def __init__(
        self,
        max_failures: int,
        window: float,
        block_time: float,
        *,
        capacity: int = MAX_TRACKED,
    ) -> None:
        if max_failures < 0 or (max_failures and (window <= 0 or block_time <= 0)):
            raise ValueError("failure limit: max_failures >= 0, window and block_time > 0")
        if capacity < 1:
            raise ValueError("failure limit: capacity must be positive")
        self.max_failures = max_failures
        self.block_time = block_time
        self._capacity = capacity
        self._failures = _RecentEvents(window, capacity)
        # Address -> when its block ends, in the order blocks were imposed.
        self._blocked: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        """How many addresses are followed (failing or blocked)."""
        return len(self._failures) + len(self._blocked)

    def failed(self, address: str, now: float) -> bool:
        """Count a failed authentication from `address` at `now`; True when it is the one that
        blocks the address (it is blocked from now on)."""
        if not self.max_failures:
            return False
        ip = _ip(address)
        if ip is None:
            return False
        key = str(ip)
        self._unblock_expired(now)
        if key in self._blocked or self._failures.add(key, now) < self.max_failures:
            return False
        self._failures.forget(key)
        self._blocked[key] = now + self.block_time
        if len(self._blocked) > self._capacity:
            self._blocked.popitem(last=False)
        return True

    def blocked(self, address: str, now: float) -> bool:
        """Whether `address` is blocked at `now`."""
        if not self._blocked:
            return False
        ip = _ip(address)
        if ip is None:
            return False
        until = self._blocked.get(str(ip))
        if until is None:
            return False
        if until <= now:
            del self._blocked[str(ip)]
            return False
        return True

    def succeeded(self, address: str) -> None:
        """Forget the failures of `address` (a block in force stays)."""
        ip = _ip(address)
        if ip is not None:
            self._failures.forget(str(ip))

    def _unblock_expired(self, now: float) -> None:
        blocked = self._blocked
        while blocked:
            key, until = next(iter(blocked.items()))
            if until > now:
                return
            del blocked[key]
