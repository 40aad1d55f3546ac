"""`kbv serve` refuses what it cannot honour in one line and exit code 2, before it serves anything."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from kbv.cli import ExitCode, app
from kbv.serve.server import is_local


def _serve(*args: str, env: dict[str, str] | None = None):
    result = CliRunner().invoke(app, ["serve", "--device", "cpu", *args], env=env)
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    return result.output


def test_a_host_beyond_this_machine_needs_a_token():
    assert "--host 0.0.0.0 serves beyond this machine: give --token-env" in _serve("--host", "0.0.0.0")


def test_a_token_variable_that_is_not_set_is_refused():
    assert "--token-env KBV_NO_SUCH_TOKEN: that environment variable is not set" in _serve(
        "--token-env", "KBV_NO_SUCH_TOKEN", env={"KBV_NO_SUCH_TOKEN": ""})


def test_a_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert f"cannot listen on 127.0.0.1:{port}" in _serve("--port", str(port), "--run", str(tmp_path / "run"))


@pytest.mark.parametrize("args, message", [
    (("--reward", "speed"), "Unknown reward 'speed'"),
    (("--max-queue", "0"), "--max-queue must be >= 1"),
    (("--timer-budget", "-1"), "--timer-budget -1: expected a positive number of seconds."),
    (("--trials", "0"), "--trials 0: expected 1 or more."),
    (("--drain-timeout", "nan"), "--drain-timeout nan: expected 0 or more seconds."),
    (("--problems", "no/such/dir"), "No problems at 'no/such/dir'"),
])
def test_bad_options_are_one_line(args, message, tmp_path):
    assert message in _serve("--port", "0", "--run", str(tmp_path / "run"), *args)


@pytest.mark.parametrize("host, local", [("127.0.0.1", True), ("127.3.4.5", True), ("localhost", True),
                                         ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
                                         ("10.0.0.2", False), ("example.org", False)])
def test_local_hosts(host, local):
    assert is_local(host) is local
