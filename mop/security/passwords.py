"""Password files in mosquitto's format: parse them, verify a password, hash one, edit a file.

Pure text in, text out: reading and writing the file is `mop.security.password_store`'s job.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

# mosquitto_passwd's choices for `$7$` (PBKDF2-HMAC-SHA512): its default iteration count, the
# size of its random salt and of the derived key.
DEFAULT_ITERATIONS = 101
SALT_SIZE = 12
DIGEST_SIZE = 64
# Enough for any real deployment; a larger count in a file is a typo or an attempt to make every
# connection attempt burn seconds of CPU.
MAX_ITERATIONS = 10_000_000


class PasswordFileError(ValueError):
    """A line of a password file that cannot be read. str() reads "line N: what is wrong"."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


class _Hash(Protocol):
    def matches(self, password: bytes) -> bool: ...


@dataclass(frozen=True, slots=True)
class _Pbkdf2Sha512:
    """`$7$<iterations>$<salt>$<key>`: PBKDF2-HMAC-SHA512, what mosquitto_passwd writes."""

    iterations: int
    salt: bytes
    digest: bytes

    def matches(self, password: bytes) -> bool:
        key = hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations, DIGEST_SIZE)
        return hmac.compare_digest(key, self.digest)

    def encode(self) -> str:
        return f"$7${self.iterations}${_b64(self.salt)}${_b64(self.digest)}"


@dataclass(frozen=True, slots=True)
class _SaltedSha512:
    """`$6$<salt>$<hash>`: SHA-512 of the password followed by the salt (mosquitto 1.6 and
    earlier). Verified, never written."""

    salt: bytes
    digest: bytes

    def matches(self, password: bytes) -> bool:
        return hmac.compare_digest(hashlib.sha512(password + self.salt).digest(), self.digest)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str, line: int) -> bytes:
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise PasswordFileError(line, f"{what} is not valid base64") from None
    if not data:
        raise PasswordFileError(line, f"{what} is empty")
    return data


def _digest(text: str, line: int) -> bytes:
    digest = _unb64(text, "hash", line)
    if len(digest) != DIGEST_SIZE:
        raise PasswordFileError(line, f"hash is {len(digest)} bytes, expected {DIGEST_SIZE}")
    return digest


def _parse_pbkdf2(fields: list[str], line: int) -> _Hash:
    if len(fields) != 3:
        raise PasswordFileError(line, "a $7$ hash has the form $7$<iterations>$<salt>$<hash>")
    count, salt, digest = fields
    if not (count.isascii() and count.isdigit()):
        raise PasswordFileError(line, f"iterations must be a positive integer (got {count!r})")
    iterations = int(count)
    if not 0 < iterations <= MAX_ITERATIONS:
        raise PasswordFileError(
            line, f"iterations must be between 1 and {MAX_ITERATIONS} (got {iterations})"
        )
    return _Pbkdf2Sha512(iterations, _unb64(salt, "salt", line), _digest(digest, line))


def _parse_sha512(fields: list[str], line: int) -> _Hash:
    if len(fields) != 2:
        raise PasswordFileError(line, "a $6$ hash has the form $6$<salt>$<hash>")
    salt, digest = fields
    return _SaltedSha512(_unb64(salt, "salt", line), _digest(digest, line))


# The hash kinds verified, by the identifier between the first two '$'.
_SCHEMES: Mapping[str, Callable[[list[str], int], _Hash]] = {
    "7": _parse_pbkdf2,
    "6": _parse_sha512,
}


@dataclass(frozen=True, slots=True)
class _Line:
    """One line of a file: its text as read (line ending included) and, for an entry, the user
    and the hash (None when the hash is of a kind this module cannot verify)."""

    number: int
    text: str
    username: str | None = None
    hash: _Hash | None = None
    unsupported: str = ""  # why the entry never matches, for an entry whose hash is None


# What C's isspace() calls blank: the characters mosquitto trims.
_BLANKS = " \t\n\v\f\r"


