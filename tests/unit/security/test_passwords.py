"""mosquitto-compatible password files (`mop.security.passwords`): hashes mosquitto_passwd writes
verify, hashes mop writes are mosquitto's `$7$`, and editing a file keeps every other line."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mop.security.passwords import (
    PasswordFile,
    PasswordFileError,
    hash_password,
    update_password_file,
)

MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
needs_mosquitto_passwd = pytest.mark.skipif(
    not Path(MOSQUITTO_PASSWD).exists(), reason="mosquitto_passwd is not installed"
)

# Written by mosquitto_passwd 2.0.11 (`-c -b FILE alice secret`, and `-H sha512 -b FILE erin
# legacy`), kept here so that these vectors are checked where mosquitto is not installed.
ALICE = (
    "alice:$7$101$XR5vo60sJEH2Jkg/$sWwHpPce44wvjXOkGFd7juk99Uy+gozj1xTpezfJ+gpHvUkh2TDSmMdPHhjk"
    "LDZKZN5+8PEiZXNhf6vWnIpFNQ=="
)
ERIN = (
    "erin:$6$ZmJH/lWxaBJbg3/v$AVRcKZqFn9DHn68a8xywns7dZVRBhY34JNyVmUJVnGk8ZpSK51fARFjECQqTSVM/k6"
    "Kp5eS64OZewYLceEzucA=="
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def pbkdf2_line(user: str, password: bytes, salt: bytes, iterations: int = 101) -> str:
    key = hashlib.pbkdf2_hmac("sha512", password, salt, iterations, 64)
    return f"{user}:$7${iterations}${b64(salt)}${b64(key)}"


def sha512_line(user: str, password: bytes, salt: bytes) -> str:
    """A legacy entry computed from its definition: SHA-512 of the password, then the salt."""
    return f"{user}:$6${b64(salt)}${b64(hashlib.sha512(password + salt).digest())}"


# Hashes mosquitto_passwd writes.


def test_a_mosquitto_passwd_vector_verifies() -> None:
    file = PasswordFile.parse(f"{ALICE}\n{ERIN}\n")
    assert file.warnings == ()
    assert file.verify("alice", b"secret")
    assert file.verify("erin", b"legacy")
    for wrong in (b"", b"secre", b"secret ", b"Secret", b"legacy"):
        assert not file.verify("alice", wrong)
    assert not file.verify("erin", b"secret")


def mosquitto_passwd(*args: str) -> None:
    subprocess.run([MOSQUITTO_PASSWD, *args], check=True, capture_output=True, timeout=30)


@needs_mosquitto_passwd
def test_hashes_written_by_mosquitto_passwd_verify(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    users = {
        "alice": "secret",
        "bob": "pa:ss$7$word",
        "carol": "pässwörd ünïcode",
        "user with spaces": "x",
    }
    mosquitto_passwd("-c", "-b", str(path), "alice", users["alice"])
    for user, password in list(users.items())[1:]:
        mosquitto_passwd("-b", str(path), user, password)
    mosquitto_passwd("-H", "sha512", "-b", str(path), "erin", "legacy")
    users["erin"] = "legacy"

    file = PasswordFile.parse(path.read_text())
    assert file.warnings == ()
    assert file.users() == tuple(users)
    for user, password in users.items():
        assert file.verify(user, password.encode()), user
        assert not file.verify(user, password.encode() + b"!"), user
        assert not file.verify(user, b""), user
    # Its `$7$` is mop's: 101 iterations, a 12-byte salt, a 64-byte key.
    _, iterations, salt, key = path.read_text().splitlines()[0].split(":", 1)[1].split("$")[1:]
    assert (iterations, len(base64.b64decode(salt)), len(base64.b64decode(key))) == ("101", 12, 64)


@needs_mosquitto_passwd
def test_a_plain_text_file_hashed_by_mosquitto_passwd_verifies(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    path.write_text("carol:plain\ndave:two words\n")
    mosquitto_passwd("-U", str(path))
    file = PasswordFile.parse(path.read_text())
    assert file.warnings == ()
    assert file.verify("carol", b"plain")
    assert file.verify("dave", b"two words")
    assert not file.verify("dave", b"plain")


@needs_mosquitto_passwd
def test_mosquitto_passwd_edits_a_file_mop_wrote(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    path.write_text(update_password_file("", "alice", b"secret"))
    mosquitto_passwd("-b", str(path), "bob", "hunter2")
    mosquitto_passwd("-D", str(path), "alice")
    mosquitto_passwd("-b", str(path), "carol", "x")
    file = PasswordFile.parse(path.read_text())
    assert file.users() == ("bob", "carol")
    assert file.verify("bob", b"hunter2")


# Hashes mop writes.


def test_hash_password_is_pbkdf2_sha512_in_mosquittos_format() -> None:
    salt = bytes(range(12))
    assert hash_password(b"secret", salt=salt) == pbkdf2_line("", b"secret", salt)[1:]
    assert (
        hash_password(b"secret", iterations=1000, salt=salt)
        == (pbkdf2_line("", b"secret", salt, 1000)[1:])
    )


def test_hash_password_draws_a_new_12_byte_salt_each_time() -> None:
    first, second = hash_password(b"same"), hash_password(b"same")
    assert first != second
    for hashed in (first, second):
        scheme, iterations, salt, key = hashed.split("$")[1:]
        assert (scheme, iterations) == ("7", "101")
        salt_bytes = base64.b64decode(salt, validate=True)
        assert len(salt_bytes) == 12
        expected = hashlib.pbkdf2_hmac("sha512", b"same", salt_bytes, 101, 64)
        assert base64.b64decode(key, validate=True) == expected


@pytest.mark.parametrize("iterations", [0, -1, 10_000_001])
def test_hash_password_refuses_an_absurd_cost(iterations: int) -> None:
    with pytest.raises(ValueError, match="iterations"):
        hash_password(b"x", iterations=iterations)


def test_hash_password_refuses_an_empty_salt() -> None:
    with pytest.raises(ValueError, match="salt"):
        hash_password(b"x", salt=b"")


@settings(max_examples=25, deadline=None)
@given(
    username=st.text(
        st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1
    ).filter(lambda name: ":" not in name and not name.startswith("#")),
    password=st.binary(),
)
def test_every_user_and_password_round_trips(username: str, password: bytes) -> None:
    text = update_password_file("# users\n", username, password, iterations=3)
    file = PasswordFile.parse(text)
    assert file.users() == (username,)
    assert file.verify(username, password)
    # (Not `+ b"\x00"`: HMAC pads its key with zeros, so PBKDF2 cannot tell those apart.)
    assert not file.verify(username, password + b"\x01")


# Parsing.


def test_comments_blank_lines_and_line_endings() -> None:
    text = "\n".join(
        [
            "# a comment: with a colon",
            "",
            "   ",
            pbkdf2_line("alice", b"a", b"salt-of-12b!") + "\r",
            "#bob:not a user",
            sha512_line("erin", b"e", b"legacy salt"),
        ]
    )
    file = PasswordFile.parse(text)  # no newline at the end
    assert file.users() == ("alice", "erin")
    assert file.verify("alice", b"a")
    assert file.verify("erin", b"e")
    assert "bob" not in file
    assert "#bob" not in file


def test_the_legacy_hash_is_sha512_of_password_then_salt() -> None:
    file = PasswordFile.parse(sha512_line("erin", b"pass", b"NaCl"))
    assert file.verify("erin", b"pass")
    assert not file.verify("erin", b"NaClpass")
    swapped = hashlib.sha512(b"NaCl" + b"pass").digest()
    assert not PasswordFile.parse(f"erin:$6${b64(b'NaCl')}${b64(swapped)}").verify("erin", b"pass")


def test_the_name_is_what_comes_before_the_first_colon_without_blanks() -> None:
    # mosquitto ignores blanks around a name: " bob :..." is bob's entry.
    line = pbkdf2_line("bob", b"pw", b"s" * 12)
    hashed = line.split(":", 1)[1]
    file = PasswordFile.parse(f" bob \t: {hashed} \nuser name:{hashed}\n")
    assert file.users() == ("bob", "user name")
    assert file.verify("bob", b"pw")
    assert not file.verify(" bob ", b"pw")
    assert file.verify("user name", b"pw")


def test_a_user_defined_twice_takes_the_last_entry_with_a_warning() -> None:
    text = "\n".join(
        [pbkdf2_line("alice", b"first", b"1" * 12), pbkdf2_line("alice", b"second", b"2" * 12)]
    )
    file = PasswordFile.parse(text)
    assert file.users() == ("alice",)
    assert not file.verify("alice", b"first")
    assert file.verify("alice", b"second")
    assert file.warnings == ("line 2: user 'alice': defined again, replaces line 1",)


def test_unsupported_hashes_are_kept_with_a_warning_and_never_match() -> None:
    text = "\n".join(
        [
            pbkdf2_line("alice", b"a", b"x" * 12),
            "bob:$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaA",
            "# a comment",
            "carol:hunter2",
            "dave:",
            "erin:$8$abc$def",
        ]
    )
    file = PasswordFile.parse(text)
    assert file.users() == ("alice", "bob", "carol", "dave", "erin")
    assert file.verify("alice", b"a")
    assert not file.verify("carol", b"hunter2")
    assert not file.verify("dave", b"")
    assert not file.verify("bob", b"anything")
    assert "bob" in file
    assert file.warnings == (
        "line 2: user 'bob': unsupported hash '$argon2id$', never matches",
        "line 4: user 'carol': not a hash (plain text?), never matches",
        "line 5: user 'dave': empty hash, never matches",
        "line 6: user 'erin': unsupported hash '$8$', never matches",
    )
    # A plain-text password never reaches a warning (a log line).
    assert not any("hunter2" in warning for warning in file.warnings)


SALT = b64(b"s" * 12)
KEY = b64(b"k" * 64)


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("alice", 1, "no ':'"),
        (f"# ok\n\nalice:$7$101${SALT}${KEY}\nbob $7$", 4, "no ':'"),
        (f":$7$101${SALT}${KEY}", 1, "empty username"),
        (f"  \t:$7$101${SALT}${KEY}", 1, "empty username"),
        (f"alice:$7$0${SALT}${KEY}", 1, "between 1 and 10000000"),
        (f"alice:$7$10000001${SALT}${KEY}", 1, "between 1 and 10000000"),
        (f"alice:$7$-5${SALT}${KEY}", 1, "positive integer"),
        (f"alice:$7$ten${SALT}${KEY}", 1, "positive integer"),
        (f"alice:$7$\u0661\u0660\u0661${SALT}${KEY}", 1, "positive integer"),  # Arabic-Indic 101
        (f"alice:$7$${SALT}${KEY}", 1, "positive integer"),
        (f"alice:$7$101$not base64!${KEY}", 1, "salt is not valid base64"),
        (f"alice:$7$101$${KEY}", 1, "salt is empty"),
        (f"alice:$7$101${SALT}$abc", 1, "hash is not valid base64"),
        (f"alice:$7$101${SALT}${b64(b'short')}", 1, "hash is 5 bytes, expected 64"),
        # Only the first ':' separates: the rest belongs to the hash.
        (f"alice:$7$101${SALT}${KEY}:admin", 1, "hash is not valid base64"),
        (f"alice:$7$101${SALT}", 1, "$7$<iterations>$<salt>$<hash>"),
        (f"alice:$7$101${SALT}${KEY}$extra", 1, "$7$<iterations>$<salt>$<hash>"),
        ("alice:$7$", 1, "$7$<iterations>$<salt>$<hash>"),
        (f"alice:$6${SALT}", 1, "$6$<salt>$<hash>"),
        (f"alice:$6$sält${KEY}", 1, "salt is not valid base64"),
        (f"alice:$6${SALT}${b64(b'x' * 63)}", 1, "hash is 63 bytes"),
    ],
)
def test_a_malformed_line_is_an_error_naming_its_line(text: str, line: int, problem: str) -> None:
    with pytest.raises(PasswordFileError) as raised:
        PasswordFile.parse(text)
    assert str(raised.value).startswith(f"line {line}: ")
    assert problem in str(raised.value)
    assert raised.value.line == line
    assert isinstance(raised.value, ValueError)


def test_an_empty_file_has_no_users() -> None:
    for text in ("", "\n", "# nobody\n"):
        file = PasswordFile.parse(text)
        assert file.users() == ()
        assert not file.verify("alice", b"")
    assert PasswordFile().users() == ()


def test_membership_and_repr() -> None:
    file = PasswordFile.parse(ALICE)
    assert "alice" in file
    assert "bob" not in file
    assert 42 not in file
    assert "XR5vo60s" not in repr(file)


# The unknown-user path costs what a known user costs.


@pytest.fixture
def pbkdf2_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The iteration count of every PBKDF2 the module computes from here on."""
    calls: list[int] = []
    real: Callable[..., bytes] = hashlib.pbkdf2_hmac

    def counting(name: str, password: bytes, salt: bytes, iterations: int, *rest: Any) -> bytes:
        calls.append(iterations)
        return real(name, password, salt, iterations, *rest)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counting)  # the module calls hashlib.pbkdf2_hmac
    return calls


