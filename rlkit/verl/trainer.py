"""The rlkit trainer for verl 0.9.1's v1 loop: ``trainer.use_v1=true trainer.v1.trainer_mode=rlkit``.

verl's estimator and loss carry only a few tensors: :class:`RlkitTrainer`, verl's ``PPOTrainerSync``, calls
the run's method's hooks (:mod:`rlkit.hooks`) where verl's step has the data, naming no method. Deviations
forced by verl: kept responses (:data:`MEMORY`) are not checkpointed; verl's padding rows stay out of the
hooks' batch; the per-token temperature uses the previous step's entropies, and adapts validation at T > 0
too; losses see a micro-batch's entropies, as in the released codes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import open_dict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding, response_from_nested

from rlkit import registry
from rlkit.core.tool_use import tool_metrics
from rlkit.environ import hold_before_step
from rlkit.errors import NoSignalLeft
from rlkit.hooks import Hooks, Recalled, StepBatch, checked
from rlkit.tasks.tools import CodeDetection, count_code_calls, first_code_char
from rlkit.verl import ADV_ESTIMATORS, POLICY_LOSSES, TRAINER
from rlkit.verl.inputs import (
    check_hooks, estimator_inputs, loss_inputs, method_config, rlkit_blocks, rows_of, run_method, verl_estimator,
)
from rlkit.verl.sampling import APPLIED, CONFIG_KEY, applied_metrics, processor_settings, read_applied, save_state

Tensor = torch.Tensor
_log = logging.getLogger("rlkit.verl")

MEMORY = "rlkit_memory"
"""TransferQueue partition holding the responses a method's hooks asked to keep (key: the prompt id)."""
STATE_FILE = "rlkit_method.pt"
SAMPLER_PROCESSOR = "rlkit.verl.sampling:AdaptiveTemperatureProcessor"
"""vLLM's ``logits_processors`` entry for a method's per-token temperature (qualified class name)."""
POLL_S = 0.05
"""The replay buffer's poll for finished rollouts: verl's 2 s, no config key, made every phase last 2 s."""


class RefillBudget:
    """The buffer's ``refill_fn`` within the bound verl ignores (``max_num_gen_batches`` batches)."""

    def __init__(self, refill: Callable[[int], Any], first: int, limit: int, metric: str) -> None:
        self.refill, self.first, self.limit, self.metric = refill, first, limit, metric
        self.step, self.sent = 0, first

    @classmethod
    def of(cls, buffer: Any, config: Any) -> RefillBudget | None:
        """Install the budget on ``buffer`` when dynamic sampling is on with a bound > 0; None otherwise."""
        batches = int((config.algorithm.get("filter_groups", None) or {}).get("max_num_gen_batches", 0) or 0)
        if getattr(buffer, "filter_groups_metric", None) is None or batches <= 0:
            return None
        first = int(config.data.train_batch_size)
        budget = cls(buffer.refill_fn, first, batches * int(config.data.get("gen_batch_size", None) or first),
                     buffer.filter_groups_metric)
        buffer.refill_fn = budget
        _log.warning("rlkit enforces algorithm.filter_groups.max_num_gen_batches=%d: at most %d prompts a step",
                       batches, budget.limit)
        return budget

    def start(self, step: int) -> None:
        """A new step's sampling: its first batch of ``first`` prompts is already sent."""
        self.step, self.sent = step, self.first

    def __call__(self, n: int) -> Any:
        if self.sent + n > self.limit:
            raise NoSignalLeft(
                f"dynamic sampling sent {self.sent} prompts at step {self.step} and has fewer than {self.first} "
                f"groups whose answers differ on {self.metric!r} (the others were all right or all wrong); its "
                f"bound, algorithm.filter_groups.max_num_gen_batches, allows {self.limit}. Train this model "
                "without it (algorithm.filter_groups.enable=false) or on prompts it solves sometimes")
        self.sent += n
        return self.refill(n)


