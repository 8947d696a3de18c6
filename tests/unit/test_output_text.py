"""The output helper's text: JSON the same value with no raw line break in
it, table cells and error lines on one line each."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from commands.output import json_text, printable

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(VALUES, st.sampled_from([None, 2]))
def test_json_text_is_the_same_value_and_one_line_per_line_json_writes(value, indent):
    text = json_text(value, indent)

    assert json.loads(text) == value
    assert text.splitlines() == text.split("\n")  # the indent's newlines break lines, only they


def test_json_text_leaves_text_without_line_breaks_as_json_dumps_writes_it():
    value = {"node": "nœud \\u2028 \u00e9", "n": [1, None]}
    assert json_text(value) == json.dumps(value, ensure_ascii=False)


@given(st.text())
@example("a\u2028b\u2029c\x85d\re\nf")  # the line breaks random text seldom holds
def test_printable_text_is_one_line(text):
    assert len(printable(text).splitlines()) <= 1


def test_printable_names_what_it_escapes():
    assert printable("a\nb\rc\td\x1be\x7ff\x85g\u2028h\u2029i") == (
        "a\\nb\\rc\\td\\x1be\\x7ff\\x85g\\u2028h\\u2029i")
    assert printable("plain, ü") == "plain, ü"
