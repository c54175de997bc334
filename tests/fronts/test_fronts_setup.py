"""The setup every front shares (`controlplane.fronts._setup`): one set of flags for both
commands, what ``--setup`` may name, and which provider starts children."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from controlplane import ErrorCode, InProcessProvider, ScriptedModel, SubagentControl
from controlplane.cli import main
from controlplane.fronts import (
    DEFAULT_PROVIDER,
    FrontOptions,
    add_front_arguments,
    default_provider,
    load_setup,
    open_front,
)
from tests.support import raises

SHARED_FLAGS = ("--db", "--parent", "--setup", "--openai-model", "--openai-base-url",
                "--provider", "--token", "--http")  # fmt: skip


def _help(front: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([front, "--help"]) == 0
    return capsys.readouterr().out


def test_both_fronts_take_the_same_flags_for_the_same_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    helps = {front: _help(front, capsys) for front in ("mcp", "a2a")}

    for front, text in helps.items():
        assert all(flag in text for flag in SHARED_FLAGS), (front, text)
        assert "--token-file" not in text
        assert f"(default: {front})" in text  # each front's own parent session
    assert "--max-body" in helps["a2a"]


def test_the_shared_flags_parse_into_front_options() -> None:
    parser = argparse.ArgumentParser()
    add_front_arguments(parser, default_parent="a2a")

    given = parser.parse_args(
        ["--db", "sqlite:///x.db", "--setup", "m:f", "--provider", "prov", "--token", "t0k"]
    )
    defaults = parser.parse_args(["--db", "sqlite:///x.db"])

    assert FrontOptions.from_args(given) == FrontOptions(
        db="sqlite:///x.db", parent="a2a", setup="m:f", provider="prov"
    )
    assert given.token == "t0k"
    assert FrontOptions.from_args(defaults) == FrontOptions(db="sqlite:///x.db", parent="a2a")
    assert defaults.token is None


def test_the_a2a_body_cap_is_a_positive_number_of_bytes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["a2a", "--db", "d", "--http", ":0", "--max-body", "0"]) == 2
    assert "--max-body: must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("no_colon", "MODULE:FUNCTION"),
        (":setup", "MODULE:FUNCTION"),
        ("tests.fronts.no_such_module:setup", "cannot import"),
        ("tests.fronts.a2a_setup:no_such_function", "no function"),
    ],
)
def test_a_setup_that_is_not_a_function_is_refused(target: str, why: str) -> None:
    with raises(ErrorCode.INVALID_INPUT, match=why):
        load_setup(target)


def test_setup_and_openai_model_together_are_refused_before_the_store_opens(
    tmp_path: Path,
) -> None:
    db = tmp_path / "state.db"
    options = FrontOptions(db=f"sqlite:///{db}", parent="p", setup="m:f", openai_model="m")

    with raises(ErrorCode.INVALID_INPUT, match="not both"):
        open_front(options)
    assert not db.exists()


def test_children_start_on_the_only_provider_else_on_inprocess(control: SubagentControl) -> None:
    assert default_provider(control) == "fake"  # the conftest's only provider
    control.providers.register(InProcessProvider(ScriptedModel(), name="other"))
    assert default_provider(control) == DEFAULT_PROVIDER == "inprocess"


def test_a_named_provider_wins_over_the_default(sqlite_url: str) -> None:
    setup = "tests.fronts.a2a_setup:setup"  # registers one provider, `inprocess`
    named = open_front(FrontOptions(db=sqlite_url, parent="p", setup=setup, provider="other"))
    named.control.close()
    chosen = open_front(FrontOptions(db=sqlite_url, parent="p", setup=setup))
    chosen.control.close()

    assert (named.provider, chosen.provider) == ("other", "inprocess")