@dataclass
class MethodSetup:
    """The rlkit names a verl config uses, the run's method (:func:`rlkit.verl.inputs.run_method`; None: no
    rlkit name), its ``Config`` from its own section (``options``) and its verl-only keys (``extras``)."""

    adv_estimator: str
    loss_mode: str
    name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Any) -> MethodSetup:
        """The run's method, checked: it reads its own section, with one method's estimator and loss."""
        adv = str(config.algorithm.adv_estimator)
        loss = str(config.actor_rollout_ref.actor.policy_loss.get("loss_mode", "vanilla"))
        by_estimator, by_loss = ADV_ESTIMATORS.get(adv), POLICY_LOSSES.get(loss)
        setup = cls(adv, loss, run_method(adv, loss))
        blocks = [b for b in rlkit_blocks(config.algorithm) if config.algorithm.get(b) is not None]
        foreign = [b for b in blocks if b != setup.name]
        if foreign:
            reads = f"reads algorithm.{setup.name} alone" if setup.name else "has no rlkit estimator or loss to read it"
            raise ValueError(f"algorithm.{foreign[0]} is another method's section: this run (adv_estimator={adv}, "
                             f"loss_mode={loss}) {reads}; set its knobs there")
        if setup.name is None:
            return setup
        options, setup.extras[setup.name] = method_config(config.algorithm, setup.name)
        setup.options[setup.name] = verl_estimator(options, adv)
        m = registry.get_method(setup.name)
        trains = f"rlkit_{m.estimator(setup.options[setup.name])}", f"rlkit_{m.policy_loss}"
        for key, used, wanted, rlkit in (("algorithm.adv_estimator", adv, trains[0], by_estimator),
                                         ("actor_rollout_ref.actor.policy_loss.loss_mode", loss, trains[1], by_loss)):
            if rlkit is not None and used != wanted:
                raise ValueError(f"{key}={used} with {' and '.join(trains)} is no one rlkit method's pair: "
                                 f"{setup.name} trains with {wanted} (a run reads one method's section)")
        setup._check(config)
        return setup

    def hooks(self) -> Any:
        """The run's instance of its method's hooks (the do-nothing defaults without a method)."""
        return registry.make_hooks(self.name, self.options) if self.name is not None else Hooks(None, {})

    def _check(self, config: Any) -> None:
        hooks = self.hooks()
        if not hooks.grouped and int(config.actor_rollout_ref.rollout.n) != 1:
            raise ValueError(f"{self.name} samples one response per prompt: set actor_rollout_ref.rollout.n=1 "
                             f"(got {config.actor_rollout_ref.rollout.n})")
        if hooks.sets_temperature() and str(config.actor_rollout_ref.rollout.name) != "vllm":
            raise ValueError(
                f"{self.name}'s per-token sampling temperature is a vLLM logits processor: set "
                f"actor_rollout_ref.rollout.name=vllm (got {config.actor_rollout_ref.rollout.name}) or switch it off "
                f"in +algorithm.{self.name}.*"
            )
        distillation = config.get("distillation", None)
        if self.loss_mode in POLICY_LOSSES and distillation is not None and distillation.get("enabled", False):
            raise ValueError("the rlkit trainer replaces verl's actor loss, so distillation (distillation.enabled) "
                             "cannot be combined with an rlkit policy loss")
        check_hooks(config, self)

    @property
    def needs_entropy(self) -> bool:
        """The loss reads the actor's entropies (:meth:`rlkit.registry.Method.needs_entropy`)."""
        return self.loss_mode in POLICY_LOSSES and registry.get_method(self.name).needs_entropy(self.options[self.name])

    @property
    def inputs(self) -> tuple[str, ...]:
        """Per-response inputs the estimator reads from the responses (:attr:`rlkit.registry.Method.inputs`)."""
        method = ADV_ESTIMATORS.get(self.adv_estimator)
        return registry.get_method(method).inputs if method is not None else ()

    @property
    def extra(self) -> dict[str, Any]:
        return self.extras.get(self.name, {})


