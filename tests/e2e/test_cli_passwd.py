"""`mop passwd` as users run it: a real process editing a real file, which mosquitto accepts."""

from __future__ import annotations

import os
import pwd
import select
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mop
from mop.security.passwords import PasswordFile

pytestmark = pytest.mark.e2e

TIMEOUT = 20.0
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PUB = shutil.which("mosquitto_pub") or "/usr/bin/mosquitto_pub"


def environ() -> dict[str, str]:
    """The test process's environment, importing the same mop as this process."""
    package_root = str(Path(mop.__file__).resolve().parents[1])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
    }


def passwd(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`mop passwd ARGS` in `tmp_path`, without a terminal: a new session has none to prompt on
    (so a test that would prompt fails instead of waiting on the terminal running the tests)."""
    return subprocess.run(
        [sys.executable, "-m", "mop", "passwd", *args],
        cwd=tmp_path,
        env=environ(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        start_new_session=True,
    )


def ok(result: subprocess.CompletedProcess[str]) -> None:
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one error line of a failed command, without its "mop: error: " prefix."""
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mop: error: ")
    return lines[0].removeprefix("mop: error: ")


def users(path: Path) -> PasswordFile:
    return PasswordFile.parse(path.read_text())


def test_create_change_and_delete(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    ok(passwd(tmp_path, "-c", "-b", "passwords", "alice", "secret"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert users(path).verify("alice", b"secret")

    ok(passwd(tmp_path, "-b", "passwords", "bob", "pä:ss w"))
    alice_line = path.read_text().splitlines()[0]
    ok(passwd(tmp_path, "-b", "--iterations", "1000", "passwords", "bob", "changed"))
    lines = path.read_text().splitlines()
    assert lines[0] == alice_line
    assert lines[1].startswith("bob:$7$1000$")
    file = users(path)
    assert file.users() == ("alice", "bob")
    assert file.verify("bob", b"changed")
    assert not file.verify("bob", "pä:ss w".encode())

    ok(passwd(tmp_path, "-D", "passwords", "alice"))
    assert path.read_text().splitlines() == lines[1:]
    assert users(path).users() == ("bob",)


def test_create_overwrites_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    path.write_text("# old\nbroken line\n")
    ok(passwd(tmp_path, "-c", "-b", "passwords", "alice", "secret"))
    assert path.read_text().startswith("alice:$7$101$")
    assert users(path).users() == ("alice",)


def test_a_changed_file_keeps_its_mode_and_other_lines(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    kept = "# managed by hand\r\n\r\nbob:$argon2id$v=19$m=65536$c2FsdA$aGFzaA\r\n"
    path.write_text(kept, newline="")
    path.chmod(0o640)
    result = passwd(tmp_path, "-b", "passwords", "alice", "secret")
    assert result.returncode == 0
    assert result.stderr == (
        "mop: warning: passwords: line 3: user 'bob': unsupported hash '$argon2id$', "
        "never matches\n"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    text = path.read_bytes().decode()
    assert text.startswith(kept)
    assert text[len(kept) :].startswith("alice:$7$")
    assert users(path).verify("alice", b"secret")
    assert [name for name in os.listdir(tmp_path)] == ["passwords"]  # no temporary file left


def test_stdin_gives_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    ok(passwd(tmp_path, "-c", "--stdin", "passwords", "alice", stdin="first line\nsecond\n"))
    ok(passwd(tmp_path, "--stdin", "passwords", "bob", stdin="crlf\r\n"))
    ok(passwd(tmp_path, "--stdin", "passwords", "carol", stdin="no newline"))
    file = users(path)
    assert file.verify("alice", b"first line")
    assert file.verify("bob", b"crlf")
    assert file.verify("carol", b"no newline")


@pytest.mark.parametrize(
    ("stdin", "message"),
    [("", "no password on standard input"), ("\n", "the password is empty")],
)
def test_stdin_without_a_password(tmp_path: Path, stdin: str, message: str) -> None:
    result = passwd(tmp_path, "-c", "--stdin", "passwords", "alice", stdin=stdin)
    assert error(result, 1) == message
    assert not (tmp_path / "passwords").exists()


def test_a_missing_file_needs_create(tmp_path: Path) -> None:
    result = passwd(tmp_path, "-b", "passwords", "alice", "secret")
    assert error(result, 1) == "passwords: no such file (-c creates it)"
    assert not (tmp_path / "passwords").exists()


def test_deleting_an_unknown_user_fails(tmp_path: Path) -> None:
    ok(passwd(tmp_path, "-c", "-b", "passwords", "alice", "secret"))
    before = (tmp_path / "passwords").read_text()
    assert error(passwd(tmp_path, "-D", "passwords", "bob"), 1) == "passwords: no user 'bob'"
    assert (tmp_path / "passwords").read_text() == before


def test_a_malformed_file_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    path.write_text("# users\nalice $7$101$\n")
    result = passwd(tmp_path, "-b", "passwords", "bob", "secret")
    assert error(result, 1) == (
        "passwords: line 2: expected <username>:<password hash>, found no ':'"
    )
    assert path.read_text() == "# users\nalice $7$101$\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "-D", "passwords", "alice"], "-c and -D cannot be used together"),
        (["-b", "--stdin", "passwords", "alice", "x"], "-b and --stdin cannot be used together"),
        (["-D", "--stdin", "passwords", "alice"], "-D takes no password"),
        (["-c", "-b", "passwords", "alice"], "-b needs a PASSWORD argument"),
        (["-c", "passwords", "alice", "secret"], "PASSWORD is taken with -b only"),
        (["-c", "-b", "passwords", "a:b", "x"], "the username must not contain ':' (got 'a:b')"),
        (["-c", "-b", "passwords", "", "x"], "the username must not be empty"),
        (
            ["-c", "-b", "passwords", "#admin", "x"],
            "the username must not start with '#', a comment (got '#admin')",
        ),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    assert error(passwd(tmp_path, *args), 2) == message
    assert not (tmp_path / "passwords").exists()


def test_iterations_out_of_range_exit_2(tmp_path: Path) -> None:
    result = passwd(tmp_path, "-c", "-b", "--iterations", "0", "passwords", "alice", "x")
    assert result.returncode == 2
    assert "--iterations: must be an integer between 1 and 10000000" in result.stderr
    assert not (tmp_path / "passwords").exists()


def test_no_terminal_to_prompt_on(tmp_path: Path) -> None:
    result = passwd(tmp_path, "-c", "passwords", "alice", stdin="secret\nsecret\n")
    assert error(result, 1) == "no terminal to ask for the password on (use -b or --stdin)"
    assert not (tmp_path / "passwords").exists()


# The prompts, on a pseudo-terminal.

# Runs `mop ARGS` with the terminal on its stdin as its controlling terminal (where getpass asks).
WITH_TERMINAL = (
    "import os, sys; os.setsid(); os.close(os.open(os.ttyname(0), os.O_RDWR)); "
    "os.execv(sys.executable, [sys.executable, '-m', 'mop', *sys.argv[1:]])"
)


def passwd_on_terminal(tmp_path: Path, answers: list[str], *args: str) -> tuple[int, str]:
    """Run `mop passwd ARGS` on a pseudo-terminal, typing one answer per prompt; return its exit
    code and what it wrote on the terminal."""
    try:
        controller, terminal = os.openpty()
    except OSError as exc:
        pytest.skip(f"no pseudo-terminal: {exc}")
    process = subprocess.Popen(
        [sys.executable, "-c", WITH_TERMINAL, "passwd", *args],
        cwd=tmp_path,
        env=environ(),
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    output = b""
    typed = 0
    deadline = time.monotonic() + TIMEOUT
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            if not select.select([controller], [], [], remaining)[0]:
                break
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: every process closed the terminal
                break
            if not chunk:
                break
            output += chunk
            while typed < min(output.count(b"assword: "), len(answers)):
                os.write(controller, answers[typed].encode() + b"\n")
                typed += 1
        code = process.wait(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)
    return code, output.decode(errors="replace")


def test_the_password_is_asked_twice(tmp_path: Path) -> None:
    code, output = passwd_on_terminal(tmp_path, ["hunter2", "hunter2"], "-c", "pw", "alice")
    assert code == 0, output
    assert "Password: " in output
    assert "Reenter password: " in output
    assert "hunter2" not in output  # not echoed
    assert users(tmp_path / "pw").verify("alice", b"hunter2")


def test_passwords_that_do_not_match(tmp_path: Path) -> None:
    code, output = passwd_on_terminal(tmp_path, ["hunter2", "hunter3"], "-c", "pw", "alice")
    assert code == 1, output
    assert "mop: error: the passwords do not match" in output
    assert not (tmp_path / "pw").exists()


# mosquitto itself reads the file.


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for_port(port: int, broker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if broker.poll() is not None:
            pytest.fail(f"mosquitto exited with {broker.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"mosquitto is not listening on port {port}")


@pytest.mark.skipif(
    not (Path(MOSQUITTO).exists() and Path(MOSQUITTO_PUB).exists()),
    reason="mosquitto and mosquitto_pub are not installed",
)
def test_mosquitto_accepts_the_file(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    ok(passwd(tmp_path, "-c", "-b", "passwords", "alice", "old"))
    ok(passwd(tmp_path, "-b", "passwords", "bob", "pä:ss w"))
    ok(passwd(tmp_path, "-b", "passwords", "alice", "new"))
    port = free_port()
    config = tmp_path / "mosquitto.conf"
    config.write_text(
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous false\n"
        f"password_file {path}\n"
        "persistence false\n"
        # When run as root, mosquitto would switch to a user who may not read a 0600 file.
        f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
    )
    broker = subprocess.Popen(
        [MOSQUITTO, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def publish(user: str, password: str) -> int:
        command = [MOSQUITTO_PUB, "-h", "127.0.0.1", "-p", str(port), "-i", "mop-test"]
        command += ["-u", user, "-P", password, "-t", "mop/passwd", "-m", "hello"]
        return subprocess.run(command, capture_output=True, timeout=TIMEOUT).returncode

    try:
        wait_for_port(port, broker)
        assert publish("alice", "new") == 0
        assert publish("bob", "pä:ss w") == 0
        assert publish("alice", "old") != 0
        assert publish("bob", "pä:ss") != 0
        assert publish("mallory", "new") != 0
    finally:
        broker.terminate()
        broker.wait(timeout=TIMEOUT)
