"""The sandbox-backed verl tool, built by verl's own tool loader and called directly (as verl's tool agent
loop calls it), on CPU."""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl,
              pytest.mark.skipif(sys.platform != "linux", reason="the sandbox relies on Linux rlimits/namespaces")]

from verl.tools.schemas import ToolResponse  # noqa: E402
from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402

from rlkit.verl.tools import TOOL_CONFIG, SandboxTool, print_last_expression  # noqa: E402


def _call(tool: SandboxTool, parameters: dict) -> tuple[ToolResponse, float, dict]:
    """create → execute → release, the lifecycle of verl's ToolAgentLoop._call_tool."""

    async def go():
        instance_id, _ = await tool.create(create_kwargs={})
        try:
            return await tool.execute(instance_id, parameters, agent_data=None)
        finally:
            await tool.release(instance_id)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def tool() -> SandboxTool:
    (loaded,) = initialize_tools_from_config(str(TOOL_CONFIG))
    return loaded


def test_verl_loads_the_tool_from_the_packaged_config(tool):
    assert isinstance(tool, SandboxTool) and tool.name == "code_interpreter"
    schema = tool.get_openai_tool_schema().model_dump()
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert tool.limits.wall_seconds == 30 and tool.limits.memory_mb == 1024


def test_execute_returns_output_and_a_success_reward(tool):
    response, reward, metrics = _call(tool, {"code": "import sympy\nx = sympy.Rational(84, 2)\nx"})
    assert response.text == "42\n" and reward == 1.0 and metrics["status"] == "ok"


def test_failing_code_returns_its_traceback_and_zero_reward(tool):
    response, reward, metrics = _call(tool, {"code": "1 / 0"})
    assert "ZeroDivisionError" in response.text and reward == 0.0 and metrics["status"] == "error"


def test_model_cannot_raise_its_own_limits():
    short = SandboxTool({"default_timeout": 1, "cpu_seconds": 1}, None)
    response, reward, metrics = _call(short, {"code": "while True:\n    pass", "timeout": 600})
    assert metrics["status"] == "timeout" and reward == 0.0
    assert response.text == "[stopped: time limit (1 s CPU, 1 s wall)]"


def test_concurrent_calls_run_in_parallel_sandboxes(tool):
    async def go():
        calls = []
        for i in range(4):
            instance_id, _ = await tool.create()
            calls.append(tool.execute(instance_id, {"code": f"print({i} * 10)"}))
        return await asyncio.gather(*calls)

    results = asyncio.run(go())
    assert [r[0].text for r in results] == ["0\n", "10\n", "20\n", "30\n"]


def test_bad_parameters_and_config_are_explained(tool):
    response, reward, metrics = _call(tool, {"cmd": "print(1)"})
    assert "'code' parameter" in response.text and reward == 0.0 and metrics["status"] == "invalid"
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['timeout'\]; valid: type, num_workers"):
        SandboxTool({"timeout": 5})
    with pytest.raises(ValueError, match="Python only"):
        SandboxTool({"default_language": "cpp"})


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("x = 6 * 7\nx", "x = 6 * 7\nprint(_rlkit_value) if (_rlkit_value := (x)) is not None else None"),
        ("x = 1; x  # done", "x = 1; print(_rlkit_value) if (_rlkit_value := (x)) is not None else None  # done"),
        ("print(3)", "print(3)"),  # already printed
        ("x = 1", "x = 1"),  # ends in a statement (the SPO recipe's rewrite made this `print(x = 1)`)
        ("def f(:", "def f(:"),  # does not parse: left for Python to report
        ("", ""),
    ],
)
def test_print_last_expression_rewrites_only_a_final_expression(code, expected):
    assert print_last_expression(code) == expected


def test_print_last_expression_runs_like_a_notebook_cell(tool):
    code = "s = 'é'\n(s +\n 'x')"  # multi-line, non-ASCII: offsets are UTF-8 bytes
    assert _call(tool, {"code": code})[0].text == "éx\n"
    assert _call(tool, {"code": "None"})[0].text == ""  # None is not shown
    assert _call(tool, {"code": "x = [1]\nx.append(2)\nprint(x)"})[0].text == "[1, 2]\n"