def test_an_unknown_user_costs_one_hash_of_the_files_kind(pbkdf2_calls: list[int]) -> None:
    text = "\n".join(
        [
            pbkdf2_line("alice", b"a", b"1" * 12, iterations=2000),
            pbkdf2_line("bob", b"b", b"2" * 12, iterations=2000),
            pbkdf2_line("carol", b"c", b"3" * 12, iterations=7),
            "dave:$argon2id$v=19$whatever",
        ]
    )
    file = PasswordFile.parse(text)
    pbkdf2_calls.clear()  # the lines above were hashed here too
    assert file.verify("alice", b"a")
    assert pbkdf2_calls == [2000]
    pbkdf2_calls.clear()
    assert not file.verify("mallory", b"a")
    assert pbkdf2_calls == [2000]
    pbkdf2_calls.clear()
    assert not file.verify("dave", b"a")
    assert pbkdf2_calls == [2000]


def test_an_unknown_user_of_an_empty_file_costs_a_default_hash(pbkdf2_calls: list[int]) -> None:
    assert not PasswordFile.parse("").verify("mallory", b"")
    assert pbkdf2_calls == [101]


def test_an_unknown_user_of_a_legacy_file_costs_one_sha512(pbkdf2_calls: list[int]) -> None:
    file = PasswordFile.parse(sha512_line("erin", b"e", b"salt"))
    assert not file.verify("mallory", b"e")
    assert pbkdf2_calls == []


