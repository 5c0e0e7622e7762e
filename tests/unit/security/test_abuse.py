"""The pure rules of abuse protection: ban targets and keys, the ban record, matching a client
against the ban list (client id, user name, IPv4 and IPv6 addresses and networks), expiry, the
flapping rule and the limit of failed authentications, with bounded memory under a flood."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mop.security.abuse import (
    MAX_VALUE_LENGTH,
    Ban,
    BanList,
    FailureLimiter,
    FlappingDetector,
    ban_key,
    checked_ban,
    decode_ban,
    encode_ban,
    parse_ban_target,
)

# -- targets and keys ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given_value", "normal"),
    [
        ("1.2.3.4", "1.2.3.4"),
        ("1.2.3.4/32", "1.2.3.4"),
        ("10.1.2.3/8", "10.0.0.0/8"),  # host bits cleared
        ("0.0.0.0/0", "0.0.0.0/0"),
        (" 192.168.0.0/16 ", "192.168.0.0/16"),
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("2001:DB8:0:0::1", "2001:db8::1"),
        ("2001:db8::1/128", "2001:db8::1"),
        ("2001:db8:ff::/32", "2001:db8::/32"),
        ("fe80::1%eth0", "fe80::1"),
        ("::ffff:1.2.3.4", "1.2.3.4"),  # IPv4-mapped: the IPv4 address
        ("::ffff:10.1.2.3/104", "10.0.0.0/8"),
    ],
)
def test_an_address_target_is_normalised(given_value: str, normal: str) -> None:
    assert parse_ban_target("address", given_value) == ("address", normal)
    assert ban_key("address", given_value) == f"address:{normal}"


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        ("address", "example.com", "neither an IP address nor a CIDR network"),
        ("address", "1.2.3.4/33", "prefix /33 is too long"),
        ("address", "1.2.3.4/", "neither an IP address nor a CIDR network"),
        ("address", "1.2.3.4/x", "neither an IP address nor a CIDR network"),
        ("address", "1.2.3.4/\u00b2", "neither an IP address nor a CIDR network"),
        ("address", "::1/129", "prefix /129 is too long"),
        ("address", "::ffff:1.2.3.4/64", "IPv4-mapped network needs a prefix of 96"),
        ("address", "", "must not be empty"),
        ("clientid", "", "must not be empty"),
        ("username", "u" * (MAX_VALUE_LENGTH + 1), "longer than 1024"),
        ("username", "\udc80", "not valid UTF-8"),
        ("ip", "1.2.3.4", "unknown ban kind 'ip'"),
    ],
)
def test_a_bad_target_is_refused_with_a_readable_message(
    kind: str, value: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_ban_target(kind, value)


def test_client_ids_and_user_names_are_kept_as_given() -> None:
    assert parse_ban_target("clientid", " Mixed/Case ") == ("clientid", " Mixed/Case ")
    assert parse_ban_target("username", "u" * MAX_VALUE_LENGTH)[1] == "u" * MAX_VALUE_LENGTH
    assert ban_key("username", "a:b") == "username:a:b"


# -- the ban record --------------------------------------------------------------------------


@given(
    kind=st.sampled_from(["clientid", "username"]),
    value=st.text(min_size=1, max_size=50).filter(lambda text: text.isprintable()),
    until=st.none() | st.floats(0, 1e10, allow_nan=False),
    reason=st.text(max_size=20),
    created_at=st.floats(0, 1e10, allow_nan=False),
)
def test_a_ban_survives_encoding(
    kind: str, value: str, until: float | None, reason: str, created_at: float
) -> None:
    ban = Ban(kind, value, until, reason, created_at)  # type: ignore[arg-type]
    assert decode_ban(ban_key(ban.kind, ban.value), encode_ban(ban)) == ban


def test_an_address_ban_survives_encoding() -> None:
    ban = Ban("address", "2001:db8::/32", 12.5, "manual", 3.0)
    assert decode_ban("address:2001:db8::/32", encode_ban(ban)) == ban


def record(**fields: object) -> bytes:
    base: dict[str, object] = {"kind": "clientid", "value": "c", "until": None, "reason": ""}
    base.update(fields)
    return json.dumps(base).encode()


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"\xff\xfe",
        b"not json",
        b"[1, 2]",
        b"null",
        record(kind="ip"),
        record(kind=None),
        record(value=7),
        record(value=""),
        record(reason=3),
        record(reason="r" * (MAX_VALUE_LENGTH + 1)),
        record(until="soon"),
        record(until=True),
        record(until=float("nan")),
        b'{"kind": "clientid", "value": "c", "until": Infinity}',
        record(created_at=None),
        record(created_at=[1]),
        record(value="other"),  # another key's ban
        record(kind="address", value="c"),
    ],
)
def test_garbage_is_no_ban(value: bytes) -> None:
    with pytest.raises(ValueError):
        decode_ban("clientid:c", value)


def test_a_checked_ban_is_one_every_node_reads_back() -> None:
    ban = Ban("address", "::ffff:10.1.2.3/104", 5.0, "manual", 1.0)
    assert checked_ban(ban) == Ban("address", "10.0.0.0/8", 5.0, "manual", 1.0)
    for bad in (
        Ban("clientid", "c", None, "r" * (MAX_VALUE_LENGTH + 1)),
        Ban("clientid", "c", float("inf")),
        Ban("clientid", "c", None, created_at=float("nan")),
        Ban("address", "example.com", None),
        Ban("clientid", "", None),
    ):
        with pytest.raises(ValueError):
            checked_ban(bad)


def test_a_record_without_times_is_a_ban_until_removed() -> None:
    assert decode_ban("clientid:c", b'{"kind": "clientid", "value": "c"}') == Ban(
        "clientid", "c", None, "", 0.0
    )


def test_a_ban_is_active_until_its_end() -> None:
    ban = Ban("clientid", "c", until=100.0)
    assert ban.active(0.0) and ban.active(99.999)
    assert not ban.active(100.0) and not ban.active(1e9)
    assert Ban("clientid", "c", until=None).active(1e12)


# -- the ban list ----------------------------------------------------------------------------


def match(
    bans: BanList,
    address: str = "",
    *,
    client_id: str = "x",
    username: str | None = None,
    now: float = 0.0,
) -> Ban | None:
    return bans.match(client_id=client_id, username=username, address=address, now=now)


def test_a_client_is_matched_by_client_id_then_user_name_then_address() -> None:
    bans = BanList()
    by_id = Ban("clientid", "c", None, "manual")
    by_user = Ban("username", "u", None, "manual")
    by_address = Ban("address", "1.2.3.4", None, "manual")
    for ban in (by_address, by_user, by_id):
        bans.put(ban)
    assert match(bans, "1.2.3.4", client_id="c", username="u") == by_id
    assert match(bans, "1.2.3.4", client_id="d", username="u") == by_user
    assert match(bans, "1.2.3.4", client_id="d", username="v") == by_address
    assert match(bans, "1.2.3.5", client_id="d", username="v") is None
    # No user name (an anonymous client) is no user name banned.
    assert match(bans, "5.6.7.8", client_id="d", username=None) is None
    # Names are matched exactly.
    assert match(bans, "", client_id="C", username="U") is None


def test_the_user_name_ban_does_not_match_a_client_id_of_that_name() -> None:
    bans = BanList()
    bans.put(Ban("username", "alice", None))
    assert match(bans, client_id="alice") is None
    assert match(bans, username="alice") is not None


@pytest.mark.parametrize(
    ("banned", "inside", "outside"),
    [
        (
            "10.0.0.0/8",
            ["10.0.0.0", "10.255.255.255", "::ffff:10.1.2.3"],
            ["11.0.0.0", "9.255.255.255"],
        ),
        ("192.168.1.0/24", ["192.168.1.77"], ["192.168.2.1"]),
        ("0.0.0.0/0", ["1.2.3.4", "127.0.0.1"], ["::1"]),
        ("127.0.0.1", ["127.0.0.1", "::ffff:127.0.0.1"], ["127.0.0.2", "::1"]),  # loopback too
        (
            "2001:db8::/32",
            ["2001:db8::1", "[2001:db8:ffff::1]", "2001:db8::1%eth0"],
            ["2001:db9::1", "10.0.0.1"],
        ),
        ("::1", ["::1", "[::1]"], ["::2", "127.0.0.1"]),
        ("fe80::/10", ["fe80::1%lo", "febf::1"], ["fec0::1"]),
        ("::ffff:1.2.3.0/120", ["1.2.3.9", "::ffff:1.2.3.9"], ["1.2.4.9"]),
    ],
)
def test_address_bans_hold_their_networks(
    banned: str, inside: list[str], outside: list[str]
) -> None:
    bans = BanList()
    bans.put(Ban("address", banned, None))
    for address in inside:
        assert match(bans, address) is not None, address
    for address in outside:
        assert match(bans, address) is None, address


def test_an_address_that_is_no_ip_matches_no_address_ban() -> None:
    bans = BanList()
    bans.put(Ban("address", "0.0.0.0/0", None))
    bans.put(Ban("address", "::/0", None))
    for address in ("", "unix:/tmp/socket", "localhost", "1.2.3.4:1883"):
        assert match(bans, address) is None, address


def test_the_longest_banned_network_in_force_is_the_one_reported() -> None:
    bans = BanList()
    wide = Ban("address", "10.0.0.0/8", None, "wide")
    narrow = Ban("address", "10.1.0.0/16", 100.0, "narrow")
    single = Ban("address", "10.1.2.3", 50.0, "single")
    for ban in (wide, narrow, single):
        bans.put(ban)
    assert match(bans, "10.1.2.3", now=0) == single
    assert match(bans, "10.1.2.3", now=60) == narrow  # the single one is over
    assert match(bans, "10.1.2.3", now=200) == wide
    assert match(bans, "10.2.0.1", now=0) == wide
    assert bans.remove("address", "10.0.0.0/8")
    assert match(bans, "10.1.2.3", now=200) is None


def test_a_ban_that_is_over_keeps_nobody_out_and_is_listed_as_expired() -> None:
    bans = BanList()
    bans.put(Ban("clientid", "c", until=10.0))
    bans.put(Ban("username", "u", until=20.0))
    bans.put(Ban("address", "1.2.3.4", until=None))
    assert match(bans, client_id="c", now=9.9) is not None
    assert match(bans, client_id="c", now=10.0) is None
    assert [ban.value for ban in bans.entries(15.0)] == ["u", "1.2.3.4"]
    assert bans.expired_keys(15.0) == ["clientid:c"]
    assert sorted(bans.expired_keys(25.0)) == ["clientid:c", "username:u"]
    assert bans.expired_keys(5.0) == []


def test_entries_are_listed_by_kind_then_target() -> None:
    bans = BanList()
    for kind, value in [
        ("address", "::1"),
        ("username", "b"),
        ("clientid", "z"),
        ("clientid", "a"),
        ("address", "10.0.0.0/8"),
    ]:
        bans.put(Ban(kind, value, None))  # type: ignore[arg-type]
    assert [(ban.kind, ban.value) for ban in bans.entries(0)] == [
        ("clientid", "a"),
        ("clientid", "z"),
        ("username", "b"),
        ("address", "10.0.0.0/8"),
        ("address", "::1"),
    ]


def test_a_target_is_banned_once_the_latest_ban_wins() -> None:
    bans = BanList()
    bans.put(Ban("address", "10.1.2.3/8", None, "first"))
    bans.put(Ban("address", "10.0.0.0/8", 5.0, "second"))  # the same network
    assert len(bans) == 1
    (ban,) = bans.entries(0)
    assert (ban.value, ban.reason) == ("10.0.0.0/8", "second")
    assert match(bans, "10.9.9.9", now=6.0) is None


def test_remove_lifts_a_ban_and_says_whether_there_was_one() -> None:
    bans = BanList()
    bans.put(Ban("address", "2001:db8::/32", None))
    bans.put(Ban("clientid", "c", None))
    assert bans.remove("address", "2001:DB8::1/32")  # the same network, written otherwise
    assert not bans.remove("address", "2001:db8::/32")
    assert match(bans, "2001:db8::1") is None
    assert bans.remove("clientid", "c")
    assert match(bans, client_id="c") is None
    assert not bans.remove("username", "nobody")
    with pytest.raises(ValueError):
        bans.remove("address", "nowhere")


def test_apply_follows_the_table() -> None:
    bans = BanList()
    ban = Ban("username", "u", None, "manual", 1.0)
    bans.apply("username:u", encode_ban(ban))
    assert match(bans, username="u") == ban
    bans.apply("username:u", None)
    assert match(bans, username="u") is None
    bans.apply("username:u", None)  # deleting what is not there is fine
    # A value that is no ban, or one under another key, is ignored; the key holds no ban then.
    bans.apply("username:u", encode_ban(ban))
    bans.apply("username:u", b"garbage")
    assert match(bans, username="u") is None and len(bans) == 0
    bans.apply("username:v", encode_ban(ban))
    assert len(bans) == 0
    bans.apply("address:10.0.0.0/8", encode_ban(Ban("address", "10.0.0.0/8", None)))
    assert match(bans, "10.0.0.1") is not None
    bans.apply("address:10.0.0.0/8", b"{}")
    assert match(bans, "10.0.0.1") is None


def test_many_bans_are_matched_by_lookups() -> None:
    bans = BanList()
    for n in range(20_000):
        bans.put(Ban("clientid", f"c{n}", None))
        bans.put(Ban("address", f"10.{n >> 8 & 255}.{n & 255}.0/24", None))
        bans.put(Ban("address", f"2001:db8:{n:x}::1", None))
    assert len(bans) == 60_000
    assert match(bans, "10.78.31.9", client_id="x") is not None
    assert match(bans, "10.78.32.9", client_id="x") is None
    assert match(bans, "2001:db8:4e20::1") is None
    assert match(bans, "2001:db8:4e1f::1") is not None
    assert match(bans, client_id="c19999") is not None


# -- flapping --------------------------------------------------------------------------------


def test_the_max_count_th_connect_within_the_window_bans_the_client_id() -> None:
    detector = FlappingDetector(max_count=3, window=10.0, ban_time=60.0)
    assert detector.connected("c", 100.0) is None
    assert detector.connected("c", 101.0) is None
    assert detector.connected("other", 101.5) is None
    ban = detector.connected("c", 102.0)
    assert ban == Ban("clientid", "c", 162.0, "flapping", 102.0)
    # The count starts again after a ban.
    assert detector.connected("c", 103.0) is None
    assert detector.connected("c", 104.0) is None
    assert detector.connected("c", 105.0) is not None


def test_the_flapping_window_slides() -> None:
    detector = FlappingDetector(max_count=3, window=10.0, ban_time=60.0)
    assert detector.connected("c", 0.0) is None
    assert detector.connected("c", 8.0) is None
    assert detector.connected("c", 12.0) is None  # the connect at 0 has left the window
    # 8, 12 and 17 are within 10 seconds (a window fixed at 0, then at 10, would count 2).
    assert detector.connected("c", 17.0) is not None
    detector = FlappingDetector(max_count=3, window=10.0, ban_time=60.0)
    assert detector.connected("c", 0.0) is None
    assert detector.connected("c", 5.0) is None
    assert detector.connected("c", 10.0) is None  # exactly a window after the first
    assert detector.connected("c", 14.9) is not None


def test_a_client_id_no_ban_can_name_is_not_followed() -> None:
    detector = FlappingDetector(max_count=1, window=10.0, ban_time=60.0)
    assert detector.connected("", 0.0) is None
    assert detector.connected("x" * (MAX_VALUE_LENGTH + 1), 0.0) is None
    assert len(detector) == 0
    long_id = "y" * MAX_VALUE_LENGTH
    assert detector.connected(long_id, 0.0) == Ban("clientid", long_id, 60.0, "flapping", 0.0)


def test_long_client_ids_are_followed_by_digest() -> None:
    detector = FlappingDetector(max_count=2, window=10.0, ban_time=60.0)
    first, second = "a" * 500 + "1", "a" * 500 + "2"
    assert detector.connected(first, 0.0) is None
    assert detector.connected(second, 0.0) is None  # another id: its own count
    ban = detector.connected(first, 1.0)
    assert ban is not None and ban.value == first


def test_flapping_memory_stays_bounded_under_a_flood_of_client_ids() -> None:
    detector = FlappingDetector(max_count=2, window=60.0, ban_time=60.0, capacity=1000)
    for n in range(50_000):
        detector.connected(f"flood-{n}", n * 0.001)
    assert len(detector) == 1000
    # The oldest were forgotten: their second connect counts as a first.
    assert detector.connected("flood-0", 50.0) is None
    assert detector.connected("flood-49999", 50.0) is not None


def test_long_client_ids_cost_little_memory() -> None:
    detector = FlappingDetector(max_count=5, window=60.0, ban_time=60.0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(5_000):
            detector.connected(f"{n:08}" + "x" * 1000, 0.0)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(detector) == 5_000
    assert grown < 5_000 * 500  # far less than the ids themselves (5 MB)


def test_flapping_forgets_client_ids_whose_connects_left_the_window() -> None:
    detector = FlappingDetector(max_count=5, window=10.0, ban_time=60.0)
    for n in range(100):
        detector.connected(f"c{n}", 0.0)
    assert len(detector) == 100
    detector.connected("late", 10.5)
    assert len(detector) == 1


def test_flapping_settings_are_checked() -> None:
    for args in ((0, 10.0, 1.0), (1, 0.0, 1.0), (1, 1.0, 0.0)):
        with pytest.raises(ValueError):
            FlappingDetector(*args)


# -- failed authentications ------------------------------------------------------------------


def test_max_failures_within_the_window_block_an_address() -> None:
    limiter = FailureLimiter(max_failures=3, window=10.0, block_time=30.0)
    assert not limiter.failed("1.2.3.4", 0.0)
    assert not limiter.failed("1.2.3.4", 1.0)
    assert not limiter.blocked("1.2.3.4", 1.0)
    assert limiter.failed("1.2.3.4", 2.0)  # the third: blocked from now on
    assert limiter.blocked("1.2.3.4", 2.0)
    assert limiter.blocked("::ffff:1.2.3.4", 31.9)  # the same address, mapped
    assert not limiter.blocked("1.2.3.5", 3.0)
    assert not limiter.failed("1.2.3.4", 3.0)  # already blocked: not blocked again
    assert not limiter.blocked("1.2.3.4", 32.0)
    # Its failures were forgotten with the block.
    assert not limiter.failed("1.2.3.4", 33.0)


def test_a_block_starts_the_count_again() -> None:
    limiter = FailureLimiter(max_failures=2, window=100.0, block_time=5.0)
    assert not limiter.failed("1.2.3.4", 0.0)
    assert limiter.failed("1.2.3.4", 1.0)
    assert not limiter.blocked("1.2.3.4", 6.0)
    # The failures before the block are not counted again.
    assert not limiter.failed("1.2.3.4", 7.0)
    assert limiter.failed("1.2.3.4", 8.0)


def test_failures_while_blocked_neither_count_nor_extend_the_block() -> None:
    limiter = FailureLimiter(max_failures=1, window=100.0, block_time=5.0)
    assert limiter.failed("1.2.3.4", 0.0)
    assert not limiter.failed("1.2.3.4", 4.0)
    assert not limiter.blocked("1.2.3.4", 5.0)


def test_blocks_that_are_over_are_forgotten() -> None:
    limiter = FailureLimiter(max_failures=1, window=10.0, block_time=5.0)
    for n in range(100):
        assert limiter.failed(f"10.0.0.{n}", 0.0)
    assert len(limiter) == 100
    assert limiter.failed("10.0.1.0", 5.0)
    assert len(limiter) == 1


def test_the_failure_window_slides() -> None:
    limiter = FailureLimiter(max_failures=3, window=10.0, block_time=30.0)
    assert not limiter.failed("::1", 0.0)
    assert not limiter.failed("::1", 5.0)
    assert not limiter.failed("::1", 10.0)  # the failure at 0 has left the window
    assert limiter.failed("[::1]", 14.0)  # 5, 10, 14
    assert limiter.blocked("::1", 14.0)


def test_loopback_is_limited_like_any_address() -> None:
    limiter = FailureLimiter(max_failures=1, window=10.0, block_time=30.0)
    assert limiter.failed("127.0.0.1", 0.0)
    assert limiter.blocked("127.0.0.1", 1.0)


def test_a_success_forgets_the_failures_not_the_block() -> None:
    limiter = FailureLimiter(max_failures=2, window=10.0, block_time=30.0)
    assert not limiter.failed("1.2.3.4", 0.0)
    limiter.succeeded("1.2.3.4")
    assert not limiter.failed("1.2.3.4", 1.0)
    assert limiter.failed("1.2.3.4", 2.0)
    limiter.succeeded("1.2.3.4")
    assert limiter.blocked("1.2.3.4", 3.0)


def test_zero_max_failures_is_no_limit() -> None:
    limiter = FailureLimiter(max_failures=0, window=0.0, block_time=0.0)
    for n in range(100):
        assert not limiter.failed("1.2.3.4", float(n))
    assert not limiter.blocked("1.2.3.4", 100.0)
    assert len(limiter) == 0


def test_an_address_that_is_no_ip_is_not_limited() -> None:
    limiter = FailureLimiter(max_failures=1, window=10.0, block_time=30.0)
    assert not limiter.failed("", 0.0)
    assert not limiter.failed("unix", 0.0)
    assert not limiter.blocked("", 0.0)
    assert len(limiter) == 0


def test_failure_memory_stays_bounded_under_a_flood_of_addresses() -> None:
    limiter = FailureLimiter(max_failures=2, window=60.0, block_time=600.0, capacity=1000)
    for n in range(40_000):
        address = f"2001:db8::{n:x}"
        limiter.failed(address, n * 0.001)
        limiter.failed(address, n * 0.001)  # blocked: one more block each
    assert len(limiter) <= 2000
    assert limiter.blocked("2001:db8::9c3f", 41.0)  # the latest blocks are kept
    assert not limiter.blocked("2001:db8::0", 41.0)  # the oldest were forgotten
    for n in range(40_000):
        limiter.failed(f"10.0.{n >> 8 & 255}.{n & 255}", 100.0 + n * 0.001)
    assert len(limiter) <= 2000


def test_failure_limit_settings_are_checked() -> None:
    for args in ((-1, 10.0, 1.0), (1, 0.0, 1.0), (1, 1.0, 0.0)):
        with pytest.raises(ValueError):
            FailureLimiter(*args)