def actor_loss(config: Any, model_output: Mapping[str, Any], data: Any, dp_group: Any = None, *,
               options: Mapping[str, Any], method: str | None = None) -> tuple[Tensor, dict]:
    """verl's ``ppo_loss`` with the entropies, the run's method and its options in reach of rlkit's losses."""
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
    with loss_inputs(entropy=entropy, options=options, method=method):
        return ppo_loss(config, model_output, data, dp_group)


def first_code_token(ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                     detection: CodeDetection | None = None) -> tuple[int, int]:
    """``(index of the token holding the first code call's first character or -1, number of calls)``."""
    text = decode(ids)
    calls = count_code_calls(text, detection)
    char = first_code_char(text, detection)
    if char is None:
        return -1, calls
    lo, hi = 0, len(ids) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[: mid + 1])) > char:
            hi = mid
        else:
            lo = mid + 1
    return lo, calls


def _reward_info(extra_fields: Sequence[Any] | None, key: str, batch: int) -> list[Any]:
    """``extra_fields[i]["reward_extra_info"][key]`` per row (None where absent)."""
    if extra_fields is None:
        return [None] * batch
    infos = [row.get("reward_extra_info", None) if isinstance(row, Mapping) else None for row in extra_fields]
    return [info.get(key, None) if isinstance(info, Mapping) else None for info in infos]


def correctness(rewards: Tensor, extra_fields: Sequence[Any] | None = None) -> Tensor:
    """``(B,)`` bool: the reward function's ``acc`` where it reports one, else reward > 0."""
    acc = _reward_info(extra_fields, "acc", len(rewards))
    return torch.tensor([bool(a > 0) if a is not None else bool(r > 0) for a, r in zip(acc, rewards.tolist())])


def code_pass_flags(extra_fields: Sequence[Any] | None, batch: int) -> Tensor:
    """``(B,)`` bool: ``reward_extra_info["code_pass"]`` where reported, else ≥ 1 tool reward and all > 0."""
    rows = extra_fields if extra_fields is not None else [None] * batch
    flags = []
    for value, row in zip(_reward_info(extra_fields, "code_pass", batch), rows):
        tool_rewards = list(row.get("tool_rewards", None) or []) if isinstance(row, Mapping) else []
        passed = bool(tool_rewards) and all(r > 0 for r in tool_rewards)
        flags.append(bool(value) if value is not None else passed)
    return torch.tensor(flags, dtype=torch.bool)


def prompt_ids_of(extra_info: Sequence[Any]) -> list[str]:
    """The stable prompt id of each row: ``extra_info["prompt_id"]`` (written by ``rlkit data``)."""
    ids = []
    for i, info in enumerate(extra_info):
        pid = info.get("prompt_id", None) if isinstance(info, Mapping) else None
        if pid is None:
            raise ValueError(f"row {i} has no extra_info['prompt_id']: the method keeps state per prompt by it "
                             "(prepare the data with `rlkit data`)")
        ids.append(str(pid))
    return ids


