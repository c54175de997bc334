"""The store's JSON text reads back exactly, with its own decoder and with any JSON reader."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from persistence._codec import from_json, to_json
from tests.persistence.conftest import json_values


@settings(max_examples=500)
@given(json_values)
@pytest.mark.slow  # measured: 28 s under load (--durations)
def test_stored_json_text_reads_back_exactly_with_ours_and_any_json_reader(value: object) -> None:
    text = to_json(value)
    assert from_json(text) == value
    assert from_json(text.encode()) == value
    assert json.loads(text) == value


def test_integers_beyond_64_bits_take_the_exact_path_and_keep_every_digit() -> None:
    for big in [2**64, -(2**63) - 1, 10**30, {"n": [2**70]}]:
        text = to_json(big)
        assert text.startswith(" ")
        assert from_json(text) == big
        assert type(from_json(text)) is type(big)
    assert not to_json(2**63 - 1).startswith(" ")
    assert from_json(to_json(2**63 - 1)) == 2**63 - 1


def test_text_that_needs_escapes_round_trips() -> None:
    for value in [
        {"text": "héllo 世界 🚀"},
        {"ctl": "bell \x07 del \x7f nul \x00"},
        {"path": "C:\\users\\me"},
        {"ключ": ["значение"]},
        "plain ascii",
    ]:
        text = to_json(value)
        assert json.loads(text) == value
        assert from_json(text) == value
        assert "\x00" not in text  # JSON escapes NUL, so a PostgreSQL text column keeps it