# ---------------------------------------------------------------------------------- the word problems' calculator
def _calculator_call(parameters: dict) -> tuple[ToolResponse, float, dict]:
    from rlkit.verl.tools import CALCULATOR_CONFIG

    (calculator,) = initialize_tools_from_config(str(CALCULATOR_CONFIG))
    assert calculator.name == "calculator"
    return _call(calculator, parameters)


@pytest.mark.parametrize("expression, answer, reward", [
    ("48-18", "30", 1.0),
    ("(7+5)*3", "36", 1.0),
    ("1/0", "error", 0.0),
    ("__import__('os')", "error", 0.0),
    (17, "error", 0.0),  # not a string: verl passes the model's arguments as they were parsed
])
def test_calculator_tool_answers_as_the_tiny_engine_does(expression, answer, reward):
    from rlkit.tasks.calculator import run_tool

    response, got_reward, info = _calculator_call({"expression": expression})
    assert response.text.startswith(answer) and got_reward == reward
    assert response.text == run_tool(expression if isinstance(expression, str) else "")
    assert info["status"] == ("ok" if reward else "error")


@pytest.fixture(scope="module")
def hf_tok():
    from rlkit.tiny.hf import hf_tokenizer
    from rlkit.tiny.task import build_tokenizer

    return hf_tokenizer(build_tokenizer())


def _parse(tok, text: str):
    from rlkit.verl.tools import CodeTagParser

    ids = tok.encode(text, add_special_tokens=False)
    return asyncio.run(CodeTagParser(tok).extract_tool_calls(ids))


def test_code_parser_stops_at_end_code_and_reads_the_last_call(hf_tok):
    import json

    from rlkit.verl.tools import CodeTagParser

    parser = CodeTagParser(hf_tok)
    assert parser.stop_token_ids == [hf_tok.convert_tokens_to_ids("</code>")]
    text, (call,) = _parse(hf_tok, "He has 48-18 = <code>48-18</code><output>30</output> left, <code>30*2</code>")
    assert call.name == "calculator" and json.loads(call.arguments) == {"expression": "30*2"}
    assert text.endswith("<code>30*2</code>")


@pytest.mark.parametrize("text", [
    "He has 30 left.\n#### 30<eos>",  # an answer: no call
    "stray </code>",  # a </code> without <code> in the turn ends the response
    "<code>48-18",  # cut by the length limit before </code>
])
def test_code_parser_finds_no_call_without_a_closed_code_tag(hf_tok, text):
    assert _parse(hf_tok, text)[1] == []


def test_code_parser_refuses_a_tokenizer_without_single_token_tags():
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    from rlkit.verl.tools import CodeTagParser

    chars = {c: i for i, c in enumerate("<>/codeutp0123456789")}
    core = Tokenizer(models.BPE(vocab=chars, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    plain = PreTrainedTokenizerFast(tokenizer_object=core)
    with pytest.raises(ValueError, match="<code>, </code>, <output>, </output> as single tokens.*rlkit export"):
        CodeTagParser(plain)


def test_chat_template_renders_the_tool_answer_as_the_tiny_engine_writes_it(hf_tok):
    """verl's agent loop appends a tool message through its Continuous Token builder (the generic one for a
    ``llama`` model): the tokens it appends must be the tiny sampler's forced ``<output>value</output>``, and the
    prompt the tiny engine's ``<bos>`` + question."""
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(hf_tok, hf_model_type="llama")
    before = [{"role": "user", "content": "Q?\n"}, {"role": "assistant", "content": "<code>48-18</code>"}]
    appended = builder.tokenize_context_incremental_messages(before, [*before, {"role": "tool", "content": "30"}])
    assert appended == hf_tok.encode("<output>30</output>", add_special_tokens=False)
    assert hf_tok.decode(appended) == "<output>30</output>"
    prompt = hf_tok.apply_chat_template([{"role": "user", "content": "Q?\n"}], tokenize=False,
                                        add_generation_prompt=True)
    assert prompt == "<bos>Q?\n"
