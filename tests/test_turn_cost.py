"""The shortcuts taken for the per-turn cost (issue 14) give exactly what the general code gives.

Each shortcut answers a common case without running the general code; these tests run both on the same
inputs (hypothesis draws them) and require the same result, so a later change to the general code that the
shortcut does not follow fails here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.backends.base import GenerateOptions
from harness.canonical import canonical_json
from harness.classifier import content, validate, values
from harness.errors import ToolError
from harness.ledger import chain
from harness.ledger.chain import storable
from harness.ledger.records import TurnRecord, json_columns
from harness.run_facts import sandbox_path as _sandbox_path
from harness.tool_protocol import RequestHasher, request_hash
from harness.tools import Sandbox, is_within, read_at_most, write_all

_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
_WILD_TEXT = st.text(max_size=20)  # lone surrogates too
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _WILD_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)


@given(_JSON)
@settings(max_examples=300, deadline=None)
def test_canonical_json_is_the_json_dumps_text(value):
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    assert canonical_json(value) == text.encode("utf-8", "backslashreplace").decode("utf-8")


@given(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | _WILD_TEXT,
    st.sampled_from(["TEXT", "INTEGER", "REAL", ""]),
)
@settings(max_examples=400, deadline=None)
def test_storable_takes_common_values_as_the_general_path_does(value, declared):
    expected = chain._stored_as(value, declared)
    got = storable(value, declared)
    assert got == expected and type(got) is type(expected)


@given(content=st.none() | _WILD_TEXT, raw=st.none() | _WILD_TEXT | st.dictionaries(_TEXT, _TEXT, max_size=2))
@settings(max_examples=200, deadline=None)
def test_json_columns_store_strings_as_text_and_payload_fields_as_json(content, raw):
    record = TurnRecord(run_id="r", turn=1, request_hash="h", raw_reply=raw, content=content, tool_calls=None,
                        recovered_calls=[], executed_calls=[], failure_modes=[], recovered_by=None,
                        classifier_version="v", finish_reason="stop", prompt_tokens=1, completion_tokens=None,
                        latency_ms=None, started_at="s", ended_at="e", details={})  # fmt: skip
    columns = json_columns(record)
    assert columns["content"] == content  # a plain text column, as given
    assert columns["raw_reply"] == (None if raw is None else canonical_json(raw))  # JSON text, a string too
    assert columns["failure_modes"] == "[]" and columns["details"] == "{}"


@given(st.sampled_from([{}, {"list_files": {"type": "object"}}]), st.booleans())
def test_empty_content_is_read_as_the_general_analysis_reads_it(offered, tools_known):
    assert content.analyse_content("", offered, tools_known=tools_known) == content._analyse("", offered, tools_known=tools_known)


_PLAIN_PROPERTY = st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "boolean", "integer", "number"])},
    optional={"description": st.text(max_size=5), "default": st.integers() | st.text(max_size=3)},
)
_SCHEMA = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "array"]), "properties": st.dictionaries(st.sampled_from("abc"), _PLAIN_PROPERTY)},
    optional={"required": st.lists(st.sampled_from("abcd"), max_size=3), "description": st.text(max_size=5),
              "additionalProperties": st.booleans()},
)  # fmt: skip
_ARGUMENTS = st.dictionaries(st.sampled_from("abcd"), st.none() | st.booleans() | st.integers() | st.text(max_size=3), max_size=4)


@given(_SCHEMA, _ARGUMENTS)
@settings(max_examples=500, deadline=None)
def test_plainly_valid_arguments_are_valid_to_jsonschema_too(schema, arguments):
    if validate._plainly_valid(schema, arguments):
        assert validate._checked_errors(schema, arguments) == []
    assert validate._schema_errors(schema, arguments) == validate._checked_errors(schema, arguments)


@given(st.lists(st.sampled_from(["a", "b", "..", ".", "a.txt", ""]), max_size=4))
def test_is_within_is_the_parents_test(tmp_path_factory, parts):
    root = Sandbox(tmp_path_factory.mktemp("box")).root
    path = (root / "/".join(parts)).resolve()
    assert is_within(root, path) == (path == root or root in path.parents)
    assert is_within(root.parent, root) and not is_within(root, root.parent)


def test_fixtures_are_written_as_text(tmp_path):
    box = Sandbox(tmp_path / "new" / "box")  # a missing parent: made as Path.mkdir(parents=True) makes it
    box.seed({"a.txt": "é\n", "d/b.md": "x" * 70_000})
    assert (box.root / "a.txt").read_bytes() == "é\n".encode()
    assert (box.root / "d" / "b.md").read_text() == "x" * 70_000
    Sandbox(box.root)  # an existing folder is fine too
    assert sorted(p.name for p in box.root.iterdir()) == ["a.txt", "d"]


@given(st.text(max_size=12))
@settings(max_examples=500, deadline=None)
def test_a_result_that_no_json_value_starts_holds_no_value(text):
    body = text.strip()
    if body[:1] in values._JSON_STARTS:
        return
    assert values.result_value(text) is None
    assert values._CONTAINER.match(body) is None
    with pytest.raises(ValueError):
        json.loads(body)


@given(st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63 - 2, max_value=2**1100) | st.floats())
@settings(max_examples=400, deadline=None)
def test_storable_is_what_sqlite_gives_back_in_each_declared_type(value):
    """The chain's contract (:func:`storable`): the hashed value is the one a real SQLite file returns (numbers in
    every declared type; text goes only to TEXT and untyped columns). An integer past 64 bits used to be hashed as
    text while SQLite kept a REAL, so ``verify`` would have called the row edited (token counts are capped before
    they reach the ledger, so no recorded run was affected)."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a TEXT, b INTEGER, c REAL, d)")
    stored = [storable(value, declared) for declared in ("TEXT", "INTEGER", "REAL", "")]
    db.execute("INSERT INTO t VALUES (?, ?, ?, ?)", stored)
    back = list(db.execute("SELECT a, b, c, d FROM t").fetchone())
    assert [(type(v), v) for v in back] == [(type(v), v) for v in stored]


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.none() | st.booleans() | st.integers() | st.floats() | _WILD_TEXT),
       st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sampled_from(["TEXT", "INTEGER", "REAL", ""])))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_storable_row_is_storable_of_every_value(values, declared):
    row = chain.storable_row(values, declared)
    expected = {k: storable(v, declared.get(k, "")) for k, v in values.items()}
    assert list(row) == list(expected)
    assert all(row[k] == expected[k] or (row[k] != row[k] and expected[k] != expected[k]) for k in row)
    assert all(type(row[k]) is type(expected[k]) for k in row)