class VerlEngine:
    """What verl offers a method's hooks (:class:`rlkit.hooks.Engine`), TransferQueue's kept responses too."""

    def __init__(self, trainer: RlkitTrainer) -> None:
        self.trainer = trainer
        self.pool_ids: list[str] = []
        self.step_meta: KVBatchMeta | None = None  # the step's TransferQueue meta (what remember copies from)
        self.step_rows: list[int] = []  # the step batch's rows → rows of step_meta (padding rows left out)

    @property
    def seed(self) -> int:
        return int(self.trainer.config.data.get("seed", None) or 0)

    def offline_scores(self, n: int) -> Mapping[Any, list[float]] | None:
        m = registry.get_method(self.trainer.method.name)
        key = m.offline_pass.verl_key if m.offline_pass is not None else None  # its declared file of the pass
        path = self.trainer.method.extra.get(key) if key is not None else None
        if path is None:
            _log.warning(f"{m.name} without +algorithm.{m.name}.{key}: every prompt starts without offline scores")
            return None
        with open(path) as f:
            return json.load(f)

    def remember(self, batch: StepBatch, rows: Mapping[Any, int]) -> None:
        meta = self.step_meta
        keys = [meta.keys[self.step_rows[j]] for j in rows.values()]
        record = tq.kv_batch_get(keys=keys, partition_id=meta.partition_id)
        record["rlkit_log_probs_then"] = record["old_log_probs"]
        stored = list(rows)
        replaced = [k for k in stored if k in tq.kv_list(MEMORY).get(MEMORY, {})]
        if replaced:  # TransferQueue refuses an empty key list
            tq.kv_clear(keys=replaced, partition_id=MEMORY)
        tq.kv_batch_put(keys=stored, partition_id=MEMORY, fields=record,
                        tags=[{k: v for k, v in meta.tags[self.step_rows[j]].items() if k != "status"}
                              for j in rows.values()])

    def recall(self, prompt_ids: list) -> dict[Any, Recalled]:
        stored = tq.kv_list(MEMORY).get(MEMORY, {})
        seen = sorted({pid for pid in prompt_ids if pid in stored})
        if not seen:
            return {}
        t = self.trainer
        # the log-prob pass as verl's own old-log-prob pass runs it (the step's meta no longer carries its settings)
        meta = KVBatchMeta(partition_id=MEMORY, keys=seen, tags=[dict(stored[pid]) for pid in seen],
                           extra_info={**self.step_meta.extra_info, "calculate_entropy": False, "compute_loss": False,
                                       "temperature": t.config.actor_rollout_ref.rollout.temperature})
        meta = upsample_batch_to_divisible_size(meta, t._log_prob_batch_multiple(), t.tokenizer.eos_token_id)
        t.actor_rollout_wg.compute_log_prob(meta)
        now = tq.kv_batch_get(keys=seen, partition_id=MEMORY,
                              select_fields=["log_probs", "rlkit_log_probs_then", "response_mask"])
        mask = _padded(now["response_mask"])
        logp_now = _padded(response_from_nested(now["log_probs"], now["response_mask"]))
        then = _padded(now["rlkit_log_probs_then"])
        padding = [k for k in meta.keys if k not in set(seen)]
        if padding:
            tq.kv_clear(keys=padding, partition_id=MEMORY)
        out = {}
        for row, pid in enumerate(seen):
            n = int(mask[row].sum())
            out[pid] = Recalled(logp_then=then[row, :n], logp_now=logp_now[row, :n], mask=mask[row, :n])
        return out