# Editing a file.

OTHERS = (
    "# managed by hand\r\n"
    "\r\n"
    f"{ALICE}\r\n"
    "  # an indented line: \x00 kept as is\r\n"
    "bob:$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaA\r\n"
    f"{ERIN}\r\n"
)


def test_changing_a_password_replaces_the_line_where_it_stands() -> None:
    text = update_password_file(OTHERS, "alice", b"new", iterations=5)
    before, after = OTHERS.split("\n"), text.split("\n")
    changed = [
        index for index, (old, new) in enumerate(zip(before, after, strict=True)) if old != new
    ]
    assert changed == [2]
    assert after[2].startswith("alice:$7$5$")
    assert after[2].endswith("\r")
    file = PasswordFile.parse(text)
    assert file.verify("alice", b"new")
    assert not file.verify("alice", b"secret")
    assert file.verify("erin", b"legacy")


def test_a_new_user_is_appended() -> None:
    text = update_password_file(OTHERS, "carol", b"c")
    assert text.startswith(OTHERS)
    assert text.endswith("\r\n")
    assert text[len(OTHERS) :].startswith("carol:$7$101$")
    assert PasswordFile.parse(text).verify("carol", b"c")


def test_a_new_user_after_a_last_line_without_newline() -> None:
    text = update_password_file("# users", "carol", b"c")
    assert text.startswith("# users\ncarol:$7$")
    assert text.endswith("\n")
    assert update_password_file("", "carol", b"c").count("\n") == 1


