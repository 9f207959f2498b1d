""":func:`harness.canonical.canonical_members` assembles a container's canonical JSON from its members' texts: the
same text as :func:`harness.canonical.canonical_json` of the whole container, whole or in pieces (hypothesis draws the
data; the loop's run identity and the request hasher rely on it)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.canonical import canonical_json, canonical_members

_TEXT = st.text(max_size=12)  # lone surrogates too: canonical_json escapes them
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)


@given(st.lists(_JSON, max_size=6), st.integers(min_value=0, max_value=6))
@settings(max_examples=300, deadline=None)
def test_an_arrays_members_in_one_piece_or_two_give_its_canonical_json(items, cut):
    texts = [canonical_json(item) for item in items]
    assert "[" + canonical_members(texts) + "]" == canonical_json(items)
    head, tail = texts[:cut], texts[cut:]
    pieces = canonical_members(head) + canonical_members(tail, first=not head)
    assert "[" + pieces + "]" == canonical_json(items)


@given(st.dictionaries(_TEXT, _JSON, max_size=6))
@settings(max_examples=300, deadline=None)
def test_an_objects_members_give_its_canonical_json(obj):
    texts = {key: canonical_json(value) for key, value in obj.items()}
    assert "{" + canonical_members(texts) + "}" == canonical_json(obj)


def test_members_after_others_start_with_a_comma_unless_there_are_none():
    assert canonical_members(["1", "2"], first=False) == ",1,2"
    assert canonical_members([], first=False) == ""
    assert canonical_members({"b": "2", "a": "[]"}) == '"a":[],"b":2'