@register_trainer(TRAINER)
class RlkitTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer that calls the run's method's hooks (module doc)."""

    def __init__(self, config: Any):
        self.method = MethodSetup.from_config(config)
        self.hooks = self.method.hooks()
        self.engine = VerlEngine(self)
        self._step: dict[str, Any] = {}  # what the step's hooks see: its StepBatch, the entropies of its pass
        self._applied = dict.fromkeys(APPLIED, 0.0)
        self.refill_budget: RefillBudget | None = None  # set with the replay buffer
        self.sampler_state_path: str | None = None
        if self.hooks.sets_temperature():
            path = self.method.extra.get("stats_path")
            self.sampler_state_path = os.path.abspath(path if path is not None else os.path.join(
                config.trainer.default_local_dir, f"rlkit_{self.method.name}_sampler.pt"))
            self._applied = read_applied(self.sampler_state_path)  # totals an earlier launch left behind
        with open_dict(config):
            if self.method.needs_entropy or self.sampler_state_path is not None:
                config.actor_rollout_ref.actor.calculate_entropy = True
            if self.sampler_state_path is not None:
                self._add_sampler_processor(config)
        super().__init__(config)

    def _build_replay_buffer(self):
        self.trainer_mode = "sync"  # verl treats every trainer_mode but "sync" as asynchronous
        buffer = super()._build_replay_buffer()
        buffer.poll_interval = POLL_S
        self.refill_budget = RefillBudget.of(buffer, self.config)
        return buffer

    def on_sample_begin(self):
        super().on_sample_begin()
        if self.refill_budget is not None:
            self.refill_budget.start(self.global_steps)

    def _add_sampler_processor(self, config: Any) -> None:
        vllm_kwargs = config.actor_rollout_ref.rollout.engine_kwargs.vllm
        processors = list(vllm_kwargs.get("logits_processors", None) or [])
        if SAMPLER_PROCESSOR not in processors:
            processors.append(SAMPLER_PROCESSOR)
        additional = dict(vllm_kwargs.get("additional_config", None) or {})
        additional[CONFIG_KEY] = processor_settings(self.method.name, self.method.options, self.sampler_state_path)
        vllm_kwargs.logits_processors = processors
        vllm_kwargs.additional_config = additional

    def _setup(self):
        super()._setup()
        if self.method.loss_mode in POLICY_LOSSES:
            actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
            self.actor_rollout_wg.set_loss_fn(partial(actor_loss, config=actor_config, options=self.method.options,
                                                      method=self.method.name))

    def _init_dataloader(self):
        super()._init_dataloader()
        self.start_hooks()

    def on_step_begin(self):
        super().on_step_begin()
        hold_before_step(self.global_steps)  # tests only: RLKIT_TEST_HOLD=<step>:<file> holds the run here

    def start_hooks(self) -> None:
        """The hooks' start, over the training set's prompt ids when they keep state per prompt."""
        if self.hooks.keyed or _overrides(self.hooks, "choose_prompts"):
            pool = prompt_ids_of(self.train_dataset.dataframe["extra_info"])
            self._rows = {pid: i for i, pid in enumerate(pool)}
            if len(self._rows) != len(pool):
                raise ValueError(f"{self.method.name} needs one training row per prompt id "
                                 "(extra_info['prompt_id'] repeats)")
            self.engine.pool_ids = pool
        self.hooks.start(self.engine, resumed=False)

    def _fetch_one_gen_batch(self):
        """The step's prompts: the hooks' (e.g. drawn by weight) if they choose, else verl's dataloader's."""
        n = int(self.config.data.get("gen_batch_size", None) or self.config.data.train_batch_size)
        ids = checked(self.hooks, "choose_prompts", self.hooks.choose_prompts(n, self._step_number()), rows=n)
        if ids is None:
            return super()._fetch_one_gen_batch()
        batch_dict = collate_fn([self.train_dataset[self._rows[pid]] for pid in ids])
        batch_dict["uid"] = np.array([str(uuid.uuid4()) for _ in ids], dtype=object)
        return tu.get_tensordict(batch_dict)

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_old_log_prob(batch, metrics)
        if self.sampler_state_path is not None:  # the entropies the next temperatures are set from
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=["entropy", "response_mask"])
            real = torch.tensor([not tag.get("is_padding", False) for tag in batch.tags], dtype=torch.bool)
            self._step["entropy"] = _padded(data["entropy"])[real]
            self._step["mask"] = _padded(data["response_mask"])[real]
        return batch

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        hooked = _overrides(self.hooks, "advantage_inputs", "after_update", "advantage_metrics")
        if not self.method.inputs and not hooked:
            with estimator_inputs(method=self.method.name):  # the run's method's section, not the estimator's home's
                return super()._compute_advantage(batch, metrics)
        fields = ["response_mask", "rm_scores"] + ["extra_info"] * self.hooks.keyed
        if self.method.inputs:
            fields += ["responses", "extra_fields"]
        data = self._fetch(batch, fields)
        data.non_tensor_batch["is_padding"] = np.array([t.get("is_padding", False) for t in batch.tags])
        self.engine.step_meta = batch
        inputs = self.advantage_inputs(data, metrics)
        if _overrides(self.hooks, "advantage_metrics"):
            padding = data.non_tensor_batch["is_padding"]
            inputs["on_advantage"] = lambda adv, given: metrics.update(self.advantage_metrics(adv, given, padding))
        with estimator_inputs(method=self.method.name, **inputs):
            return super()._compute_advantage(batch, metrics)

    def advantage_metrics(self, adv: Tensor, inputs: Any, padding: np.ndarray) -> dict[str, float]:
        """The hooks' :meth:`~rlkit.hooks.Hooks.advantage_metrics` on the real rows (not ``padding``)."""
        if len(adv) == len(padding) and padding.any():
            keep = torch.as_tensor(~padding)
            adv, inputs = adv[keep.to(adv.device)], rows_of(inputs, keep)
        step = self._step.get("batch")
        if step is None:
            step = StepBatch(step=self._step_number(), prompt_ids=list(range(len(inputs.rewards))),
                             rewards=inputs.rewards, mask=inputs.mask, lengths=inputs.mask.sum(-1))
        return checked(self.hooks, "advantage_metrics", self.hooks.advantage_metrics(adv, inputs, step))

    def advantage_inputs(self, data: DataProto, metrics: dict) -> dict[str, Any]:
        """What the estimator needs beyond verl's call: the per-response inputs and the hooks'."""
        rewards = data.batch["rm_scores"].sum(-1)
        out: dict[str, Any] = {}
        if self.method.inputs:
            out.update(self.response_inputs(data, rewards, metrics))
        if not _overrides(self.hooks, "advantage_inputs", "after_update"):
            return out
        real = ~torch.as_tensor(np.asarray(data.non_tensor_batch.get("is_padding", [False] * len(rewards)),
                                           dtype=bool))
        rows = real.nonzero().squeeze(-1)
        mask = data.batch["response_mask"]
        ids = prompt_ids_of(data.non_tensor_batch["extra_info"]) if self.hooks.keyed else list(range(len(rewards)))
        step = StepBatch(step=self._step_number(), prompt_ids=[ids[i] for i in rows.tolist()], rewards=rewards[real],
                         mask=mask[real], lengths=mask[real].sum(-1))
        self.engine.step_rows = rows.tolist()
        self._step["batch"] = step
        extra = checked(self.hooks, "advantage_inputs", self.hooks.advantage_inputs(step, self.engine))
        for name, value in extra.items():  # padding rows get zeros, left out of the estimator
            full = torch.zeros(len(rewards), dtype=value.dtype)
            full[real] = value.cpu()
            out[name] = full
        if "baselines" in extra:  # e.g. a value tracker's v̂
            metrics["critic/baseline/mean"] = extra["baselines"].double().mean().item()
        if extra:
            out["real_rows"] = real
        return out

    def response_inputs(self, data: DataProto, rewards: Tensor, metrics: dict) -> dict[str, Any]:
        """Each response's correctness, first code token, length and code success, and the tool metrics."""
        detection = self.method.extra.get("code_detection")
        lengths = data.batch["response_lengths"]
        extra_fields = data.non_tensor_batch.get("extra_fields", None)
        positions, calls = [], []
        for ids, n in zip(data.batch["responses"].tolist(), lengths.tolist()):
            pos, count = first_code_token(ids[:n], self._decode, detection)
            positions.append(pos if pos >= 0 else math.nan)
            calls.append(count)
        pos = torch.tensor(positions, dtype=torch.float64)
        correct = correctness(rewards, extra_fields)
        passed = code_pass_flags(extra_fields, len(rewards))
        metrics.update(tool_metrics(pos, correct, torch.tensor(calls), passed))
        return {"correct": correct, "first_code_pos": pos, "lengths": lengths, "code_pass": passed}

    def advantage_step(self, data: DataProto, metrics: dict) -> DataProto:
        """``_compute_advantage`` on an in-memory batch (:meth:`advantage_inputs`, ``compute_advantage``)."""
        algo = self.config.algorithm
        with estimator_inputs(method=self.method.name, **self.advantage_inputs(data, metrics)):
            return compute_advantage(data, adv_estimator=algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                                     num_repeat=self.config.actor_rollout_ref.rollout.n,
                                     norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True), config=algo)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _fetch(self, batch: KVBatchMeta, fields: list[str]) -> DataProto:
        """Fields of ``batch`` from TransferQueue as a right-padded ``DataProto`` (+ ``response_lengths``)."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        non_tensor = {}
        for name in ("extra_info", "extra_fields"):
            if name in data.keys():
                values = data.pop(name).tolist()
                non_tensor[name] = np.empty(len(values), dtype=object)
                non_tensor[name][:] = values
        lengths = data["response_mask"].offsets().diff()
        tensors = data.to_padded_tensor()
        tensors["response_lengths"] = lengths
        return DataProto(batch=tensors, non_tensor_batch=non_tensor)

    def _log_prob_batch_multiple(self) -> int:
        """Rows a log-prob pass comes in multiples of: dp ranks × a fixed micro-batch (verl asserts it)."""
        arr = self.config.actor_rollout_ref
        micro = 1 if arr.actor.use_dynamic_bsz else int(arr.rollout.log_prob_micro_batch_size_per_gpu or 1)
        ranks = self.actor_rollout_wg._dispatch_info.get("actor", None)
        if ranks is None:
            ranks = self.actor_rollout_wg._query_dispatch_info("actor")
        return (max(ranks) + 1) * micro

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._update_actor(batch, metrics)
        metrics.update(self.after_update(metrics))
        return batch

    def after_update(self, metrics: dict | None = None) -> dict[str, float]:
        """The hooks' :meth:`~rlkit.hooks.Hooks.after_update`; the temperature's state, those vLLM applied."""
        step, self._step = self._step.get("batch"), {**self._step, "batch": None}
        out: dict[str, float] = {}
        if self.sampler_state_path is not None:
            entropy, mask = self._step.get("entropy"), self._step.get("mask")
            step = step if step is not None else StepBatch(step=self._step_number(), prompt_ids=[],
                                                           rewards=torch.zeros(0), mask=mask, lengths=mask.sum(-1))
            step.entropy, step.mask = entropy, mask
        if step is not None:
            out.update(checked(self.hooks, "after_update", self.hooks.after_update(step, self.engine)))
        if self.sampler_state_path is not None:
            save_state(self.sampler_state_path, self.hooks.state_dict())
            applied = read_applied(self.sampler_state_path)  # what vLLM sampled at in this step's rollout
            out.update(applied_metrics(self._applied, applied, float(self.config.actor_rollout_ref.rollout.temperature),
                                       prefix=self.method.name))
            self._applied = applied
        self._step = {}
        return out

    def _step_number(self) -> int:
        return int(getattr(self, "global_steps", 0) or 0)

    def _save_checkpoint(self):
        # the hooks' state first: verl writes latest_checkpointed_iteration.txt last, so a checkpoint it names is whole
        state = self.hooks.state_dict()
        if state is not None:
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            os.makedirs(folder, exist_ok=True)
            torch.save(state, os.path.join(folder, STATE_FILE))
        super()._save_checkpoint()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.hooks.state_dict() is None or self.global_steps == 0:
            return
        folder = self.config.trainer.default_local_dir
        if self.config.trainer.resume_mode == "resume_path":
            folder = os.path.dirname(os.path.normpath(self.config.trainer.resume_from_path))
        path = os.path.join(folder, f"global_step_{self.global_steps}", STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"resuming {self.method.name} at step {self.global_steps} needs its state: "
                                    f"{path} is missing")
        self.hooks.load_state_dict(torch.load(path, weights_only=False))


def _overrides(hooks: Any, *names: str) -> bool:
    """Whether ``hooks`` defines any of the hooks ``names`` itself (not :class:`rlkit.hooks.Hooks`'s default)."""
    return any(getattr(type(hooks), n) is not getattr(Hooks, n) for n in names)


def _padded(t: Tensor) -> Tensor:
    return t.to_padded_tensor(0.0) if t.is_nested else t


__all__ = ["MethodSetup", "RlkitTrainer", "actor_loss", "code_pass_flags", "correctness", "first_code_token",
           "prompt_ids_of"]
