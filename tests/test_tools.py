"""Tools that answer from fixture data: deterministic output, data the model cannot override."""

from __future__ import annotations

import json

import pytest

from harness.tools import BUILTIN_TOOLS, Sandbox

WEATHER = {
    "Paris": {"temperature_c": 17, "condition": "light drizzle", "humidity_pct": 82},
    "Lisbon": {"temperature_c": 24, "condition": "sunny"},
}
TICKETS = {"T-2": "second", "T-1": "first"}


@pytest.fixture
def box(tmp_path):
    return Sandbox(tmp_path / "box")


def test_weather_answers_from_fixture_data_case_insensitively(box):
    tool = BUILTIN_TOOLS["get_current_weather"].with_data(WEATHER)
    first = tool.call(box, {"city": "Paris"})
    assert not first.error
    assert json.loads(first.output) == {"city": "Paris", "temperature_c": 17, "condition": "light drizzle", "humidity_pct": 82}
    assert tool.call(box, {"city": "  paris "}).output == first.output  # deterministic, same text every time
    assert json.loads(tool.call(box, {"city": "LISBON"}).output)["temperature_c"] == 24


@pytest.mark.parametrize(
    ("arguments", "output"),
    [
        ({"city": "Berlin"}, "ERROR: no weather data for 'Berlin'"),
        ({"city": ""}, 'ERROR: city must be a non-empty string, got ""'),
        ({"city": 7}, "ERROR: city must be a non-empty string, got 7"),
        ({}, "ERROR: missing required argument(s) city"),
        ({"city": "Paris", "data": {"Paris": {}}}, "ERROR: unexpected argument(s) data; get_current_weather takes city"),
    ],
)
def test_weather_errors_go_back_to_the_model(box, arguments, output):
    result = BUILTIN_TOOLS["get_current_weather"].with_data(WEATHER).call(box, arguments)
    assert (result.error, result.output) == (True, output)


def test_unbound_data_tool_answers_with_an_error_not_a_crash(box):
    result = BUILTIN_TOOLS["get_current_weather"].call(box, {"city": "Paris"})
    assert (result.error, result.output) == (True, "ERROR: no weather data for 'Paris'")


def test_list_tickets_keeps_the_scenario_order(box):
    tool = BUILTIN_TOOLS["list_tickets"].with_data(TICKETS)
    result = tool.call(box, {})
    assert json.loads(result.output) == [{"id": "T-2", "text": "second"}, {"id": "T-1", "text": "first"}]
    refused = tool.call(box, {"status": "open"})
    assert (refused.error, refused.output) == (True, "ERROR: unexpected argument(s) status; list_tickets takes none")


def test_data_tools_touch_no_files(box):
    BUILTIN_TOOLS["list_tickets"].with_data(TICKETS).call(box, {})
    BUILTIN_TOOLS["get_current_weather"].with_data(WEATHER).call(box, {"city": "Paris"})
    assert list(box.root.iterdir()) == [] and box.written == [] and box.escape_attempts == []


def test_with_data_refuses_a_tool_that_takes_none():
    with pytest.raises(ValueError, match="tool 'read_file' takes no fixture data"):
        BUILTIN_TOOLS["read_file"].with_data({"a": "b"})


def test_binding_data_leaves_the_builtin_and_the_schema_unchanged():
    bound = BUILTIN_TOOLS["get_current_weather"].with_data(WEATHER)
    assert BUILTIN_TOOLS["get_current_weather"].data is None
    assert bound.schema() == BUILTIN_TOOLS["get_current_weather"].schema()
    assert bound.schema()["function"]["parameters"]["required"] == ["city"]
