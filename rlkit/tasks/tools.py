"""Detect code/tool calls in a response, for ASPO (:mod:`rlkit.methods.aspo`): where the first one starts (in
tokens) and how many there are. Four detectors, switched in :class:`CodeDetection` (the first three: the verl ASPO
recipe's ``algorithm.aspo.code_detection``): chat messages' ``tool_calls`` (a count, no position), markdown fences
(not ```` ```output ````), ``<code>``/``<pre>`` tags and tool-call JSON (``<tool_call>``, ``{"name": …,
"arguments": …}``). A call is a character span (an unclosed one runs to the end; one inside another is part of
it); token positions come from the offset mapping and count tool output, as ASPO's lengths must.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

Span = tuple[int, int]

_FENCE = re.compile(r"```[ \t]*([^\s`]*).*?(?:```|\Z)", re.DOTALL)
_HTML = re.compile(r"<\s*(code|pre)\b[^>]*>.*?(?:<\s*/\s*\1\s*>|\Z)", re.DOTALL | re.IGNORECASE)
_TOOL_CALL_TAG = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)
# a JSON key whose value is a call; the value (from the "[" or "{") is decoded to find where the call ends
_TOOL_CALL_KEY = re.compile(r'"(?:tool_calls|function_call)"\s*:\s*(?=[\[{])')
# {"name": "...", "arguments": ...}: the object from its "{" is one call
_NAME_ARGS_OBJECT = re.compile(r'\{\s*"(?:name|tool_name)"\s*:\s*"[^"]*"\s*,\s*"(?:arguments|parameters)"\s*:')
_JSON = json.JSONDecoder(strict=False)  # strict=False: models write raw newlines inside JSON strings

TOOL_ROLES = ("tool", "function", "ipython")


@dataclass(frozen=True)
class CodeDetection:
    """Which detectors run (the verl ASPO recipe's ``algorithm.aspo.code_detection``, plus two fields)."""

    prefer_structured_tool_calls: bool = True  # Count calls from chat messages, when given, rather than the text.
    markdown_backticks: bool = True  # ```` ``` ```` fenced blocks are calls.
    html_code_tags: bool = True  # ``<code>``/``<pre>`` blocks are calls (the tiny engine's tool form).
    tool_call_json: bool = True  # ``<tool_call>`` blocks and tool-call JSON are calls.
    result_fences: tuple[str, ...] = ("output",)  # Fence labels (any case) that mark a tool's result, not a call.


_DEFAULT = CodeDetection()


def _json_end(text: str, start: int) -> int:
    """End of the JSON value starting at ``start``; the end of the text if it does not parse (unclosed)."""
    try:
        return _JSON.raw_decode(text, start)[1]
    except json.JSONDecodeError:
        return len(text)


def _raw_spans(text: str, detection: CodeDetection) -> list[Span]:
    spans: list[Span] = []
    if detection.markdown_backticks:
        results = {label.lower() for label in detection.result_fences}
        spans += [m.span() for m in _FENCE.finditer(text) if m.group(1).lower() not in results]
    if detection.html_code_tags:
        spans += [m.span() for m in _HTML.finditer(text)]
    if detection.tool_call_json:
        spans += [m.span() for m in _TOOL_CALL_TAG.finditer(text)]
        spans += [(m.start(), _json_end(text, m.end())) for m in _TOOL_CALL_KEY.finditer(text)]
        spans += [(m.start(), _json_end(text, m.start())) for m in _NAME_ARGS_OBJECT.finditer(text)]
    return spans


def find_code_calls(text: str, detection: CodeDetection | None = None) -> list[Span]:
    """Character spans ``(start, end)`` of the code/tool calls in ``text``, in order, nested ones merged."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__} (pass chat messages as messages=)")
    calls: list[Span] = []
    for start, end in sorted(_raw_spans(text, detection or _DEFAULT), key=lambda s: (s[0], -s[1])):
        if calls and start < calls[-1][1]:
            continue  # starts inside the previous call: part of it
        calls.append((start, end))
    return calls


def first_code_char(text: str, detection: CodeDetection | None = None) -> int | None:
    """Character index where the first call starts, or None when there is none."""
    calls = find_code_calls(text, detection)
    return calls[0][0] if calls else None


def _message_list(messages: Any) -> Sequence[Mapping]:
    if isinstance(messages, Mapping) and "messages" in messages:  # verl's agent loop: {"messages": [...]}
        messages = messages["messages"]
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of chat-message dicts, got {type(messages).__name__}")
    if not all(isinstance(m, Mapping) for m in messages):
        raise ValueError("every chat message must be a dict with 'role' and 'content'")
    return messages


def structured_tool_calls(messages: Any) -> int:
    """Tool calls in chat ``messages``: the assistant's ``tool_calls``, or the tool turns if more."""
    messages = _message_list(messages)
    made = sum(len(m.get("tool_calls") or ()) + (1 if m.get("function_call") else 0) for m in messages)
    answered = sum(m.get("role") in TOOL_ROLES for m in messages)
    return max(made, answered)


def count_code_calls(text: str, detection: CodeDetection | None = None, *, messages: Any = None) -> int:
    """Number of calls: from ``messages`` when given, structured detection is on and they show one; else the text's."""
    detection = detection or _DEFAULT
    if messages is not None and detection.prefer_structured_tool_calls:
        structured = structured_tool_calls(messages)
        if structured:
            return structured
    return len(find_code_calls(text, detection))


def first_code_token(text: str, offsets: Any, detection: CodeDetection | None = None) -> int:
    """Token index of the first call (-1: none); ``offsets``: the tokenizer's ``(start, end)`` span of each token."""
    char = first_code_char(text, detection)
    if char is None:
        return -1
    spans = np.asarray(offsets.tolist() if isinstance(offsets, torch.Tensor) else offsets, dtype=np.int64)
    if spans.size == 0:
        return -1
    if spans.ndim != 2 or spans.shape[1] != 2:
        raise ValueError(f"offsets must be one (start, end) pair per token, got shape {spans.shape}")
    after = np.flatnonzero(spans[:, 1] > char)  # the token holding the character, or the next one after a gap
    return int(after[0]) if after.size else -1


def code_usage(texts: Sequence[str], offsets: Sequence[Any] | None = None, *, detection: CodeDetection | None = None,
               messages: Sequence[Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ASPO's per-sample inputs → ``(first_code_pos, code_calls)`` (B,): the first call's token index (NaN: none
    placed) and the call count; ``offsets`` None: a token per character; ``messages``: each sample's, or None."""
    n = len(texts)
    for name, seq in (("offsets", offsets), ("messages", messages)):
        if seq is not None and len(seq) != n:
            raise ValueError(f"{len(seq)} {name} for {n} texts")
    pos = torch.full((n,), float("nan"), dtype=torch.float32)
    calls = torch.zeros(n, dtype=torch.int64)
    for i, text in enumerate(texts):
        if offsets is None:
            char = first_code_char(text, detection)
            p = -1 if char is None else char
        else:
            p = first_code_token(text, offsets[i], detection)
        if p >= 0:
            pos[i] = p
        calls[i] = count_code_calls(text, detection, messages=None if messages is None else messages[i])
    return pos, calls