def _tree(root):
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "X.TXT").write_text("x")
    (root / "a" / "b" / ".hidden").write_text("h")
    (root / "top.csv").write_text("t")
    outside = root.parent / f"{root.name}-outside"
    outside.mkdir()
    (outside / "outside.md").write_text("o")
    (root / "a" / "into_outside").symlink_to(outside)  # a symlinked folder: not entered
    (root / "a" / "to_top").symlink_to(root / "top.csv")  # a symlink to a file: a file
    (root / "a" / "dangling").symlink_to(root / "missing")
    os.mkfifo(root / "a" / "fifo")


def test_existing_names_are_the_rglob_names(tmp_path):
    from harness.checks import _existing_names

    root = tmp_path / "box"
    root.mkdir()
    _tree(root)
    assert _existing_names(root) == {p.name.lower() for p in root.rglob("*") if p.is_file()}


def test_a_check_on_a_fifo_or_a_folder_says_it_does_not_exist_without_waiting(tmp_path):
    from harness.checks import CheckContext, evaluate_checks

    root = Sandbox(tmp_path / "box").root
    os.mkfifo(root / "report.txt")  # opening it for reading without O_NONBLOCK would wait for a writer forever
    (root / "d").mkdir()
    checks = [{"type": "file_exists", "path": "report.txt"}, {"type": "file_exists", "path": "d"}]
    for real in (False, True):
        results = evaluate_checks(checks, CheckContext(root, (), (), None, 0, real=real))
        assert [(r.passed, r.detail) for r in results] == [(False, "report.txt does not exist"), (False, "d does not exist")]