def test_deleting_removes_the_users_lines_only() -> None:
    text = update_password_file(OTHERS, "alice", None)
    assert text == OTHERS.replace(f"{ALICE}\r\n", "")
    assert update_password_file(text, "bob", None) == text.replace(
        "bob:$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaA\r\n", ""
    )


def test_deleting_an_absent_user_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        update_password_file(OTHERS, "mallory", None)


def test_a_user_defined_twice_is_left_with_one_entry() -> None:
    twice = f"{ALICE}\n# between\n{ALICE.replace('alice:', ' alice :')}\n"
    text = update_password_file(twice, "alice", b"new")
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("alice:$7$")
    assert lines[1] == "# between"
    assert PasswordFile.parse(text).verify("alice", b"new")
    assert update_password_file(twice, "alice", None) == "# between\n"


@pytest.mark.parametrize(
    ("username", "reason"),
    [
        ("", "empty"),
        ("a:b", "':'"),
        ("a\nb", "control"),
        ("a\rb", "control"),
        ("tab\t", "control"),
        ("nul\x00", "control"),
        ("del\x7f", "control"),
        ("c1\x85", "control"),
        ("#admin", "'#'"),
        (" alice", "whitespace"),
        ("alice ", "whitespace"),
    ],
)
def test_a_name_the_file_cannot_hold_is_refused(username: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as raised:
        update_password_file(OTHERS, username, b"x")
    assert not isinstance(raised.value, PasswordFileError)


def test_a_malformed_file_is_not_edited() -> None:
    with pytest.raises(PasswordFileError, match="line 2: "):
        update_password_file(f"{ALICE}\nbroken\n", "carol", b"c")
