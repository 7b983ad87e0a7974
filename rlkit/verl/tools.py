"""verl tools of rlkit's runs: the tiny engine's calculator (the word problems) and a sandboxed Python
interpreter (tool-integrated ASPO and SPO on GSM8K and DAPO-Math).

The calculator plays the tiny engine's ``<code>48-18</code>``, ``<output>30</output>`` as turns of verl's
tool agent loop; unlike the tiny sampler, a ``</code>`` without ``<code>`` ends the response. The sandbox
replaces ``SandboxFusionTool``'s server with a local process per call, ignoring a call's ``timeout`` and
``language``. Either reward, 1.0 on success, is ASPO's ``code_pass`` (verl keeps it out of the reward);
``print_last_expression`` prints a final bare expression, where the SPO recipe rewrote it as ``print(...)``.
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from rlkit.tasks.calculator import run_tool
from rlkit.tasks.protocol import CODE, END_CODE, TOOL_ERROR, TOOL_TAGS
from rlkit.tasks.sandbox import Limits, SandboxResult, run_code

TOOL_CONFIG = Path(__file__).with_name("sandbox_tool.yaml")
"""verl tool config (``multi_turn.tool_config_path``) declaring :class:`SandboxTool` as ``code_interpreter``."""

CALCULATOR_CONFIG = Path(__file__).with_name("calculator_tool.yaml")
"""verl tool config declaring :class:`CalculatorTool` as ``calculator`` (the word problems' tool)."""
CODE_FORMAT = "rlkit_code"
"""``actor_rollout_ref.rollout.multi_turn.format`` of :class:`CodeTagParser`."""
CALCULATOR = "calculator"


class CalculatorTool(BaseTool):
    """verl tool answering ``{"expression": ...}`` with :func:`rlkit.tasks.calculator.run_tool` (module doc)."""

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        expression = parameters.get("expression", "")
        answer = run_tool(expression if isinstance(expression, str) else "")
        ok = not answer.startswith(TOOL_ERROR)
        return ToolResponse(text=answer), float(ok), {"status": "ok" if ok else "error"}


@ToolParser.register(CODE_FORMAT)
class CodeTagParser(ToolParser):
    """Stops a turn at ``</code>`` and turns ``<code>expr</code>`` into a ``calculator`` call (module doc)."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        missing = [tag for tag in TOOL_TAGS if len(tokenizer.encode(tag, add_special_tokens=False)) != 1]
        if missing:
            raise ValueError(f"the calculator protocol needs {', '.join(TOOL_TAGS)} as single tokens; this "
                             f"tokenizer splits {', '.join(missing)} (export the model with `rlkit export`)")
        self.end_code_id = tokenizer.encode(END_CODE, add_special_tokens=False)[0]

    @property
    def stop_token_ids(self) -> list[int]:
        return [self.end_code_id]

    async def extract_tool_calls(self, responses_ids: list[int], tools: list | None = None
                                 ) -> tuple[str, list[FunctionCall]]:
        text = self.tokenizer.decode(responses_ids, skip_special_tokens=False)
        if not responses_ids or responses_ids[-1] != self.end_code_id or CODE not in text:
            return text, []
        expression = text[text.rindex(CODE) + len(CODE): text.rindex(END_CODE)]
        return text, [FunctionCall(name=CALCULATOR, arguments=json.dumps({"expression": expression}))]


DEFAULTS: dict[str, Any] = {
    "type": "native", "num_workers": 8, "default_timeout": 30, "cpu_seconds": None, "memory_limit_mb": 1024,
    "max_processes": 16, "max_output_bytes": 65536, "default_language": "python", "print_last_expression": True,
}


class SandboxTool(BaseTool):
    """verl tool running the ``code`` parameter in :func:`rlkit.tasks.sandbox.run_code` (module doc)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        unknown = sorted(set(config) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"SandboxTool: unknown config key(s) {unknown}; valid: {', '.join(DEFAULTS)}")
        config = {**DEFAULTS, **config}
        if config["default_language"] != "python":
            raise ValueError(f"SandboxTool runs Python only; got default_language={config['default_language']!r}")
        if not tool_schema:  # the code_interpreter schema of TOOL_CONFIG
            spec = OmegaConf.to_container(OmegaConf.load(TOOL_CONFIG).tools[0].tool_schema, resolve=True)
            tool_schema = OpenAIFunctionToolSchema.model_validate(spec)
        super().__init__(config, tool_schema)
        self.limits = Limits(cpu_seconds=config["cpu_seconds"] or config["default_timeout"],
                             wall_seconds=config["default_timeout"], memory_mb=config["memory_limit_mb"],
                             max_processes=config["max_processes"],
                             max_output_bytes=config["max_output_bytes"])
        self._pool = ThreadPoolExecutor(max_workers=int(config["num_workers"]), thread_name_prefix="rlkit-sandbox")

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: the 'code' parameter must be a non-empty string of Python."), 0.0, {
                "status": "invalid"}
        if self.config["print_last_expression"]:
            code = print_last_expression(code)
        result = await asyncio.get_running_loop().run_in_executor(self._pool, run_code, code, self.limits)
        return ToolResponse(text=self.describe(result)), float(result.ok), {
            "status": result.status, "wall_time": result.wall_time}

    def describe(self, result: SandboxResult) -> str:
        """stdout + stderr, with a note when the run was stopped."""
        note = {
            "timeout": f"[stopped: time limit ({self.limits.cpu_seconds} s CPU, {self.limits.wall_seconds} s wall)]",
            "output_limit": f"[stopped: output exceeded {self.limits.max_output_bytes} bytes]",
            "killed": f"[stopped: killed by signal {-(result.returncode or 0)}]",
        }.get(result.status)
        text = result.stdout + result.stderr
        return f"{text}\n{note}" if note and text else note or text


def print_last_expression(code: str) -> str:
    """``code`` with its final bare expression printed in place (unless None), as a notebook cell shows it."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return code
    last = body[-1] if body else None
    if not isinstance(last, ast.Expr):
        return code
    if isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name) and last.value.func.id == "print":
        return code
    src = code.encode()  # ast offsets count UTF-8 bytes
    starts = [0, *itertools.accumulate(len(line) for line in src.splitlines(keepends=True))]
    begin = starts[last.lineno - 1] + last.col_offset
    end = starts[last.end_lineno - 1] + last.end_col_offset
    shown = b"print(_rlkit_value) if (_rlkit_value := (" + src[begin:end] + b")) is not None else None"
    return (src[:begin] + shown + src[end:]).decode()