def test_a_fixture_name_that_is_a_symlink_is_resolved_as_any_path(tmp_path):
    """Plain fixture names are opened at once (O_NOFOLLOW); one that is a symlink goes through :meth:`Sandbox.resolve`."""
    box = Sandbox(tmp_path / "box")
    (box.root / "inside.txt").write_text("old")
    (box.root / "in.txt").symlink_to(box.root / "inside.txt")
    (box.root / "out.txt").symlink_to(tmp_path / "victim.txt")
    box.seed({"in.txt": "new"})
    assert (box.root / "inside.txt").read_text() == "new"  # written through, as resolve() gives it
    with pytest.raises(ToolError):
        box.seed({"out.txt": "x"})
    assert not (tmp_path / "victim.txt").exists() and box.escape_attempts == ["out.txt"]


@given(st.lists(st.sampled_from(["a", "b", "c.txt"]), max_size=3))
def test_relative_is_relative_to(tmp_path_factory, parts):
    box = Sandbox(tmp_path_factory.mktemp("box"))
    path = box.root.joinpath(*parts)
    assert box.relative(path) == (path.relative_to(box.root).as_posix() or ".")
    with pytest.raises(ValueError):
        box.relative(box.root.parent / "elsewhere")


@given(st.lists(st.lists(st.dictionaries(_TEXT, _JSON, max_size=4), max_size=3), max_size=5))
@settings(max_examples=60, deadline=None)
def test_the_request_hasher_gives_request_hash_as_the_list_grows(batches):
    hasher, messages = RequestHasher(), []
    assert hasher.digest(messages) == request_hash(messages)
    for batch in batches:  # the loop appends an assistant message and its results between two requests
        messages.extend(batch)
        assert hasher.digest(messages) == request_hash(messages)
        assert hasher.digest(messages) == request_hash(messages)  # asked again: nothing added twice


def test_the_request_hasher_refuses_a_list_that_shrank():
    hasher = RequestHasher()
    hasher.digest([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(ValueError, match="shrank"):
        hasher.digest([{"role": "user", "content": "a"}])


@given(
    st.floats(allow_nan=False),
    st.integers(min_value=0, max_value=2**40),
    st.booleans(),
    st.sampled_from(["default", "on", "off"]),
)
def test_options_as_dict_is_asdict_without_the_unset_settings(temperature, seed, stream, think):
    options = GenerateOptions(temperature=temperature, seed=seed, think=think, stream=stream)
    whole = dataclasses.asdict(options)
    expected = {k: v for k, v in whole.items() if not (k == "think" and v == "default") and not (k == "stream" and not v)}
    assert options.as_dict() == expected and list(options.as_dict()) == list(expected)


@given(st.binary(max_size=3000), st.integers(min_value=0, max_value=4000), st.integers(min_value=0, max_value=3000))
@settings(max_examples=60, deadline=None)
def test_read_at_most_reads_what_a_file_object_reads(tmp_path_factory, data, limit, offset):
    path = tmp_path_factory.mktemp("read") / "f"
    path.write_bytes(data)
    with open(path, "rb") as handle:
        handle.seek(offset)
        expected = handle.read(limit)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        assert read_at_most(fd, limit) == expected
    finally:
        os.close(fd)


@given(st.binary(max_size=200_000))
@settings(max_examples=20, deadline=None)
def test_write_all_writes_every_byte(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("write") / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
    assert path.read_bytes() == data


def test_the_sandbox_path_is_the_real_path_of_the_run_folder(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "runs").symlink_to(real)  # the runs folder is a symlink
    (real / "linked").symlink_to(tmp_path)  # a run folder that is one
    monkeypatch.chdir(tmp_path)
    for runs_dir in (tmp_path / "runs", "runs", str(tmp_path / "missing")):
        for run_id in ("0123abcd", "linked", "a/../b", "../outside", str(tmp_path / "abs"), "linked/x"):
            for _ in range(2):  # the second time from the remembered folder
                expected = os.path.realpath(os.path.join(runs_dir, run_id))
                assert _sandbox_path(runs_dir, run_id) == expected, (runs_dir, run_id)
