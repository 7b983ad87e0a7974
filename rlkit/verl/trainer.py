"""The rlkit trainer for verl 0.9.1's v1 loop: ``trainer.use_v1=true trainer.v1.trainer_mode=rlkit``.

verl's estimator call carries only rewards, mask, index and config, and its loss only four tensors
(:mod:`rlkit.verl.plugin`). :class:`RlkitTrainer` is verl's synchronous trainer (``PPOTrainerSync``) plus what
the methods need beyond that, each at the verl hook where the data exists:

- ASPO (``algorithm.adv_estimator=rlkit_aspo``), in ``_compute_advantage``: every response is decoded with the
  run's tokenizer and searched with :mod:`rlkit.tasks.tools` (``algorithm.aspo.code_detection``) for its first
  code/tool call; the call's token index (binary search over decoded prefixes), the response length in the same
  tokens (tool output included), correctness (``reward_extra_info["acc"]`` when the reward function reports it,
  else reward > 0) and, with ``require_code_pass``, ``code_pass`` (``reward_extra_info["code_pass"]``, else every
  tool reward verl's ToolAgentLoop recorded in ``extra_fields["tool_rewards"]`` is > 0 and there is one) go to
  ``rlkit_aspo`` through :func:`rlkit.verl.plugin.estimator_inputs`. Metrics: :func:`rlkit.methods.aspo.aspo_metrics`.
- AEPO and HAPO (``policy_loss.loss_mode=rlkit_aepo|rlkit_hapo``): the trainer switches on
  ``actor.calculate_entropy`` and gives the actor workers :func:`actor_loss` (verl's ``set_loss_fn``), which
  runs verl's own ``ppo_loss`` with the forward pass's entropies and the method options in
  :func:`rlkit.verl.plugin.loss_inputs`. Every rlkit loss gets its ``+algorithm.<method>.*`` options this way.
- HAPO's adaptive temperature (``+algorithm.hapo.adaptive_temperature=true``, the default): after each
  old-log-prob pass the trainer writes :func:`rlkit.methods.hapo.entropy_stats` of that pass's entropies to
  ``algorithm.hapo.stats_path`` (default ``<trainer.default_local_dir>/hapo_entropy_stats.json``), and before the
  rollout servers start it adds :class:`rlkit.verl.sampling.AdaptiveTemperatureProcessor` and its settings to
  ``actor_rollout_ref.rollout.engine_kwargs.vllm`` (``logits_processors``, ``additional_config.rlkit_hapo``).
  vLLM only. The temperatures the processor applied in the step's rollout are logged as
  ``hapo/sampler/temperature_mean``/``_std`` (:func:`rlkit.verl.sampling.applied_metrics`).
- SPO (``algorithm.adv_estimator=rlkit_spo``, ``rollout.n=1``): a :class:`~rlkit.methods.spo.ValueTracker` and a
  :class:`~rlkit.methods.spo.PromptSampler` over the whole training set, keyed by each row's
  ``extra_info["prompt_id"]``, initialised from ``+algorithm.spo.offline_values`` (``offline_values.json``:
  prompt id → scores). Each step's prompts are drawn by the sampler (verl's dataloader order is not used); the
  tracker's pre-update v̂ reach ``rlkit_spo`` as ``reward_baselines``; after the actor update the tracker folds in
  the rewards with ρ from D, the mean |Δ log π| between each prompt's last response's log-probs when it was
  sampled and the current policy's, which the trainer gets with one extra ``compute_log_prob`` pass over those
  stored responses (kept in the TransferQueue partition ``rlkit_spo_memory``). Tracker and sampler are saved
  in each checkpoint folder (``rlkit_spo.pt``).

Deviations forced by verl's extension points (for the methods' book pages):

- verl picks the trainer class by ``trainer.v1.trainer_mode`` and also treats every mode other than ``sync`` as
  asynchronous; the rlkit trainer sets its own mode back to ``sync`` so verl runs it synchronously.
- SPO: the sampler draws from the whole training set (the verl recipe draws from each 14,000-prompt dataloader
  batch); D is measured before the update between the stored sampling-time log-probs and the current policy
  (the recipe: after the update, between the post-update log-probs stored at the last visit and now). The stored
  responses live in TransferQueue, which is not checkpointed: after a resume D is 0 until a prompt is drawn
  again. Rows verl adds to fill a mini-batch (``is_padding``, a copy of the first row's metadata) take no part in
  SPO's batch normalisation or the tracker.
- HAPO: the sampler's statistics are the previous step's old-log-prob entropies at the rollout temperature (the
  released code's as well); verl gives a logits processor no way to tell validation requests apart, so sampled
  validation at T > 0 is adapted too.
- Losses see the entropies of verl's micro-batch, so AEPO's and HAPO's entropy statistics are per micro-batch
  (as in the released codes, whose actors ran per micro-batch too).
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
from rlkit.methods import aspo, hapo, spo
from rlkit.tasks.tools import CodeDetection, count_code_calls, first_code_char
from rlkit.verl import ADV_ESTIMATORS, POLICY_LOSSES, TRAINER
from rlkit.verl.inputs import estimator_inputs, loss_inputs, method_config
from rlkit.verl.sampling import APPLIED, CONFIG_KEY, applied_metrics, read_applied, save_stats

Tensor = torch.Tensor
_log = logging.getLogger("rlkit.verl")

SPO_MEMORY = "rlkit_spo_memory"
"""TransferQueue partition holding each SPO prompt's last response (key: the prompt id)."""
ADVANTAGE_FIELDS = {"rlkit_aspo": ["responses", "response_mask", "rm_scores", "extra_fields"],
                    "rlkit_spo": ["response_mask", "rm_scores", "extra_info"]}
