"""The calculator's tool protocol, defined once: the policy writes ``<code>48-18</code>``, the environment (the tiny
sampler, verl's tool agent loop) ``<output>30</output>`` (:func:`rlkit.tasks.calculator.run_tool`), kept out of
the loss. Task, calculator and tokenizers import these names: changing a tag changes checkpoints' token ids."""

from __future__ import annotations

CODE, END_CODE = "<code>", "</code>"
"""Open and close a calculator call: the expression is the text between them."""

OUTPUT, END_OUTPUT = "<output>", "</output>"
"""Open and close the calculator's answer, which the environment writes."""

TOOL_TAGS: tuple[str, ...] = (CODE, END_CODE, OUTPUT, END_OUTPUT)
"""The four tags, in the order of the tiny tokenizer's ids: each a single token in every tokenizer that speaks
the protocol."""

TOOL_ERROR = "error"
"""How a failed call's answer starts (``error: <reason>``); any other answer is the call's value."""


def tool_call(expression: str, answer: str) -> str:
    """``<code>expression</code><output>answer</output>``: one call and its answer as a response holds them."""
    return f"{CODE}{expression}{END_CODE}{OUTPUT}{answer}{END_OUTPUT}"
