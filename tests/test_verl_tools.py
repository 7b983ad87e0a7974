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