def _split_lines(text: str) -> list[str]:
    """The lines of `text`, each with its "\\n" (only "\\n" ends a line, as for mosquitto)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _describe_unsupported(hashed: str) -> str:
    """A name for a hash this module cannot verify that never repeats a secret: a plain-text
    password must not reach a log line."""
    if hashed.startswith("$") and "$" in hashed[1:]:
        scheme = hashed[: hashed.index("$", 1) + 1]
        if len(scheme) <= 16 and scheme.isascii() and scheme.isprintable():
            return f"unsupported hash {scheme!r}"
    if not hashed:
        return "empty hash"
    return "not a hash (plain text?)"


def _scan(text: str) -> Iterator[_Line]:
    for number, raw in enumerate(_split_lines(text), start=1):
        content = raw.removesuffix("\n").removesuffix("\r")
        if not content.strip(_BLANKS) or content.startswith("#"):
            yield _Line(number, raw)
            continue
        username, colon, hashed = content.partition(":")
        if not colon:
            raise PasswordFileError(number, "expected <username>:<password hash>, found no ':'")
        # mosquitto ignores blanks around the name and the hash: " bob :..." is user "bob".
        username = username.strip(_BLANKS)
        if not username:
            raise PasswordFileError(number, "empty username")
        hashed = hashed.strip(_BLANKS)
        scheme, dollar, rest = hashed.removeprefix("$").partition("$")
        parse = _SCHEMES.get(scheme) if hashed.startswith("$") and dollar else None
        if parse is None:
            yield _Line(number, raw, username, unsupported=_describe_unsupported(hashed))
        else:
            yield _Line(number, raw, username, parse(rest.split("$"), number))


def _decoy_for(hashes: list[_Hash]) -> _Hash:
    """A hash of the kind (and cost) most entries have, checked instead when the user is unknown
    so that the time an answer takes does not tell which user names exist."""
    costs = Counter(getattr(entry, "iterations", 0) for entry in hashes)
    iterations = costs.most_common(1)[0][0] if costs else DEFAULT_ITERATIONS
    if not iterations:  # mostly `$6$`: one SHA-512
        return _SaltedSha512(bytes(SALT_SIZE), bytes(DIGEST_SIZE))
    return _Pbkdf2Sha512(iterations, bytes(SALT_SIZE), bytes(DIGEST_SIZE))


@dataclass(frozen=True)
class PasswordFile:
    """The users of a password file and their password hashes.

    Built with `parse`. A user whose hash is of a kind mop cannot verify (`$argon2id$`, plain
    text) stays in the file but never authenticates; `warnings` says so, one line per entry,
    for the loader to log. When a user appears more than once, the last entry counts (as for
    mosquitto), with a warning.
    """

    _entries: Mapping[str, _Hash | None] = field(default_factory=dict, repr=False, hash=False)
    warnings: tuple[str, ...] = ()
    _decoy: _Hash = field(default_factory=lambda: _decoy_for([]), repr=False, compare=False)

    @classmethod
    def parse(cls, text: str) -> PasswordFile:
        """Read the text of a password file; a malformed line raises `PasswordFileError`."""
        entries: dict[str, _Hash | None] = {}
        defined_on: dict[str, int] = {}
        warnings: list[str] = []
        for line in _scan(text):
            if line.username is None:
                continue
            where = f"line {line.number}: user {line.username!r}"
            if line.username in defined_on:
                # As for mosquitto (2.0): the last entry of a user counts.
                warnings.append(
                    f"{where}: defined again, replaces line {defined_on[line.username]}"
                )
            entries[line.username] = line.hash
            defined_on[line.username] = line.number
            if line.hash is None:
                warnings.append(f"{where}: {line.unsupported}, never matches")
        hashes = [entry for entry in entries.values() if entry is not None]
        return cls(MappingProxyType(entries), tuple(warnings), _decoy_for(hashes))

    def verify(self, username: str, password: bytes) -> bool:
        """Whether `password` is `username`'s. An unknown user (or one whose hash cannot be
        verified) costs the same hashing as a known one, and fails."""
        entry = self._entries.get(username)
        if entry is None:
            self._decoy.matches(password)
            return False
        return entry.matches(password)

    def __contains__(self, username: object) -> bool:
        return username in self._entries

    def users(self) -> tuple[str, ...]:
        """The user names, in the order of the file."""
        return tuple(self._entries)

    def __repr__(self) -> str:
        return f"PasswordFile(users={len(self._entries)}, warnings={len(self.warnings)})"


def hash_password(
    password: bytes, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> str:
    """`password` hashed the way mosquitto_passwd does by default: "$7$..." (PBKDF2-HMAC-SHA512
    with a random 12-byte salt unless `salt` is given)."""
    if not 0 < iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be between 1 and {MAX_ITERATIONS} (got {iterations})")
    if salt is None:
        salt = os.urandom(SALT_SIZE)
    elif not salt:
        raise ValueError("the salt must not be empty")
    key = hashlib.pbkdf2_hmac("sha512", password, salt, iterations, DIGEST_SIZE)
    return _Pbkdf2Sha512(iterations, salt, key).encode()


def check_username(username: str) -> None:
    """Raise ValueError, saying why, for a name a password file cannot hold as it is: empty,
    with ':' (the separator), a control character (a line break would split the line), a
    leading '#' (a comment) or whitespace around it."""
    if not username:
        raise ValueError("the username must not be empty")
    if ":" in username:
        raise ValueError(f"the username must not contain ':' (got {username!r})")
    if any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in username):
        raise ValueError(f"the username must not contain control characters (got {username!r})")
    if username.startswith("#"):
        raise ValueError(f"the username must not start with '#', a comment (got {username!r})")
    if username != username.strip():
        raise ValueError(f"the username must not start or end with whitespace (got {username!r})")


def update_password_file(
    text: str, username: str, password: bytes | None, *, iterations: int = DEFAULT_ITERATIONS
) -> str:
    """The text of a password file after setting `username`'s password (None: deleting the user).

    A known user's line is replaced where it stands (further lines of the same user are removed),
    a new user is appended; deleting removes every line of the user, and raises KeyError when
    there is none. Every other line (comments, blank lines, hashes mop cannot verify) is
    kept as it was, character for character. A malformed file raises `PasswordFileError`, a
    name the file cannot hold ValueError (see `check_username`).
    """
    check_username(username)
    lines = list(_scan(text))
    new_entry = None if password is None else hash_password(password, iterations=iterations)
    kept: list[str] = []
    found = False
    for line in lines:
        if line.username != username:
            kept.append(line.text)
            continue
        # The user's first line takes the new hash, any further one goes: one entry is left.
        if new_entry is not None and not found:
            ending = line.text[len(line.text.rstrip("\r\n")) :]
            kept.append(f"{username}:{new_entry}{ending}")
        found = True
    if not found:
        if new_entry is None:
            raise KeyError(username)
        if kept and not kept[-1].endswith("\n"):
            kept[-1] += _ending(text)
        kept.append(f"{username}:{new_entry}{_ending(text)}")
    return "".join(kept)


def _ending(text: str) -> str:
    """The line ending the file uses: "\\r\\n" if its first line ends so, else "\\n"."""
    first, newline, _ = text.partition("\n")
    return "\r\n" if newline and first.endswith("\r") else "\n"
