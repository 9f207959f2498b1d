"""Classifier 2.11.0: a tool's result is read whether it is JSON or a Python literal (a tool written in Python that
returns ``str(dict)``), so the values a reply restates are checked against it the same way (docs/failure-modes.md,
``fabricated_tool_result`` rule 3). Constructed replies, both ways, each with the JSON result beside the repr one.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import FILE_TOOLS as FILES
from tests.helpers import function_tool
from tests.helpers import reply_modes as modes

WEATHER = [function_tool("get_current_weather", "Get the current weather.", {"city": {"type": "string"}}, ["city"])]
FAB = "fabricated_tool_result"


def answered(name: str, arguments: dict, result: str) -> list[dict]:
    """The history of one structured call and the tool's answer to it."""
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]


def weather_modes(reply: str, result: object, *, as_repr: bool) -> set[str]:
    body = repr(result) if as_repr else json.dumps(result)
    history = answered("get_current_weather", {"city": "Paris"}, body)
    return modes(reply, WEATHER, "What is the weather in Paris?", history=history)


def listing_modes(reply: str, names: list[str], *, as_repr: bool) -> set[str]:
    body = repr(names) if as_repr else json.dumps(names)
    return modes(reply, FILES, "List the files, then tell me how many there are.", history=answered("list_files", {}, body))


@pytest.mark.parametrize("as_repr", [False, True], ids=["json", "python-repr"])
def test_a_restated_temperature_from_a_keyed_result_is_no_fabrication(as_repr):
    result = {"city": "Paris", "temperature_c": 17, "condition": "cloudy"}
    assert FAB not in weather_modes("It is 17°C and cloudy in Paris.", result, as_repr=as_repr)


@pytest.mark.parametrize("as_repr", [False, True], ids=["json", "python-repr"])
def test_a_contradicted_temperature_from_a_keyed_result_is_fabrication(as_repr):
    result = {"city": "Paris", "temperature_c": 17, "condition": "cloudy"}
    assert FAB in weather_modes("It is 21°C and cloudy in Paris.", result, as_repr=as_repr)


@pytest.mark.parametrize("as_repr", [False, True], ids=["json", "python-repr"])
def test_a_keyed_value_that_differs_from_the_result_is_fabrication(as_repr):
    result = {"city": "Paris", "temperature_c": 17, "humidity": 65}
    assert FAB in weather_modes("It is 17°C in Paris; the humidity is 80.", result, as_repr=as_repr)
    assert FAB not in weather_modes("It is 17°C in Paris; the humidity is 65.", result, as_repr=as_repr)


@pytest.mark.parametrize("as_repr", [False, True], ids=["json", "python-repr"])
def test_a_file_count_is_checked_against_a_listing_in_either_notation(as_repr):
    names = ["a.txt", "b.txt", "c.txt"]
    assert FAB in listing_modes("There are 4 files: a.txt, b.txt and c.txt.", names, as_repr=as_repr)
    assert FAB not in listing_modes("There are 3 files: a.txt, b.txt and c.txt.", names, as_repr=as_repr)


@pytest.mark.parametrize("result", ["ERROR: no such file", "[unterminated", "{'a': undefined_name}", "[" * 5000 + "]" * 5000])
def test_a_result_that_is_no_literal_holds_no_listing_to_count_against(result):
    """Text, a broken container, a name (not a literal) and nesting too deep to parse are no listing: the count is not
    checked against them, and classify answers."""
    history = answered("list_files", {}, result)
    assert FAB not in modes("There are 4 files.", FILES, "How many files are there?", history=history)
