"""Detect code/tool calls in a response: where the first one starts (in tokens) and how many there are.

ASPO (:mod:`rlkit.methods.aspo`) needs, per response, the token position of the first code invocation and
(for its metrics) the number of calls. Four detectors, each switchable in :class:`CodeDetection` (the first
three are the verl ASPO recipe's ``algorithm.aspo.code_detection`` toggles):

- **structured messages** (``prefer_structured_tool_calls``): chat messages (dicts with ``role``/``content``)
  whose assistant turns carry OpenAI-style ``tool_calls`` (or a legacy ``function_call``), or turns with role
  ``tool``/``function``/``ipython``. They give the call *count*; a *position* still comes from the text.
- **markdown fences** (``markdown_backticks``): ```` ```python … ``` ````. A fence labelled as a tool
  *result* (``result_fences``, default ``output`` as in ```` ```output ````, the ToRA/Qwen-Math TIR format)
  is not a call.
- **HTML tags** (``html_code_tags``): ``<code>…</code>`` and ``<pre>…</pre>``, case-insensitive, attributes
  allowed. The tiny engine's tool form ``<code>12*7</code><output>84</output>`` is one call.
- **tool-call JSON** (``tool_call_json``): ``<tool_call>…</tool_call>`` blocks (Qwen/Hermes), the keys
  ``"tool_calls": [`` and ``"function_call": {``, and bare ``{"name": "…", "arguments": …}`` objects
  (``"tool_name"`` and ``"parameters"`` accepted too). A call spans its JSON value, found with a JSON decoder.

Conventions:

- A call is a character span ``(start, end)``. An opened but unclosed fence, tag or JSON value (a response cut
  off at the length limit, or malformed JSON) still counts: the call starts where it opens and runs to the
  end of the text.
- Spans from all detectors are merged: a span that starts inside an earlier one is part of it
  (``<pre><code>``, a fence inside a JSON argument, OpenAI's nested ``"function"`` object), so each call is
  counted once.
- Token positions come from a tokenizer's offset mapping (HF fast tokenizers,
  ``return_offsets_mapping=True``): the first call's token is the first token whose span ends after the
  call's first character. Positions index the whole response, tool-output tokens included, so the lengths
  given to ASPO must be counted the same way.
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
_NAME_ARGS_OBJECT = re.compile(
    r'\{\s*"(?:name|tool_name)"\s*:\s*"[^"]*"\s*,\s*"(?:arguments|parameters)"\s*:'
)
_JSON = json.JSONDecoder(strict=False)  # strict=False: models write raw newlines inside JSON strings

TOOL_ROLES = ("tool", "function", "ipython")


@dataclass(frozen=True)
class CodeDetection:
    """Which detectors run (the verl ASPO recipe's ``algorithm.aspo.code_detection``, plus two fields)."""

    prefer_structured_tool_calls: bool = True
    """When chat messages are given, count calls from their ``tool_calls``/tool turns rather than the text."""
    markdown_backticks: bool = True
    """```` ``` ```` fenced blocks are calls."""
    html_code_tags: bool = True
    """``<code>``/``<pre>`` blocks are calls (the tiny engine's tool form)."""
    tool_call_json: bool = True
    """``<tool_call>`` blocks and tool-call JSON (``"tool_calls"``, ``{"name": …, "arguments": …}``)."""
    result_fences: tuple[str, ...] = ("output",)
    """Fence labels (case-insensitive) that mark a tool's result, not a call."""


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
    """Number of tool calls in chat ``messages``: the calls the assistant made, or the tool turns if more.

    Calls are the entries of ``tool_calls`` plus legacy ``function_call`` fields; tool turns are messages with
    role ``tool``/``function``/``ipython`` (one per executed call; some formats log only these).
    """
    messages = _message_list(messages)
    made = sum(len(m.get("tool_calls") or ()) + (1 if m.get("function_call") else 0) for m in messages)
    answered = sum(m.get("role") in TOOL_ROLES for m in messages)
    return max(made, answered)


def count_code_calls(text: str, detection: CodeDetection | None = None, *, messages: Any = None) -> int:
    """Number of calls: from ``messages`` when given, structured detection is on and they show a call;
    otherwise from the text detectors."""
    detection = detection or _DEFAULT
    if messages is not None and detection.prefer_structured_tool_calls:
        structured = structured_tool_calls(messages)
        if structured:
            return structured
    return len(find_code_calls(text, detection))


def first_code_token(text: str, offsets: Any, detection: CodeDetection | None = None) -> int:
    """Token index of the first call, or -1 when there is none (or it lies past the last token).

    ``offsets`` is the tokenizer's offset mapping for ``text``: one ``(start, end)`` character span per token,
    a list or a ``(T, 2)`` array/tensor. Special tokens with span ``(0, 0)`` are never chosen.
    """
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


def code_usage(
    texts: Sequence[str],
    offsets: Sequence[Any] | None = None,
    *,
    detection: CodeDetection | None = None,
    messages: Sequence[Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ASPO's per-sample inputs for a batch of responses → ``(first_code_pos, code_calls)``, both ``(B,)``.

    ``first_code_pos`` (float32) is the first call's token index, NaN where the text shows no call;
    ``code_calls`` (int64) counts calls (:func:`count_code_calls`). ``offsets`` gives each text's offset
    mapping; None means one token per character (the tiny engine's character tokenizer). ``messages``, if
    given, holds each sample's chat messages (None for a sample without them). A sample whose messages show a
    call the text detectors cannot place gets a count but a NaN position, so ASPO leaves it out.
    """
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
