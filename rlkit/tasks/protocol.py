"""The calculator's tool protocol: how a response calls the tool and how the answer comes back, defined once.

The policy writes ``<code>48-18</code>``; the environment (the tiny engine's sampler, or verl's tool agent loop)
reads the expression between the last :data:`CODE` and that :data:`END_CODE`, runs
:func:`rlkit.tasks.calculator.run_tool`, and writes its answer as ``<output>30</output>`` — text the model does
not write, kept out of its loss. A failed call's answer starts with :data:`TOOL_ERROR` (``error: <reason>``).

Both sides import these names: the task (:mod:`rlkit.tasks.arithmetic`'s gold solutions, the calculator, the
tiny engine's scoring in :mod:`rlkit.tiny.task`) and the tokenizers (:mod:`rlkit.tiny.tokenizer`, whose
vocabulary holds the four tags as single tokens; the exported Hugging Face tokenizer and chat template of
:mod:`rlkit.tiny.hf`; verl's tool parser in :mod:`rlkit.verl.tools`). Changing a tag changes token ids of
trained checkpoints.
"""

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


__all__ = ["CODE", "END_CODE", "END_OUTPUT", "OUTPUT", "TOOL_ERROR", "TOOL_TAGS", "tool_call"]