"""TransferQueue fields the advantage step reads, per estimator (beyond what verl's own step reads)."""
SAMPLER_PROCESSOR = "rlkit.verl.sampling:AdaptiveTemperatureProcessor"
"""vLLM's ``logits_processors`` entry for HAPO's adaptive temperature (qualified class name)."""


# --------------------------------------------------------------------------- the method a config asks for


@dataclass
class MethodSetup:
    """Which rlkit names a verl config uses, and their ``+algorithm.<method>.*`` options."""

    adv_estimator: str
    loss_mode: str
    options: dict[str, Any] = field(default_factory=dict)
    """rlkit method → its ``Config`` for every rlkit name in use."""
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)
    """rlkit method → its verl-only keys (``stats_path``, ``offline_values``)."""

    @classmethod
    def from_config(cls, config: Any) -> MethodSetup:
        """Read and check the methods of a full verl config (``algorithm``, ``actor_rollout_ref``, ...)."""
        adv = str(config.algorithm.adv_estimator)
        loss = str(config.actor_rollout_ref.actor.policy_loss.get("loss_mode", "vanilla"))
        setup = cls(adv, loss)
        methods = [m for name, m in {**ADV_ESTIMATORS, **POLICY_LOSSES}.items() if name in (adv, loss)]
        if adv == "rlkit_aspo":  # the base estimator's options are read too
            methods.append(ADV_ESTIMATORS[f"rlkit_{method_config(config.algorithm, 'aspo')[0].base_advantage}"])
        for method in dict.fromkeys(methods):
            setup.options[method], setup.extras[method] = method_config(config.algorithm, method)
        setup._check(config)
        return setup

    def _check(self, config: Any) -> None:
        if self.adv_estimator == "rlkit_spo" and int(config.actor_rollout_ref.rollout.n) != 1:
            raise ValueError(f"SPO samples one response per prompt: set actor_rollout_ref.rollout.n=1 "
                             f"(got {config.actor_rollout_ref.rollout.n})")
        if self.adaptive_temperature and str(config.actor_rollout_ref.rollout.name) != "vllm":
            raise ValueError(
                "HAPO's adaptive temperature is a vLLM logits processor: set actor_rollout_ref.rollout.name=vllm "
                f"(got {config.actor_rollout_ref.rollout.name}) or +algorithm.hapo.adaptive_temperature=false"
            )
        distillation = config.get("distillation", None)
        if self.loss_mode in POLICY_LOSSES and distillation is not None and distillation.get("enabled", False):
            raise ValueError("the rlkit trainer replaces verl's actor loss, so distillation (distillation.enabled) "
                             "cannot be combined with an rlkit policy loss")

    @property
    def needs_entropy(self) -> bool:
        """The loss reads the actor's entropies (:meth:`rlkit.registry.Method.needs_entropy`: AEPO's reshaping,
        HAPO's redistribution and clip)."""
        method = POLICY_LOSSES.get(self.loss_mode)
        return method is not None and registry.get_method(method).needs_entropy(self.options[method])

    @property
    def adaptive_temperature(self) -> bool:
        """HAPO is the run's method (its loss or estimator, not ASPO's base) and its sampler switch is on."""
        hapo_run = self.loss_mode == "rlkit_hapo" or self.adv_estimator == "rlkit_hapo_tlga"
        return hapo_run and self.options["hapo"].adaptive_temperature


