"""The A2A front's setup rules: where it may listen, when a token is needed (and made, into a
file only its owner reads), what ``--setup`` may name, which provider starts children."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from controlplane import ErrorCode, InProcessProvider, ScriptedModel, SubagentControl
from controlplane.fronts._a2a_setup import (
    bearer_token,
    is_loopback,
    load_setup,
    parse_bind,
    start_provider,
)
from tests.support import raises


@pytest.mark.parametrize(
    ("text", "bind"),
    [("127.0.0.1:8000", ("127.0.0.1", 8000)), ("[::1]:0", ("::1", 0)), ("host:1", ("host", 1))],
)
def test_a_bind_is_host_and_port(text: str, bind: tuple[str, int]) -> None:
    assert parse_bind(text) == bind


@pytest.mark.parametrize("text", ["8000", ":8000", "host:", "host:http", "host:70000"])
def test_anything_else_is_not_a_bind(text: str) -> None:
    with raises(ErrorCode.INVALID_INPUT, match="HOST:PORT"):
        parse_bind(text)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.0.2.1", False),
        ("example.com", False),
    ],
)
def test_only_this_machine_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_loopback_bind_needs_no_token_unless_one_is_given(tmp_path: Path) -> None:
    token_file = tmp_path / "token"

    assert bearer_token("127.0.0.1", token=None, token_file=token_file) is None
    assert bearer_token("127.0.0.1", token="given", token_file=token_file) == "given"
    assert not token_file.exists()


def test_any_other_bind_gets_a_made_token_in_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old\n")
    token_file.chmod(0o644)

    token = bearer_token("192.0.2.1", token=None, token_file=token_file)

    assert token is not None
    assert len(token) >= 32
    assert token_file.read_text() == f"{token}\n"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600


@pytest.mark.parametrize("token", ["", "  ", "has space", "naïve"])
def test_a_blank_or_unprintable_token_is_refused(token: str, tmp_path: Path) -> None:
    with raises(ErrorCode.INVALID_INPUT, match="--token"):
        bearer_token("192.0.2.1", token=token, token_file=tmp_path / "token")


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("no_colon", "MODULE:FUNCTION"),
        ("tests.fronts.no_such_module:setup", "cannot import"),
        ("tests.fronts.a2a_setup:no_such_function", "no function"),
    ],
)
def test_a_setup_that_is_not_a_function_is_refused(target: str, why: str) -> None:
    with raises(ErrorCode.INVALID_INPUT, match=why):
        load_setup(target)


def test_children_start_on_the_only_provider_else_on_inprocess(control: SubagentControl) -> None:
    assert start_provider(control) == "fake"  # the conftest's only provider
    control.providers.register(InProcessProvider(ScriptedModel(), name="other"))
    with raises(ErrorCode.UNKNOWN_PROVIDER, match="--setup"):
        start_provider(control)
    control.providers.register(InProcessProvider(ScriptedModel()))
    assert start_provider(control) == "inprocess"
