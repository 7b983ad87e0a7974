"""verl tools of rlkit's runs: the tiny engine's calculator (the word problems) and a sandboxed Python interpreter
(tool-integrated ASPO and SPO on GSM8K and DAPO-Math).

**Calculator** (:class:`CalculatorTool`, :data:`CALCULATOR_CONFIG`, tool parser :data:`CODE_FORMAT`). The tiny
engine's policy writes ``<code>48-18</code>`` and the environment writes ``<output>30</output>`` after it. In
verl's tool agent loop (``default_agent_loop=tool_agent``, ``multi_turn.format=rlkit_code``) the same happens in
turns: :class:`CodeTagParser` stops generation at ``</code>`` (a stop token), reads the expression between the
turn's last ``<code>`` and that ``</code>``, and the tool's answer comes back as a ``tool`` message, which the
model's chat template (:data:`rlkit.tiny.hf.CHAT_TEMPLATE`) renders as ``<output>30</output>``: the tokens the tiny
engine forces, appended by verl with response mask 0 (not the model's, out of the loss). The tool's reward is 1.0
when the calculator answered and 0.0 for ``error: …``: verl keeps it in ``tool_rewards``, ASPO's ``code_pass``.
Where verl differs from the tiny sampler: a ``</code>`` with no ``<code>`` in its turn ends the response (no tool
call, so verl's loop stops; the tiny engine keeps sampling), and the number of calls is capped by
``multi_turn.max_assistant_turns`` rather than ``max_tool_calls``.

**Sandbox** (:class:`SandboxTool`, :data:`TOOL_CONFIG`): a verl ``BaseTool`` backed by rlkit's sandbox.

It replaces verl's ``SandboxFusionTool`` (which needs a SandboxFusion server) with a local process per call,
confined by :mod:`rlkit.tasks.sandbox`. verl builds it from :data:`TOOL_CONFIG` (``sandbox_tool.yaml``)::

    actor_rollout_ref.rollout.multi_turn.enable=true
    actor_rollout_ref.rollout.multi_turn.tool_config_path=<rlkit.verl.tools.TOOL_CONFIG>
    actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent

Calls follow verl's ``BaseTool`` lifecycle: ``create`` → ``execute(instance_id, {"code": ...})`` →
``release``. ``execute`` returns ``(ToolResponse(text=stdout + stderr), step_reward, metrics)``:

- the text is what the model sees; a timeout, an output cut or a kill adds a bracketed note;
- the step reward is 1.0 when the code exited 0 within its limits, else 0.0. verl keeps it per call in
  ``non_tensor_batch["tool_rewards"]`` and does not add it to the reward: it is ASPO's ``code_pass``;
- metrics: ``status`` (:data:`rlkit.tasks.sandbox.STATUSES`) and ``wall_time``.

Config keys (the YAML's ``config:``; SandboxFusionTool's names where they mean the same thing):
``type`` (verl's, ``native``), ``num_workers`` (concurrent runs per tool, 8), ``default_timeout`` (wall
seconds, 30), ``cpu_seconds`` (default: ``default_timeout``), ``memory_limit_mb`` (1024),
``max_processes`` (16), ``max_output_bytes`` (65536), ``default_language`` (only ``python``),
``print_last_expression`` (true: a final bare expression is printed, as in a notebook cell; the SPO recipe
did this by rewriting the last line as ``print(...)``, which breaks on ``x = 1`` — here the parser decides).

Deviation from SandboxFusionTool: ``timeout`` and ``language`` in a call's parameters are ignored, so the
model cannot choose its own limits.
"""

from __future__ import annotations

import ast
import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import uuid4

import json

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

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

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


def default_schema() -> OpenAIFunctionToolSchema:
    """The ``code_interpreter`` schema of :data:`TOOL_CONFIG`."""
    spec = OmegaConf.to_container(OmegaConf.load(TOOL_CONFIG).tools[0].tool_schema, resolve=True)
    return OpenAIFunctionToolSchema.model_validate(spec)


class SandboxTool(BaseTool):
    """verl tool running the ``code`` parameter in :func:`rlkit.tasks.sandbox.run_code` (module doc)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        unknown = sorted(set(config) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"SandboxTool: unknown config key(s) {unknown}; valid: {', '.join(DEFAULTS)}")
        config = {**DEFAULTS, **config}
        if config["default_language"] != "python":
            raise ValueError(f"SandboxTool runs Python only; got default_language={config['default_language']!r}")
        super().__init__(config, tool_schema or default_schema())
        self.limits = Limits(
            cpu_seconds=config["cpu_seconds"] or config["default_timeout"], wall_seconds=config["default_timeout"],
            memory_mb=config["memory_limit_mb"], max_processes=config["max_processes"],
            max_output_bytes=config["max_output_bytes"],
        )
        self._pool = ThreadPoolExecutor(max_workers=int(config["num_workers"]), thread_name_prefix="rlkit-sandbox")
        self._instances: set[str] = set()

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instances.add(instance_id)
        return instance_id, ToolResponse()

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

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instances.discard(instance_id)

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
    """``code`` with its final bare expression printed (unless None), as a notebook cell shows it.

    Only that expression is rewritten, in place, so line numbers in tracebacks stay the model's. Code that
    does not parse, or ends in a statement or a ``print(...)`` call, is returned unchanged.
    """
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
    starts = [0]
    for line in src.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    begin = starts[last.lineno - 1] + last.col_offset
    end = starts[last.end_lineno - 1] + last.end_col_offset
    shown = b"print(_rlkit_value) if (_rlkit_value := (" + src[begin:end] + b")) is not None else None"
    return (src[:begin] + shown + src[end:]).decode()
