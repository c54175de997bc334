"""The store's fast JSON text is exactly the contract's `dumps`, for every JSON value."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane._json import dumps
from persistence._codec import to_json

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=500)
@given(json_values)
def test_fast_json_text_equals_the_contracts_dumps(value: object) -> None:
    assert to_json(value) == dumps(value)


def test_text_that_needs_escapes_takes_the_contracts_path_and_still_agrees() -> None:
    for value in [
        {"text": "héllo 世界 🚀"},
        {"ctl": "bell \x07 del \x7f nul \x00"},
        {"path": "C:\\users\\me"},
        {"ключ": ["значение"]},
        "plain ascii",
    ]:
        text = to_json(value)
        assert text == dumps(value)
        assert json.loads(text) == value