# --------------------------------------------------------------------------- the actor loss


def actor_loss(config: Any, model_output: Mapping[str, Any], data: Any, dp_group: Any = None, *,
               options: Mapping[str, Any]) -> tuple[Tensor, dict]:
    """verl's ``ppo_loss`` with the forward pass's entropies and rlkit's method options in reach of the rlkit losses.

    Set on the actor workers with ``set_loss_fn(partial(actor_loss, config=actor_config, options=...))``.
    """
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
    with loss_inputs(entropy=entropy, options=options):
        return ppo_loss(config, model_output, data, dp_group)


# --------------------------------------------------------------------------- ASPO's per-response inputs


def first_code_token(ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                     detection: CodeDetection | None = None) -> tuple[int, int]:
    """``(index of the token holding the first code call's first character or -1, number of calls)``.

    ``decode`` maps token ids to text (the run's tokenizer, special tokens kept). The index is found by a binary
    search for the shortest prefix whose text reaches the call (O(log T) decodes).
    """
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
    out = []
    for row in extra_fields:
        info = row.get("reward_extra_info", None) if isinstance(row, Mapping) else None
        out.append(info.get(key, None) if isinstance(info, Mapping) else None)
    return out


def correctness(rewards: Tensor, extra_fields: Sequence[Any] | None = None) -> Tensor:
    """``(B,)`` bool: the reward function's ``acc`` where it reports one, else reward > 0."""
    acc = _reward_info(extra_fields, "acc", len(rewards))
    return torch.tensor([bool(a > 0) if a is not None else bool(r > 0) for a, r in zip(acc, rewards.tolist())])


def code_pass_flags(extra_fields: Sequence[Any] | None, batch: int) -> Tensor:
    """``(B,)`` bool: ``reward_extra_info["code_pass"]`` where reported, else ≥ 1 tool reward and all > 0."""
    reported = _reward_info(extra_fields, "code_pass", batch)
    flags = []
    for i, value in enumerate(reported):
        if value is not None:
            flags.append(bool(value))
            continue
        row = extra_fields[i] if extra_fields is not None else None
        tool_rewards = list(row.get("tool_rewards", None) or []) if isinstance(row, Mapping) else []
        flags.append(bool(tool_rewards) and all(r > 0 for r in tool_rewards))
    return torch.tensor(flags, dtype=torch.bool)


def prompt_ids_of(extra_info: Sequence[Any]) -> list[str]:
    """SPO's stable prompt id of each row: ``extra_info["prompt_id"]`` (written by ``rlkit data``)."""
    ids = []
    for i, info in enumerate(extra_info):
        pid = info.get("prompt_id", None) if isinstance(info, Mapping) else None
        if pid is None:
            raise ValueError(f"row {i} has no extra_info['prompt_id']: SPO keys its tracker and offline values by it "
                             "(prepare the data with `rlkit data`)")
        ids.append(str(pid))
    return ids


