"""The calculator tool as the function-calling harness answers it."""

from __future__ import annotations

import pytest

from asyncrl.actors.tasks.calculator_tools_harness import DISPLAY, tool_answer


@pytest.mark.parametrize(
    ("name", "arguments", "answer"),
    [
        ("calculator", '{"expression": "34*56+12"}', "1916"),
        ("calculator", '{"expression": "12-999"}', "-987"),
        ("calculator", '{"expression": "34*"}', "?"),  # not an expression it reads
        ("calculator", '{"expression": 3456}', "?"),  # not text
        ("calculator", '{"value": "1+2"}', "?"),  # no expression
        ("calculator", '["1+2"]', "?"),  # not an object
        ("calculator", '{"expression": "1+2"', "?"),  # not JSON
        ("search", '{"expression": "1+2"}', "?"),  # another tool
        ("calculator", '{"expression": "9999999*9999999"}', "?"),  # past its display
    ],
)
def test_the_calculator_answers_what_it_can_read(name: str, arguments: str, answer: str) -> None:
    assert tool_answer(name, arguments) == answer
    assert len(answer) <= DISPLAY
