"""Code/tool-call detection for ASPO: detectors and toggles, structured messages, token positions, batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlkit.tasks.tools import (
    CodeDetection,
    code_usage,
    count_code_calls,
    find_code_calls,
    first_code_char,
    first_code_token,
    structured_tool_calls,
)

ONLY_FENCES = CodeDetection(html_code_tags=False, tool_call_json=False)
ONLY_HTML = CodeDetection(markdown_backticks=False, tool_call_json=False)
ONLY_JSON = CodeDetection(markdown_backticks=False, html_code_tags=False)
NOTHING = CodeDetection(markdown_backticks=False, html_code_tags=False, tool_call_json=False)

TINY = "<code>48-18</code><output>30</output><code>30/2</code><output>15</output> #### 15"


def test_tiny_engine_tool_form_is_two_calls():
    # "<code>48-18</code>" = 6 + 5 + 7 = 18 chars; "<output>30</output>" = 8 + 2 + 9 = 19 → next call at 37,
    # "<code>30/2</code>" = 6 + 4 + 7 = 17 → ends at 54. <output> is the tool's answer, not a call.
    assert find_code_calls(TINY) == [(0, 18), (37, 54)]
    assert find_code_calls(TINY, ONLY_HTML) == [(0, 18), (37, 54)]
    assert count_code_calls(TINY) == 2
    assert find_code_calls(TINY, CodeDetection(html_code_tags=False)) == []


def test_markdown_fences():
    text = "Let me check.\n```python\nprint(2**10)\n```\nSo 1024."
    start = text.index("```")  # 14
    end = text.index("```", start + 3) + 3
    assert find_code_calls(text) == [(start, end)] == find_code_calls(text, ONLY_FENCES)
    assert find_code_calls(text, CodeDetection(markdown_backticks=False)) == []
    # inline code and double backticks are not fenced blocks
    assert find_code_calls("use `x = 1` or ``y``") == []
    # a ```output block is the interpreter's answer (ToRA / Qwen-Math TIR format): one call, not two
    tir = "```python\n1+1\n```\n```output\n2\n```\n```Output\n3\n```"
    assert find_code_calls(tir) == [(0, 17)]
    assert len(find_code_calls(tir, CodeDetection(result_fences=()))) == 3


def test_unclosed_blocks_run_to_the_end_of_the_text():
    text = "Now: ```python\nprint("
    assert find_code_calls(text) == [(5, len(text))]
    html = "ok <code>1+"
    assert find_code_calls(html) == [(3, len(html))]
    cut = 'go {"name": "python", "arguments": {"code": "pri'  # truncated JSON
    assert find_code_calls(cut) == [(3, len(cut))]


def test_html_tags():
    text = 'a <PRE class="py">x = 1</Pre> b <code >y</code> c'
    pre_start, pre_end = text.index("<PRE"), text.index("</Pre>") + len("</Pre>")
    code_start, code_end = text.index("<code"), text.index("</code>") + len("</code>")
    assert find_code_calls(text, ONLY_HTML) == [(pre_start, pre_end), (code_start, code_end)]
    assert find_code_calls("<CODE>z</code>") == [(0, 14)]  # closing tag matched case-insensitively
    for negative in ("<codex>1</codex>", "<code_interpreter>", "<output>84</output>", "a < code b"):
        assert find_code_calls(negative) == [], negative
    assert find_code_calls(text, CodeDetection(html_code_tags=False)) == []


def test_tool_call_json():
    obj = 'Call: {"name": "python", "arguments": {"code": "print(1)"}} done'
    assert find_code_calls(obj, ONLY_JSON) == [(6, 59)]  # the whole object, from "{" to its "}"
    legacy = 'x "function_call": {"name": "f", "arguments": "{}"} y'
    assert find_code_calls(legacy) == [(2, 51)]  # from the key to the end of its value
    openai = '{"tool_calls": [{"id": "1", "function": {"name": "py", "arguments": "{}"}}]} ok'
    # from the key to the end of its list; the nested name/arguments object is part of it
    assert find_code_calls(openai) == [(1, openai.index("]") + 1)]
    hermes = 'Think.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>\nDone'
    start = hermes.index("<tool_call>")
    assert find_code_calls(hermes) == [(start, hermes.index("</tool_call>") + len("</tool_call>"))]
    alt = '{"tool_name": "calc", "parameters": {"expr": "2+2"}}'
    assert find_code_calls(alt) == [(0, len(alt))]
    raw_newline = '{"name": "python", "arguments": {"code": "a = 1\nprint(a)"}} after'
    assert find_code_calls(raw_newline) == [(0, raw_newline.index(" after"))]
    for negative in ('{"name": "Alice", "age": 3}', '"tool_calls" is a key', '{"arguments": 1, "name": "f"}'):
        assert find_code_calls(negative) == [], negative
    for text in (obj, legacy, openai, hermes, alt):
        assert find_code_calls(text, CodeDetection(tool_call_json=False)) == []


def test_nested_calls_are_counted_once_and_calls_come_in_order():
    assert find_code_calls("<pre><code>x</code></pre>") == [(0, 25)]
    fenced_args = '{"name": "python", "arguments": {"code": "```py\\nx\\n```"}}'
    assert find_code_calls(fenced_args) == [(0, len(fenced_args))]
    mixed = 'a ```py\nx\n``` b <code>y</code> c {"name": "f", "arguments": {}} d'
    # "a " → 2; "```py\nx\n```" is 11 chars (ends 13), " b " → 16;
    # "<code>y</code>" is 14 chars (ends 30), " c " → 33
    assert [s for s, _ in find_code_calls(mixed)] == [2, 16, 33]
    assert count_code_calls(mixed) == 3
    assert count_code_calls(mixed, NOTHING) == 0


def test_first_code_char():
    assert first_code_char("no tools here, 2 + 2 = 4") is None
    assert first_code_char("abc <code>1</code>") == 4
    assert first_code_char("abc <code>1</code> ```x```", ONLY_FENCES) == 19
    with pytest.raises(ValueError, match="text must be a str"):
        first_code_char([{"role": "assistant", "content": "x"}])


MESSAGES = [
    {"role": "user", "content": "What is 12*7?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "python", "arguments": '{"code": "12*7"}'}},
        {"id": "b", "type": "function", "function": {"name": "python", "arguments": '{"code": "84+0"}'}},
    ]},
    {"role": "tool", "tool_call_id": "a", "content": "84"},
    {"role": "tool", "tool_call_id": "b", "content": "84"},
    {"role": "assistant", "content": "84"},
]


def test_structured_messages():
    assert structured_tool_calls(MESSAGES) == 2  # 2 tool_calls entries, answered by 2 tool turns
    assert structured_tool_calls({"messages": MESSAGES}) == 2  # verl's agent-loop wrapping
    only_results = [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "1"},
                    {"role": "ipython", "content": "2"}, {"role": "function", "content": "3"}]
    assert structured_tool_calls(only_results) == 3
    legacy = [{"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}]
    assert structured_tool_calls(legacy) == 1
    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "tool_calls": None}]
    assert structured_tool_calls(plain) == 0
    for bad in ("a string", [1, 2], 3):
        with pytest.raises(ValueError, match="messages must be a list|every chat message must be a dict"):
            structured_tool_calls(bad)


def test_count_prefers_structured_messages_when_switched_on():
    text = "<code>12*7</code> so 84"  # the text shows one call, the messages two
    assert count_code_calls(text, messages=MESSAGES) == 2
    assert count_code_calls(text, CodeDetection(prefer_structured_tool_calls=False), messages=MESSAGES) == 1
    # messages without a tool call fall back to the text
    assert count_code_calls(text, messages=[{"role": "assistant", "content": text}]) == 1


def test_first_code_token_with_a_hand_written_offset_mapping():
    text = "I will run <code>1+1</code>"
    # tokens: "I" (0,1) | " will" (1,6) | " run" (6,10) | " " (10,11) | "<code>" (11,17) | "1+1" (17,20)
    #         | "</code>" (20,27)
    offsets = [(0, 1), (1, 6), (6, 10), (10, 11), (11, 17), (17, 20), (20, 27)]
    assert first_code_char(text) == 11
    assert first_code_token(text, offsets) == 4
    # a BOS special token (0, 0) in front shifts every index by one and is never chosen
    assert first_code_token(text, [(0, 0)] + offsets) == 5
    # a tokenizer that drops the space: the call starts in a gap → the first token after it
    assert first_code_token(text, [(0, 1), (2, 6), (7, 10), (11, 17), (17, 20), (20, 27)]) == 3
    # a token that straddles the call's first character (" <co" (10,14)) is the call's token
    assert first_code_token(text, [(0, 6), (6, 10), (10, 14), (14, 27)]) == 2
    # the offsets accept an array/tensor (T, 2) as HF returns them
    assert first_code_token(text, torch.tensor(offsets)) == 4
    assert first_code_token(text, np.array(offsets)) == 4
    assert first_code_token("no call", offsets) == -1
    assert first_code_token(text, offsets[:3]) == -1  # the call lies past the last token (truncated)
    assert first_code_token(text, []) == -1
    with pytest.raises(ValueError, match="one \\(start, end\\) pair per token"):
        first_code_token(text, [1, 2, 3])


def test_code_usage_batch():
    texts = ["plain text 4", TINY, "ab ```py\nx\n```", "<code>1</code>"]
    pos, calls = code_usage(texts)  # no offsets: one token per character (the tiny engine)
    assert pos.dtype == torch.float32 and calls.dtype == torch.int64
    assert math.isnan(pos[0]) and pos[1:].tolist() == [0.0, 3.0, 0.0]
    assert calls.tolist() == [0, 2, 1, 1]
    # with offset mappings: the third text tokenized as "ab" (0,2) " " (2,3) "```py\nx\n```" (3,14)
    offsets = [[(0, 5), (5, 12)], [(i, i + 1) for i in range(len(TINY))], [(0, 2), (2, 3), (3, 14)], [(0, 0)]]
    pos, _ = code_usage(texts, offsets)
    assert math.isnan(pos[0]) and pos[1].item() == 0.0 and pos[2].item() == 2.0
    assert math.isnan(pos[3])  # only a special token: the call cannot be placed → no position
    # structured messages give a count even where the text cannot place the call (position NaN)
    pos, calls = code_usage(["84", "plain"], messages=[MESSAGES, None])
    assert calls.tolist() == [2, 0] and bool(pos.isnan().all())
    text_only = CodeDetection(prefer_structured_tool_calls=False)
    pos, calls = code_usage(["84"], messages=[MESSAGES], detection=text_only)
    assert calls.tolist() == [0]
    with pytest.raises(ValueError, match="1 offsets for 2 texts"):
        code_usage(["a", "b"], [[(0, 1)]])
    with pytest.raises(ValueError, match="3 messages for 2 texts"):
        code_usage(["a", "b"], messages=[None, None, None])