# --------------------------------------------------------------------------- the trainer


@register_trainer(TRAINER)
class RlkitTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer with rlkit's method hooks (module doc)."""

    def __init__(self, config: Any):
        self.method = MethodSetup.from_config(config)
        self.spo_tracker: spo.ValueTracker | None = None
        self.spo_sampler: spo.PromptSampler | None = None
        self._pending: tuple | None = None  # (batch, data) of the step, for SPO's update after the actor step
        self._hapo_applied = dict.fromkeys(APPLIED, 0.0)
        if self.method.adaptive_temperature:
            path = self.method.extras["hapo"]["stats_path"]
            self.hapo_stats_path = os.path.abspath(
                path if path is not None else os.path.join(config.trainer.default_local_dir, "hapo_entropy_stats.json"))
            self._hapo_applied = read_applied(self.hapo_stats_path)  # totals an earlier launch left behind
        with open_dict(config):
            if self.method.needs_entropy:
                config.actor_rollout_ref.actor.calculate_entropy = True
            if self.method.adaptive_temperature:
                self._add_sampler_processor(config)
        super().__init__(config)

    def _build_replay_buffer(self):
        self.trainer_mode = "sync"  # verl treats every trainer_mode but "sync" as asynchronous (module doc)
        return super()._build_replay_buffer()

    # ----------------------------------------------------------------------- setup

    def _add_sampler_processor(self, config: Any) -> None:
        vllm_kwargs = config.actor_rollout_ref.rollout.engine_kwargs.vllm
        processors = list(vllm_kwargs.get("logits_processors", None) or [])
        if SAMPLER_PROCESSOR not in processors:
            processors.append(SAMPLER_PROCESSOR)
        additional = dict(vllm_kwargs.get("additional_config", None) or {})
        additional[CONFIG_KEY] = {"stats_path": self.hapo_stats_path,  # and temperature_tau, release_compat
                                  **registry.kwargs_for(hapo.adaptive_temperature, self.method.options["hapo"])}
        vllm_kwargs.logits_processors = processors
        vllm_kwargs.additional_config = additional

    def _setup(self):
        super()._setup()
        if self.method.loss_mode in POLICY_LOSSES:
            actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
            self.actor_rollout_wg.set_loss_fn(partial(actor_loss, config=actor_config, options=self.method.options))

    def _init_dataloader(self):
        super()._init_dataloader()
        if self.method.adv_estimator == "rlkit_spo":
            self._init_spo()

    # ----------------------------------------------------------------------- HAPO: sampler statistics

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_old_log_prob(batch, metrics)
        if self.method.adaptive_temperature:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=["entropy", "response_mask"])
            entropy, mask = _padded(data["entropy"]), _padded(data["response_mask"])
            real = _real_rows(batch)
            metrics.update(self.write_sampler_stats(entropy[real], mask[real]))
            applied = read_applied(self.hapo_stats_path)  # what vLLM sampled at in this step's rollout
            metrics.update(applied_metrics(self._hapo_applied, applied,
                                           float(self.config.actor_rollout_ref.rollout.temperature)))
            self._hapo_applied = applied
        return batch

    def write_sampler_stats(self, entropy: Tensor, mask: Tensor) -> dict[str, float]:
        """HAPO Eq. 5's statistics of this step's entropies → ``stats_path`` (atomic), for the next rollout."""
        stats = hapo.entropy_stats(entropy, mask,
                                   **registry.kwargs_for(hapo.entropy_stats, self.method.options["hapo"]))
        values = save_stats(self.hapo_stats_path, stats)
        return {f"hapo/sampler_stats/{name}": value for name, value in values.items()}

    # ----------------------------------------------------------------------- advantages

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if self.method.adv_estimator not in ("rlkit_aspo", "rlkit_spo"):
            return super()._compute_advantage(batch, metrics)
        data = self._fetch(batch, ADVANTAGE_FIELDS[self.method.adv_estimator])
        data.non_tensor_batch["is_padding"] = np.array([t.get("is_padding", False) for t in batch.tags])
        if self.method.adv_estimator == "rlkit_spo":
            data.batch["rlkit_spo_divergence"] = self._spo_divergence(batch, data)
        inputs = self.advantage_inputs(data, metrics)
        self._pending = (batch, data)
        with estimator_inputs(**inputs):
            return super()._compute_advantage(batch, metrics)

    def advantage_inputs(self, data: DataProto, metrics: dict) -> dict[str, Any]:
        """What ``rlkit_aspo`` / ``rlkit_spo`` need beyond verl's call, from a batch of responses (``DataProto``).

        ``data.batch``: ``rm_scores`` ``(B, T)``; ASPO: ``responses`` ``(B, T)`` right-padded token ids and
        ``response_lengths`` ``(B,)`` (tool output included); ``data.non_tensor_batch``: ``extra_fields`` (ASPO,
        optional), ``extra_info`` (SPO) and ``is_padding`` (optional). Returns fields of
        :class:`rlkit.registry.AdvantageInputs` (and SPO's ``real_rows``), for :func:`estimator_inputs`.
        """
        rewards = data.batch["rm_scores"].sum(-1)
        extra_fields = data.non_tensor_batch.get("extra_fields", None)
        if self.method.adv_estimator == "rlkit_aspo":
            detection = self.method.extras["aspo"]["code_detection"]
            lengths = data.batch["response_lengths"]
            positions, calls = [], []
            for ids, n in zip(data.batch["responses"].tolist(), lengths.tolist()):
                pos, count = first_code_token(ids[:n], self._decode, detection)
                positions.append(pos if pos >= 0 else math.nan)
                calls.append(count)
            pos = torch.tensor(positions, dtype=torch.float64)
            correct = correctness(rewards, extra_fields)
            passed = code_pass_flags(extra_fields, len(rewards))
            metrics.update(aspo.aspo_metrics(pos, correct, torch.tensor(calls), passed))
            return {"correct": correct, "first_code_pos": pos, "lengths": lengths, "code_pass": passed}
        # SPO
        ids = prompt_ids_of(data.non_tensor_batch["extra_info"])
        real = ~torch.as_tensor(np.asarray(data.non_tensor_batch.get("is_padding", [False] * len(ids)), dtype=bool))
        baselines = torch.zeros(len(ids), dtype=torch.float64)
        if not self.method.options["spo"].no_baseline:
            kept = [pid for pid, keep in zip(ids, real.tolist()) if keep]
            baselines[real] = self.spo_tracker.baseline(kept)
        metrics["spo/baseline/mean"] = baselines[real].mean().item()
        return {"baselines": baselines.to(rewards.dtype), "real_rows": real}

    def advantage_step(self, data: DataProto, metrics: dict) -> DataProto:
        """The advantage step on an in-memory batch: :meth:`advantage_inputs`, then verl's ``compute_advantage``.

        ``data`` also needs verl's ``token_level_rewards`` and ``uid``; the TransferQueue path
        (``_compute_advantage``) runs the same two steps through verl's ``PPOTrainer._compute_advantage``.
        """
        algo = self.config.algorithm
        with estimator_inputs(**self.advantage_inputs(data, metrics)):
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

    # ----------------------------------------------------------------------- SPO

    def _init_spo(self) -> None:
        opts, extras = self.method.options["spo"], self.method.extras["spo"]
        pool = prompt_ids_of(self.train_dataset.dataframe["extra_info"])
        self._spo_rows = {pid: i for i, pid in enumerate(pool)}
        if len(self._spo_rows) != len(pool):
            raise ValueError("SPO needs one training row per prompt id (extra_info['prompt_id'] repeats)")
        offline = None
        if extras["offline_values"] is not None:
            with open(extras["offline_values"]) as f:
                offline = json.load(f)
        elif opts.offline_N:
            _log.warning("SPO without +algorithm.spo.offline_values: every prompt starts at α = β = ½")
        self.spo_tracker = spo.ValueTracker(pool, offline_scores=offline, **registry.kwargs_for(spo.ValueTracker, opts))
        self.spo_sampler = spo.PromptSampler(pool, seed=int(self.config.data.get("seed", None) or 0))

    def _fetch_one_gen_batch(self):
        """SPO draws the step's prompts by the tracker's weights instead of verl's dataloader order."""
        if self.spo_sampler is None:
            return super()._fetch_one_gen_batch()
        knobs = registry.kwargs_for(spo.ValueTracker.weights, self.method.options["spo"])
        n = self.config.data.get("gen_batch_size", None) or self.config.data.train_batch_size
        ids = self.spo_sampler.sample(self.spo_tracker.weights(**knobs), int(n))
        batch_dict = collate_fn([self.train_dataset[self._spo_rows[pid]] for pid in ids])
        batch_dict["uid"] = np.array([str(uuid.uuid4()) for _ in ids], dtype=object)
        return tu.get_tensordict(batch_dict)

    def _spo_divergence(self, batch: KVBatchMeta, data: DataProto) -> Tensor:
        """D per row: mean |log π_then − log π_now| on the prompt's stored last response (0 when none)."""
        ids = prompt_ids_of(data.non_tensor_batch["extra_info"])
        divergence = torch.zeros(len(ids), dtype=torch.float64)
        if self.method.options["spo"].rho_type != "kl":
            return divergence
        stored = tq.kv_list(SPO_MEMORY).get(SPO_MEMORY, {})
        seen = sorted({pid for pid in ids if pid in stored})
        if not seen:
            return divergence
        # the log-prob pass as verl's own old-log-prob pass runs it (the step's meta no longer carries its settings)
        meta = KVBatchMeta(partition_id=SPO_MEMORY, keys=seen, tags=[dict(stored[pid]) for pid in seen],
                           extra_info={**batch.extra_info, "calculate_entropy": False, "compute_loss": False,
                                       "temperature": self.config.actor_rollout_ref.rollout.temperature})
        meta = upsample_batch_to_divisible_size(meta, self._log_prob_batch_multiple(), self.tokenizer.eos_token_id)
        self.actor_rollout_wg.compute_log_prob(meta)
        now = tq.kv_batch_get(keys=seen, partition_id=SPO_MEMORY,
                              select_fields=["log_probs", "rlkit_log_probs_then", "response_mask"])
        mask = now["response_mask"]
        logp_now = _padded(response_from_nested(now["log_probs"], mask))
        d = spo.spo_divergence(_padded(now["rlkit_log_probs_then"]), logp_now, _padded(mask))
        padding = [k for k in meta.keys if k not in set(seen)]
        if padding:
            tq.kv_clear(keys=padding, partition_id=SPO_MEMORY)
        by_id = dict(zip(seen, d.tolist()))
        return torch.tensor([by_id.get(pid, 0.0) for pid in ids], dtype=torch.float64)

    def _log_prob_batch_multiple(self) -> int:
        """Rows a log-prob pass must come in multiples of: the data-parallel ranks, times each rank's micro-batch
        when micro-batches have a fixed size (``actor.use_dynamic_bsz=false``; verl's engine asserts it)."""
        arr = self.config.actor_rollout_ref
        micro = 1 if arr.actor.use_dynamic_bsz else int(arr.rollout.log_prob_micro_batch_size_per_gpu or 1)
        return self._actor_dp_size() * micro

    def _actor_dp_size(self) -> int:
        info = self.actor_rollout_wg._dispatch_info.get("actor", None)
        if info is None:
            info = self.actor_rollout_wg._query_dispatch_info("actor")
        return max(info) + 1

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._update_actor(batch, metrics)
        if self.method.adv_estimator == "rlkit_spo":
            kv_batch, data = self._pending
            metrics.update(self.update_spo(data))
            self._remember_spo(kv_batch, data)
        self._pending = None
        return batch

    def update_spo(self, data: DataProto) -> dict[str, float]:
        """Fold the step's rewards into the tracker (after the actor update); padding rows are left out."""
        real = ~np.asarray(data.non_tensor_batch.get("is_padding", [False] * len(data)), dtype=bool)
        ids = [pid for pid, keep in zip(prompt_ids_of(data.non_tensor_batch["extra_info"]), real) if keep]
        rewards = data.batch["rm_scores"].sum(-1)[torch.as_tensor(real)].double()
        divergence = data.batch["rlkit_spo_divergence"][torch.as_tensor(real)]
        return self.spo_tracker.update(ids, rewards, divergence)

    def _remember_spo(self, batch: KVBatchMeta, data: DataProto) -> None:
        """Store each prompt's newest response and its sampling-time log-probs for the next D."""
        if self.method.options["spo"].rho_type != "kl":
            return
        latest = {}  # prompt id → row (a prompt drawn twice keeps its last response)
        ids = prompt_ids_of(data.non_tensor_batch["extra_info"])
        for row, (pid, tag) in enumerate(zip(ids, batch.tags)):
            if not tag.get("is_padding", False):
                latest[pid] = row
        keys = [batch.keys[row] for row in latest.values()]
        record = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id)
        record["rlkit_log_probs_then"] = record["old_log_probs"]
        stored = list(latest)
        replaced = [k for k in stored if k in tq.kv_list(SPO_MEMORY).get(SPO_MEMORY, {})]
        if replaced:  # TransferQueue refuses an empty key list
            tq.kv_clear(keys=replaced, partition_id=SPO_MEMORY)
        tq.kv_batch_put(keys=stored, partition_id=SPO_MEMORY, fields=record,
                        tags=[{k: v for k, v in batch.tags[row].items() if k != "status"} for row in latest.values()])

    # ----------------------------------------------------------------------- checkpoints (SPO's state)

    def _save_checkpoint(self):
        # SPO's state first: verl writes latest_checkpointed_iteration.txt last, so a checkpoint it names is whole
        if self.spo_tracker is not None:
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            os.makedirs(folder, exist_ok=True)
            torch.save({"tracker": self.spo_tracker.state_dict(), "sampler": self.spo_sampler.state_dict()},
                       os.path.join(folder, "rlkit_spo.pt"))
        super()._save_checkpoint()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.spo_tracker is None or self.global_steps == 0:
            return
        folder = self.config.trainer.default_local_dir
        if self.config.trainer.resume_mode == "resume_path":
            folder = os.path.dirname(os.path.normpath(self.config.trainer.resume_from_path))
        path = os.path.join(folder, f"global_step_{self.global_steps}", "rlkit_spo.pt")
        if not os.path.exists(path):
            raise FileNotFoundError(f"resuming SPO at step {self.global_steps} needs its tracker: {path} is missing")
        state = torch.load(path, weights_only=True)
        self.spo_tracker.load_state_dict(state["tracker"])
        self.spo_sampler.load_state_dict(state["sampler"])


# --------------------------------------------------------------------------- helpers


def _padded(t: Tensor) -> Tensor:
    return t.to_padded_tensor(0.0) if t.is_nested else t


def _real_rows(batch: KVBatchMeta) -> Tensor:
    return torch.tensor([not tag.get("is_padding", False) for tag in batch.tags], dtype=torch.bool)


__all__ = ["MethodSetup", "RlkitTrainer", "actor_loss", "code_pass_flags", "correctness", "first_code_token",
           "prompt_ids_of"]
