"""The rlkit trainer (``trainer.v1.trainer_mode=rlkit``) on CPU: built from verl's own composed config, its
advantage step on real ``DataProto`` batches through verl's ``compute_advantage``, its actor loss through verl's
``ppo_loss``, SPO's tracker and sampler, and HAPO's sampler statistics.

Nothing here starts Ray, TransferQueue or a GPU worker: the trainer is constructed (verl's ``__init__`` needs
none of them) and its pure steps are called. Each expected value is computed with rlkit's method functions.
"""

from __future__ import annotations

import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import make_batch
from rlkit.methods import aepo, aspo, dr_grpo, grpo, hapo, spo
from rlkit.core.ops import group_advantage
from rlkit.tasks.tools import CodeDetection, first_code_char
from rlkit.tasks.tools import first_code_token as first_code_token_by_offsets

pytestmark = [pytest.mark.verl, pytest.mark.filterwarnings("ignore:Disabled critic:UserWarning")]
verl = pytest.importorskip("verl")
from hydra import compose, initialize_config_dir  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from rlkit.verl import sampling  # noqa: E402
from rlkit.hooks import Recalled  # noqa: E402
from rlkit.verl.trainer import (  # noqa: E402
    MEMORY, POLL_S, SAMPLER_PROCESSOR, STATE_FILE, MethodSetup, RlkitTrainer, actor_loss, code_pass_flags, correctness,
    first_code_token,
)

VERL_CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
BASE = ["trainer.v1.trainer_mode=rlkit", "actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=4"]


def verl_config(*overrides):
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=[*BASE, *overrides])


def trainer_for(*overrides):
    return RlkitTrainer(verl_config(*overrides))


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE tokenizer trained here on a few lines (multi-character tokens, exact decoding)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Let me compute the answer step by step.", "print(1+1) and print(6*7)", "The answer is 42.",
              "```python\nx = 3\n```", '{"name": "python", "arguments": {"code": "print(2)"}}'] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<eos>", "<tool_call>", "</tool_call>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tool_call(code):
    return '<tool_call>\n{"name": "python", "arguments": {"code": "' + code + '"}}\n</tool_call>'


# --------------------------------------------------------------------------- configuration


def test_method_setup_reads_verls_composed_config():
    cfg = verl_config("algorithm.adv_estimator=rlkit_aspo", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_ppo",
                      "+algorithm.aspo.delta=-2.5", "+algorithm.aspo.base_advantage=hapo_tlga",
                      "+algorithm.aspo.eps=1e-4")
    setup = MethodSetup.from_config(cfg)
    assert setup.options["aspo"].delta == -2.5 and setup.options["aspo"].eps == 1e-4  # its base's knobs: its own
    assert list(setup.options) == ["aspo"] and list(setup.extras) == ["aspo"]  # the run's own section alone
    assert setup.name == "aspo" and not setup.needs_entropy and not setup.hooks().sets_temperature()


@pytest.mark.parametrize("overrides, message", [
    # another method's section: GRPO's in a GSPO run (its group advantage's knobs are +algorithm.gspo.*)
    (["algorithm.adv_estimator=rlkit_grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_gspo",
      "+algorithm.grpo.eps=1e-3"], "algorithm.grpo is another method's section: .* reads algorithm.gspo alone"),
    # ASPO's base estimator reads ASPO's section, not HAPO's
    (["algorithm.adv_estimator=rlkit_aspo", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_ppo",
      "+algorithm.aspo.base_advantage=hapo_tlga", "+algorithm.hapo.fallback_threshold=4.0"],
     "algorithm.hapo is another method's section"),
    # no rlkit name reads it
    (["algorithm.adv_estimator=grpo", "+algorithm.grpo.eps=1e-3"], "has no rlkit estimator or loss to read it"),
    # an estimator and a loss of no one method: the run would read two sections
    (["algorithm.adv_estimator=rlkit_dr_grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_gspo"],
     "loss_mode=rlkit_gspo with rlkit_dr_grpo and rlkit_ppo is no one rlkit method's pair: dr_grpo trains with "
     "rlkit_ppo"),
])
def test_a_verl_run_reads_its_own_methods_section_alone(overrides, message):
    """As a tiny run reads its own ``Config`` (tests/test_settings_once.py), a verl run reads its method's section
    and refuses another's."""
    with pytest.raises(ValueError, match=message):
        MethodSetup.from_config(verl_config(*overrides))


def test_a_method_with_a_choice_of_estimator_takes_it_from_verls_key():
    """HAPO with component B off is ``algorithm.adv_estimator=rlkit_grpo`` beside ``rlkit_hapo``: a HAPO run whose
    Config says so (its hooks see B off), not a GRPO run."""
    setup = MethodSetup.from_config(verl_config("algorithm.adv_estimator=rlkit_grpo",
                                                "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_hapo"))
    assert setup.name == "hapo" and setup.options["hapo"].adv_estimator == "grpo"


def test_the_trainer_runs_the_methods_own_check_of_verls_settings_at_start_up(monkeypatch):
    """A config that bypassed ``rlkit launch`` (main_ppo called directly) meets the method's own check of the
    engine's settings (:meth:`rlkit.hooks.Hooks.check`) in the trainer itself, with verl's temperature and response
    budget. (Of the methods with a verl twin none can fail it on verl's keys — HAPO's temperature is verl's own —
    so the check is made to refuse and to record what it was given.)"""
    from rlkit.methods.hapo import HapoHooks

    seen = []

    def refuse(self, settings):
        seen.append((settings.temperature, settings.max_new_tokens))
        raise ValueError("refused by the method")

    monkeypatch.setattr(HapoHooks, "check", refuse)
    cfg = verl_config("algorithm.adv_estimator=rlkit_hapo_tlga", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_hapo",
                      "data.max_response_length=32", "actor_rollout_ref.rollout.temperature=0.9")
    with pytest.raises(ValueError, match="hapo: refused by the method"):
        MethodSetup.from_config(cfg)
    assert seen == [(0.9, 32)]


def test_trainer_is_verl_sync_and_switches_on_what_the_loss_needs():
    t = trainer_for("algorithm.adv_estimator=rlkit_grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_aepo")
    assert t.trainer_mode == "sync" and t.config.actor_rollout_ref.actor.calculate_entropy
    t = trainer_for("algorithm.adv_estimator=rlkit_grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_aepo",
                    "+algorithm.aepo.use_entropy_advantage=false")
    assert not t.config.actor_rollout_ref.actor.calculate_entropy


def test_the_replay_buffer_looks_for_finished_rollouts_without_verls_2_s_wait():
    """verl's replay buffer polls TransferQueue every 2 s: every generation phase took a multiple of 2 s."""
    buffer = trainer_for("algorithm.adv_estimator=rlkit_grpo")._build_replay_buffer()
    assert buffer.poll_interval == POLL_S <= 0.1


class PromptQueue:
    """What verl's sync replay buffer reads of TransferQueue (``kv_list``, ``kv_batch_get``, ``kv_clear``) for
    groups of two answers that finish as they are sent; ``acc(n)`` is the n-th group's two correctness values."""

    def __init__(self, acc):
        self.acc, self.items, self.sent = acc, {}, 0

    def send(self, n):  # the trainer's refill_fn: n more prompts
        for _ in range(n):
            uid = f"g{self.sent}"
            self.items[uid] = {"is_prompt": True, "global_steps": 1, "status": "finished"}
            for j, acc in enumerate(self.acc(self.sent)):
                self.items[f"{uid}_{j}"] = {"acc": acc}
            self.sent += 1
        return n

    def kv_list(self):
        return {"train": {key: {k: v for k, v in tag.items() if k != "acc"} for key, tag in self.items.items()}}

    def kv_batch_get(self, keys, partition_id, select_fields):
        assert select_fields == ["extra_fields"]
        return {"extra_fields": [{"reward_extra_info": {"acc": self.items[k]["acc"]}} for k in keys]}

    def kv_clear(self, partition_id, keys):
        for key in keys:
            self.items.pop(key, None)


DYNAMIC = ("algorithm.adv_estimator=rlkit_grpo", "algorithm.filter_groups.enable=true",
           "algorithm.filter_groups.metric=acc", "data.train_batch_size=4")


def sample_one_step(monkeypatch, acc, *overrides):
    """The trainer's replay buffer for step 1, with its first batch of 4 prompts sent as verl sends it."""
    import verl.trainer.ppo.v1.replay_buffer as replay_buffer

    queue = PromptQueue(acc)
    monkeypatch.setattr(replay_buffer, "tq", queue)
    t = trainer_for(*DYNAMIC, *overrides)
    monkeypatch.setattr(t, "_add_prompts_to_generate", queue.send)
    buffer = t._build_replay_buffer()
    queue.send(4)
    t.global_steps = 1
    t.on_sample_begin()
    return t, queue, buffer


def test_dynamic_sampling_ends_the_run_at_its_bound_when_no_group_has_signal(monkeypatch):
    """verl 0.9.1's V1 buffer ignores ``max_num_gen_batches`` and refilled forever on a model that answers nothing
    right (SmolLM2 on GSM8K under HAPO's preset); the rlkit trainer stops at the bound: 3 batches of 4 prompts."""
    from rlkit.errors import NoSignalLeft

    t, queue, buffer = sample_one_step(monkeypatch, lambda n: [0.0, 0.0],
                                       "algorithm.filter_groups.max_num_gen_batches=3")
    with pytest.raises(NoSignalLeft, match=r"sent 12 prompts at step 1 and has fewer than 4 groups whose answers "
                                           r"differ on 'acc'.*allows 12.*algorithm.filter_groups.enable=false"):
        buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    assert queue.sent == 12 and t.refill_budget.limit == 12


def test_dynamic_sampling_within_its_bound_returns_the_groups_with_signal(monkeypatch):
    _, queue, buffer = sample_one_step(monkeypatch, lambda n: [1.0, 0.0] if n >= 4 else [0.0, 0.0],
                                       "algorithm.filter_groups.max_num_gen_batches=3")
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    assert sorted({key.split("_")[0] for key in batch.keys}) == ["g4", "g5", "g6", "g7"]
    assert metrics["training/filter_groups/evicted_samples"] == 4 and queue.sent == 8


def test_dynamic_sampling_without_a_bound_is_verls_endless_refill(monkeypatch):
    """0, verl's default: unbounded, as verl and the DAPO recipe mean it. verl's buffer then refills past any
    count (here stopped by the queue at 40 prompts)."""
    t, queue, buffer = sample_one_step(monkeypatch, lambda n: [0.0, 0.0])
    assert t.refill_budget is None and buffer.refill_fn == queue.send
    send = queue.send

    def until_40(n):
        if queue.sent >= 40:
            raise RuntimeError("40 prompts sent")
        return send(n)

    buffer.refill_fn = until_40
    with pytest.raises(RuntimeError, match="40 prompts sent"):
        buffer.sample(global_steps=1, partition_id="train", batch_size=4)


def test_each_step_begins_by_asking_for_a_tests_hold(monkeypatch):
    """``RLKIT_TEST_HOLD`` (test support: :func:`rlkit.environ.hold_before_step`, tested in test_verl_runner.py)
    is asked at the start of every step of verl's loop, with the step about to run."""
    from rlkit.verl import trainer

    asked = []
    monkeypatch.setattr(trainer, "hold_before_step", asked.append)
    t = trainer_for("algorithm.adv_estimator=rlkit_grpo")
    t.global_steps = 4
    t.on_step_begin()
    assert asked == [4]


def test_hapo_trainer_hands_vllm_the_adaptive_temperature_processor(tmp_path):
    t = trainer_for("algorithm.adv_estimator=rlkit_hapo_tlga", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_hapo",
                    "+algorithm.hapo.temperature_tau=0.1", f"+algorithm.hapo.stats_path={tmp_path}/s.json")
    rollout = t.config.actor_rollout_ref.rollout
    assert t.config.actor_rollout_ref.actor.calculate_entropy
    assert list(rollout.engine_kwargs.vllm.logits_processors) == [SAMPLER_PROCESSOR]
    settings = rollout.engine_kwargs.vllm.additional_config[sampling.CONFIG_KEY]
    assert settings["state_path"] == f"{tmp_path}/s.json" and settings["method"] == "hapo"
    assert settings["options"]["hapo"]["temperature_tau"] == 0.1
    assert omega_conf_to_dataclass(rollout).engine_kwargs["vllm"]["logits_processors"] == [SAMPLER_PROCESSOR]
    # the class path resolves to the processor
    module, name = SAMPLER_PROCESSOR.split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is sampling.AdaptiveTemperatureProcessor


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.adv_estimator=rlkit_spo"], "rollout.n=1"),
    (["algorithm.adv_estimator=rlkit_hapo_tlga", "actor_rollout_ref.rollout.name=sglang"], "rollout.name=vllm"),
    (["algorithm.adv_estimator=rlkit_grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_gspo",
      "+algorithm.gspo.clip_low=3e-4"], "actor_rollout_ref.actor.clip_ratio_low"),
    (["algorithm.adv_estimator=rlkit_grpo", "+algorithm.grpo.epsilon=1e-6"], "unknown key algorithm.grpo.epsilon"),
    (["algorithm.adv_estimator=rlkit_aspo", "+algorithm.aspo.base_advantage=dapo"], "algorithm.aspo.base_advantage 'dapo'"),
])
def test_bad_configs_fail_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        trainer_for(*overrides)


# --------------------------------------------------------------------------- ASPO's inputs


def test_first_code_token_is_the_token_holding_the_calls_first_character(tokenizer):
    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    texts = ["Let me compute.\n" + tool_call("print(1+1)") + "\nThe answer is 2.",
             "The answer is 42.", "step by step ```python\nx = 3\n``` so 3", "x" + tool_call("print(6*7)")]
    for text in texts:
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        ids = enc["input_ids"]
        pos, calls = first_code_token(ids, decode, CodeDetection())
        char = first_code_char(text)
        brute = next((m for m in range(len(ids)) if len(decode(ids[: m + 1])) > char), -1) if char is not None else -1
        assert pos == brute == first_code_token_by_offsets(text, enc["offset_mapping"])
        assert calls == (0 if char is None else 1)
    pos, _ = first_code_token(tokenizer(texts[2])["input_ids"], decode, CodeDetection(markdown_backticks=False))
    assert pos == -1


def test_correctness_and_code_pass_read_verls_extra_fields():
    rewards = torch.tensor([1.0, 0.0, 1.0, -1.0])
    extra = [{"reward_extra_info": {"acc": 0.0}}, {"reward_extra_info": {}}, {}, {"tool_rewards": [1.0]}]
    assert correctness(rewards, extra).tolist() == [False, False, True, False]
    extra = [{"reward_extra_info": {"code_pass": True}, "tool_rewards": [0.0]}, {"tool_rewards": [1.0, 1.0]},
             {"tool_rewards": [1.0, 0.0]}, {"tool_rewards": []}, {}]
    assert code_pass_flags(extra, 5).tolist() == [True, True, False, False, False]


def response_batch(tokenizer, texts, rewards, uids, extra_fields):
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids)) + 3
    responses = torch.full((len(ids), width), tokenizer.pad_token_id)
    for i, row in enumerate(ids):
        responses[i, : len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(r) for r in ids])
    mask = (torch.arange(width) < lengths[:, None]).float()
    scores = torch.zeros(len(ids), width)
    scores[torch.arange(len(ids)), lengths - 1] = torch.tensor(rewards)
    data = DataProto.from_dict(
        tensors={"responses": responses, "response_lengths": lengths, "response_mask": mask, "rm_scores": scores,
                 "token_level_rewards": scores},
        non_tensors={"uid": np.array(uids, dtype=object), "extra_fields": np.array(extra_fields, dtype=object)})
    return data, ids, lengths, mask


def test_aspo_advantage_step_through_verls_compute_advantage(tokenizer):
    t = trainer_for("algorithm.adv_estimator=rlkit_aspo", "+algorithm.aspo.delta=-2.5", "+algorithm.aspo.k=0.9",
                    "+algorithm.aspo.require_code_pass=true")
    t.tokenizer = tokenizer
    texts = ["Let me compute.\n" + tool_call("print(1+1)") + " The answer is 2.",               # correct, early code
             "Let me compute the answer step by step. " + tool_call("print(1+1)") + " 2.",    # correct, later code
             "The answer is 42.",                                                               # correct, no code
             "step by step " + tool_call("print(6*7)") + " The answer is 41.",                  # wrong, code
             "Let me compute the answer step by step step by step. " + tool_call("print(2)") + " 2.",  # code failed
             "The answer is 42."]
    rewards = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    uids = ["a", "a", "a", "a", "a", "b"]
    extra = [{"tool_rewards": [1.0]}, {"tool_rewards": [1.0]}, {}, {"tool_rewards": [1.0]}, {"tool_rewards": [0.0]}, {}]
    data, ids, lengths, mask = response_batch(tokenizer, texts, rewards, uids, extra)
    metrics = {}
    out = t.advantage_step(data, metrics).batch["advantages"]

    def decode(x):
        return tokenizer.decode(x, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    pos = torch.tensor([float(first_code_token(r, decode)[0]) for r in ids])
    pos = torch.where(pos < 0, torch.tensor(math.nan), pos)
    r = torch.tensor(rewards)
    base = grpo.grpo_advantage(r, uids, mask)
    passed = torch.tensor([True, True, False, True, False, False])
    expected = aspo.aspo_shape(base, uids, r > 0, pos, lengths, delta=-2.5, k=0.9, code_pass=passed, mask=mask)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert not torch.equal(out, base)  # the two passing, correct code responses are shaped...
    assert out[0, 0] > base[0, 0] > 0 and 0 < out[1, 0] < base[1, 0]  # ...earlier code up, later code down
    torch.testing.assert_close(out[2:], base[2:], rtol=0, atol=0)
    assert metrics["tool/code_ratio"] == pytest.approx(4 / 6)
    assert metrics["tool/code_pass_ratio"] == pytest.approx(3 / 4)


# --------------------------------------------------------------------------- SPO


class PromptRows:
    """The part of verl's RLHFDataset the trainer uses: rows by index and the ``extra_info`` column."""

    def __init__(self, prompt_ids):
        self.rows = [{"dummy_tensor": torch.tensor([0], dtype=torch.uint8), "extra_info": {"prompt_id": p, "index": i},
                      "raw_prompt": [{"role": "user", "content": f"question {p}"}]} for i, p in enumerate(prompt_ids)]
        self.dataframe = {"extra_info": [r["extra_info"] for r in self.rows]}

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def spo_trainer(tmp_path, offline, *overrides):
    path = tmp_path / "offline_values.json"
    path.write_text(json.dumps(offline))
    t = trainer_for("algorithm.adv_estimator=rlkit_spo", "actor_rollout_ref.rollout.n=1", "data.train_batch_size=6",
                    f"+algorithm.spo.offline_values={path}", "+algorithm.spo.offline_N=4", *overrides)
    t.train_dataset = PromptRows([f"p{i}" for i in range(8)])
    t.start_hooks()
    return t


def test_spo_tracker_sampler_and_advantage(tmp_path):
    offline = {"p0": [1, 1, 1, 0], "p1": [0, 0, 0, 0], "p2": [1, 0, 1, 0, 1], "p5": [1, 1, 1, 1], "nowhere": [1]}
    t = spo_trainer(tmp_path, offline)
    pool = [f"p{i}" for i in range(8)]
    reference = spo.ValueTracker(pool, offline_scores=offline, offline_N=4)
    torch.testing.assert_close(t.hooks.tracker.baseline(), reference.baseline(), rtol=0, atol=0)

    # the step's prompts come from the weighted sampler
    batch = t._fetch_one_gen_batch()
    drawn = [row["prompt_id"] for row in batch["extra_info"]]
    expected = spo.PromptSampler(pool, seed=0).sample(reference.weights(), 6)
    assert drawn == expected and len(set(batch["uid"])) == 6

    # advantage: r − v̂ normalised over the real rows; the padding row verl added gets 0
    ids = drawn + [drawn[0]]
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    mask = torch.ones(7, 5)
    mask[2, 3:] = 0
    scores = torch.zeros(7, 5)
    scores[:, 2] = rewards
    # D of each prompt's kept response (the engine's recall, here without TransferQueue): 0 for one never seen
    d_of = dict(zip(drawn, [0.0, 0.01, 0.2, 0.0, 0.05, 0.03]))
    t.engine.recall = lambda pids: {p: Recalled(torch.zeros(1), torch.tensor([d_of[p]]), torch.ones(1))
                                    for p in pids if d_of[p] > 0}
    t.engine.remember = lambda batch, rows: None
    divergence = torch.tensor([d_of[p] for p in ids], dtype=torch.float32).double()
    data = DataProto.from_dict(
        tensors={"rm_scores": scores, "token_level_rewards": scores, "response_mask": mask},
        non_tensors={"uid": np.array([str(i) for i in range(7)], dtype=object),
                     "extra_info": np.array([{"prompt_id": p} for p in ids], dtype=object),
                     "is_padding": np.array([False] * 6 + [True])})
    metrics = {}
    out = t.advantage_step(data, metrics).batch["advantages"]
    real = torch.arange(7) < 6
    expected_adv = spo.spo_advantage(rewards[real], reference.baseline(ids[:6]).float(), mask=mask[real])
    torch.testing.assert_close(out[real], expected_adv)
    assert out[6].abs().sum() == 0

    # after the actor step the tracker folds in the real rows, ρ from D
    t.after_update()
    reference.update(ids[:6], rewards[real].double(), divergence[real])
    torch.testing.assert_close(t.hooks.tracker.alpha, reference.alpha, rtol=0, atol=0)
    torch.testing.assert_close(t.hooks.tracker.beta, reference.beta, rtol=0, atol=0)


def test_spo_needs_a_prompt_id_per_row(tmp_path):
    t = trainer_for("algorithm.adv_estimator=rlkit_spo", "actor_rollout_ref.rollout.n=1")
    t.train_dataset = PromptRows(["p0"])
    t.train_dataset.dataframe = {"extra_info": [{"index": 0}]}
    with pytest.raises(ValueError, match=r"extra_info\['prompt_id'\].*rlkit data"):
        t.start_hooks()


# --------------------------------------------------------------------------- the actor loss through verl's ppo_loss


def engine_batch(b, entropy, prompt_len=3):
    """What verl's engine hands the loss: unpadded model outputs over prompt+response, padded batch fields."""
    B, T = b["mask"].shape
    lengths = b["lengths"].tolist()
    flat_logp, flat_h = [], []
    for i, n in enumerate(lengths):
        pad = torch.zeros(prompt_len - 1, dtype=torch.float64)
        flat_logp += [pad, b["logp"][i, :n], torch.zeros(1, dtype=torch.float64)]  # log-probs are left-shifted
        flat_h += [pad, entropy[i, :n], torch.zeros(1, dtype=torch.float64)]
    data = TensorDict({
        "prompts": torch.nested.as_nested_tensor([torch.ones(prompt_len, dtype=torch.long)] * B, layout=torch.jagged),
        "responses": torch.nested.as_nested_tensor([torch.ones(n, dtype=torch.long) for n in lengths],
                                                   layout=torch.jagged),
        "response_mask": b["mask"], "old_log_probs": b["old_logp"], "advantages": b["adv"],
    }, batch_size=[B])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(b["mask"].sum()), global_batch_size=B)
    return torch.cat(flat_logp), torch.cat(flat_h), data


@pytest.mark.parametrize("loss_mode", ["rlkit_hapo", "rlkit_aepo"])
def test_actor_loss_runs_verls_ppo_loss_with_the_forward_passs_entropies(loss_mode):
    opts = {"hapo": hapo.Config(adv_beta=0.8, clip_alpha=0.5), "aepo": aepo.Config(coef=0.3)}
    for seed in range(6):
        b = make_batch(seed, noise=0.5)
        h = torch.rand(b["mask"].shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.05
        flat_logp, flat_h, data = engine_batch(b, h)
        cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                          clip_ratio_high=0.28, clip_ratio_c=10.0, policy_loss=PolicyLossConfig(loss_mode=loss_mode))
        logp = flat_logp.clone().requires_grad_()
        loss, metrics = actor_loss(cfg, {"log_probs": logp, "entropy": flat_h}, data, options=opts)
        grad = torch.autograd.grad(loss, logp)[0]
        if loss_mode == "rlkit_hapo":
            fn = lambda lp: hapo.hapo_loss(lp, b["old_logp"], b["adv"], b["mask"], entropy=h, clip_c=10.0,  # noqa: E731
                                           adv_beta=0.8, clip_alpha=0.5)
        else:
            fn = lambda lp: aepo.aepo_loss(lp, b["old_logp"], b["adv"], b["mask"], entropy=h, coef=0.3,  # noqa: E731
                                           clip_c=10.0)
        ref_logp = b["logp"].clone().requires_grad_()
        ref, _ = fn(ref_logp)
        ref_grad = torch.autograd.grad(ref, ref_logp)[0]
        torch.testing.assert_close(loss, ref)  # entropy_coeff 0 and no KL: the loss is the policy loss
        flat_grad = torch.cat([g[: n] for g, n in zip(ref_grad, b["lengths"].tolist())])
        kept = torch.cat([torch.arange(n) + 3 * (i + 1) - 1 + int(b["lengths"][:i].sum())
                          for i, n in enumerate(b["lengths"].tolist())])
        torch.testing.assert_close(grad[kept], flat_grad)
        outside = torch.ones_like(grad, dtype=torch.bool)
        outside[kept] = False
        assert grad[outside].abs().max() == 0  # no gradient outside the responses
        assert metrics["actor/pg_loss"].aggregate() == pytest.approx(ref.item())
        # verl's plain ppo_loss gives the loss no entropies
        with pytest.raises(ValueError, match="entropies"):
            ppo_loss(cfg, {"log_probs": flat_logp, "entropy": flat_h}, data)


# --------------------------------------------------------------------------- HAPO's sampler statistics


def test_the_hooks_temperature_state_reaches_the_vllm_processor(tmp_path):
    path = str(tmp_path / "hapo_state.pt")
    t = trainer_for("algorithm.adv_estimator=rlkit_hapo_tlga", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_hapo",
                    f"+algorithm.hapo.stats_path={path}", "+algorithm.hapo.entropy_pivot=0.7")
    t.global_steps = 1
    b = make_batch(4, B=6, T=7)
    h = torch.rand(6, 7, generator=torch.Generator().manual_seed(1)) * 4
    t._step = {"entropy": h, "mask": b["mask"]}  # what the old-log-prob pass left
    metrics = t.after_update()
    assert metrics == {"hapo/sampler/adapted_tokens": 0.0}  # no rollout has been adapted yet
    expected = hapo.entropy_stats(h, b["mask"], entropy_pivot=0.7)
    settings = t.config.actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config
    processor = sampling.AdaptiveTemperatureProcessor(SimpleNamespace(additional_config=settings), "cpu", False)
    logits = torch.randn(5, 50)
    scale = hapo.adaptive_temperature(logits, 1.0, expected, temperature_tau=0.05)
    torch.testing.assert_close(processor.apply(logits.clone()), logits / scale.unsqueeze(-1))


# --------------------------------------------------------------------------- the TransferQueue path, with a stand-in


class FakeTransferQueue:
    """TransferQueue's KV interface (``kv_batch_put/get``, ``kv_list``, ``kv_clear``) over a dict, returning what
    verl's trainer relies on: per-sample tensors as jagged nested tensors, other values as a ``NonTensorStack``."""

    def __init__(self):
        self.records, self.tags = {}, {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        part, part_tags = self.records.setdefault(partition_id, {}), self.tags.setdefault(partition_id, {})
        for i, key in enumerate(keys):
            record = part.setdefault(key, {})
            for name in (fields.keys() if fields is not None else ()):
                value = fields.get(name)
                record[name] = value[i] if isinstance(value, torch.Tensor) else value.tolist()[i]
            if tags is not None:
                part_tags[key] = dict(tags[i])
        return KVBatchMeta(keys=list(keys), tags=[part_tags.get(k, {}) for k in keys], partition_id=partition_id)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        if not keys:
            raise ValueError("Received an empty list as keys.")
        rows = [self.records[partition_id][k] for k in keys]
        names = [n for n in (select_fields or rows[0]) if all(n in r for r in rows)]  # absent fields are left out
        out = {}
        for n in names:
            values = [r[n] for r in rows]
            if isinstance(values[0], torch.Tensor) and values[0].dim() > 0:
                out[n] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            elif isinstance(values[0], torch.Tensor):
                out[n] = torch.stack(values)
            else:
                out[n] = NonTensorStack(*values)
        return TensorDict(out, batch_size=[len(keys)])

    def kv_list(self, partition_id=None):
        return {partition_id: dict(self.tags.get(partition_id, {}))}

    def kv_clear(self, keys, partition_id):
        if not keys:  # as TransferQueue's client does (found by the first real SPO run through main_ppo)
            raise ValueError("Received an empty list as keys.")
        for key in keys:
            self.records[partition_id].pop(key)
            self.tags[partition_id].pop(key, None)


class FakeActor:
    """The actor worker group's ``compute_log_prob``/``update_actor``: log π(token) = −0.01·id − shift, and each
    update moves every log-prob by −0.1, so the stored responses' D after one update is exactly 0.1."""

    _dispatch_info = {"actor": [0]}

    def __init__(self, store, micro_batch: int = 1):
        self.store, self.shift, self.micro_batch = store, 0.0, micro_batch

    def log_probs(self, ids):
        return -0.01 * ids.double() - self.shift

    def compute_log_prob(self, meta):  # like verl's engine: position j holds the log-prob of token j + 1
        # verl's engine with fixed micro-batches (use_dynamic_bsz=false) asserts this (found by a real SPO run)
        assert len(meta.keys) % self.micro_batch == 0, "data size must be divisible by micro_batch_size_per_gpu"
        assert "temperature" in meta.extra_info, "KeyError: 'temperature'"  # the engine reads it (a real SPO run)
        part = self.store.records[meta.partition_id]
        for key in meta.keys:
            logp = self.log_probs(torch.cat([part[key]["prompts"], part[key]["responses"]]))
            part[key]["log_probs"] = torch.cat([logp[1:], logp.new_zeros(1)])
        return meta

    def update_actor(self, meta):
        self.shift += 0.1
        return {"metrics": {"mfu": [0.0]}}


@pytest.fixture
def fake_tq(monkeypatch):
    import rlkit.verl.trainer as rlkit_trainer
    import verl.trainer.ppo.padding_utils as padding_utils
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    store = FakeTransferQueue()
    for module in (rlkit_trainer, trainer_base, padding_utils):
        monkeypatch.setattr(module, "tq", store)
    return store


def put_step(store, actor, prompt_ids, rewards, responses, **fields):
    """What the agent loop and the old-log-prob pass leave in TransferQueue for one step."""
    keys, tags = [], []
    for i, (pid, r, resp) in enumerate(zip(prompt_ids, rewards, responses)):
        prompt = torch.tensor([5, 6, 7])
        scores = torch.zeros(len(resp))
        scores[-1] = r
        record = {"uid": f"u{len(store.records.get('train', {}))}-{i}", "prompts": prompt, "responses": resp,
                  "response_mask": torch.ones(len(resp), dtype=torch.long), "rm_scores": scores,
                  "old_log_probs": actor.log_probs(resp), "extra_info": {"prompt_id": pid},
                  **{name: values[i] for name, values in fields.items()}}
        keys.append(f"{record['uid']}_0_0")
        store.records.setdefault("train", {})[keys[-1]] = record
        tags.append({"status": "success", "seq_len": len(prompt) + len(resp)})
    return KVBatchMeta(keys=keys, tags=tags, partition_id="train")  # the advantage step's meta carries no settings


def test_spo_steps_through_verls_transferqueue_path(tmp_path, fake_tq, tokenizer):
    t = spo_trainer(tmp_path, {"p0": [1, 0], "p2": [1, 1, 1, 0]}, "+algorithm.spo.d_half=1.0",
                    "actor_rollout_ref.actor.use_dynamic_bsz=false",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4")
    t.tokenizer, actor = tokenizer, FakeActor(fake_tq, micro_batch=4)
    t.actor_rollout_wg = actor
    reference = spo.ValueTracker([f"p{i}" for i in range(8)], offline_scores={"p0": [1, 0], "p2": [1, 1, 1, 0]},
                                 offline_N=4, d_half=1.0)  # D = 0.1 gives ρ = 2^−0.1 ≈ 0.93, inside the clip
    g = torch.Generator().manual_seed(0)
    steps = [(["p0", "p1", "p2", "p3"], [1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]),
             (["p0", "p2", "p4", "p0"], [0.0, 1.0, 1.0, 1.0], [0.1, 0.1, 0.0, 0.1])]  # D: one update since then
    for prompt_ids, rewards, divergence in steps:
        responses = [torch.randint(8, 90, (int(n),), generator=g) for n in torch.randint(2, 6, (4,), generator=g)]
        meta = put_step(fake_tq, actor, prompt_ids, rewards, responses)
        baselines = reference.baseline(prompt_ids)
        metrics = {}
        t._compute_advantage(meta, metrics)
        stored = fake_tq.kv_batch_get(meta.keys, "train", ["advantages", "response_mask"])
        mask = stored["response_mask"].to_padded_tensor(0).float()
        expected = spo.spo_advantage(torch.tensor(rewards), baselines.float(), mask=mask)
        torch.testing.assert_close(stored["advantages"].to_padded_tensor(0.0), expected)
        t._update_actor(meta, metrics)
        reference.update(prompt_ids, torch.tensor(rewards, dtype=torch.float64),
                         torch.tensor(divergence, dtype=torch.float64))
        torch.testing.assert_close(t.hooks.tracker.alpha, reference.alpha)
        torch.testing.assert_close(t.hooks.tracker.beta, reference.beta)
        assert metrics["spo/D/mean"] == pytest.approx(sum(divergence) / 4)
        fake_tq.kv_clear(meta.keys, "train")  # what verl's fit loop does at the end of a step
    # each prompt keeps its newest response (p0 was drawn twice in step 2: the second one)
    memory = fake_tq.records[MEMORY]
    assert sorted(memory) == ["p0", "p1", "p2", "p3", "p4"]
    assert torch.equal(memory["p0"]["responses"], responses[3])


def test_aspo_through_verls_transferqueue_path(tokenizer, fake_tq):
    t = trainer_for("algorithm.adv_estimator=rlkit_aspo", "+algorithm.aspo.delta=-2.5")
    t.tokenizer, actor = tokenizer, FakeActor(fake_tq)
    texts = ["Let me compute.\n" + tool_call("print(1+1)") + " 2.", "Let me compute the answer step by step. "
             + tool_call("print(1+1)") + " 2.", "The answer is 42.", "The answer is 41."]
    responses = [torch.tensor(tokenizer(x, add_special_tokens=False)["input_ids"]) for x in texts]
    rewards = [1.0, 1.0, 1.0, 0.0]
    meta = put_step(fake_tq, actor, ["q"] * 4, rewards, responses, extra_fields=[{}, {}, {}, {}])
    for key in meta.keys:
        fake_tq.records["train"][key]["uid"] = "same-prompt"
    metrics = {}
    t._compute_advantage(meta, metrics)
    got = fake_tq.kv_batch_get(meta.keys, "train", ["advantages"])["advantages"].to_padded_tensor(0.0)
    data, _, lengths, mask = response_batch(tokenizer, texts, rewards, ["same-prompt"] * 4, [{}] * 4)
    expected = t.advantage_step(data, {}).batch["advantages"]
    torch.testing.assert_close(got, expected[:, : got.shape[1]])
    assert got[0, 0] > got[1, 0] > 0  # the earlier call is favoured
    assert metrics["tool/code_ratio"] == pytest.approx(0.5)
    # the hooks' advantage_metrics see the advantages the estimator computed: how far the shaping moved GRPO's
    valid = torch.ones_like(got)
    for i, r in enumerate(responses):
        valid[i, len(r):] = 0
    base = group_advantage(torch.tensor(rewards), torch.zeros(4, dtype=torch.long), valid)
    want = aspo.shaping_metrics(got, base, valid)
    assert want["aspo/shaped_frac"] == pytest.approx(0.5)  # the two right answers that call the tool
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6), key


def test_dr_grpo_hooks_metrics_through_verls_transferqueue_path(tokenizer, fake_tq):
    """A method whose hooks only measure (Dr. GRPO's) still gets the advantages verl's estimator call computed."""
    t = trainer_for("algorithm.adv_estimator=rlkit_dr_grpo", "algorithm.norm_adv_by_std_in_grpo=false")
    actor = FakeActor(fake_tq)
    responses = [torch.arange(8, 8 + n) for n in (2, 5, 3, 4)]
    meta = put_step(fake_tq, actor, ["a", "a", "b", "b"], [1.0, 0.0, 1.0, 1.0], responses)
    for key, uid in zip(meta.keys, ["a", "a", "b", "b"]):
        fake_tq.records["train"][key]["uid"] = uid
    metrics = {}
    t._compute_advantage(meta, metrics)
    got = fake_tq.kv_batch_get(meta.keys, "train", ["advantages"])["advantages"].to_padded_tensor(0.0)
    torch.testing.assert_close(got[:2, 0], torch.tensor([0.5, -0.5]))  # R − mean R, no std; group b: all 0
    assert metrics["dr_grpo/length_cv"] == pytest.approx(dr_grpo.coefficient_of_variation(torch.tensor([2.0, 5.0])))
    assert metrics["dr_grpo/group_std_cv"] == 0.0  # one group with a spread


def test_a_gspo_runs_advantage_reads_gspos_section_not_grpos(tokenizer, fake_tq):
    """verl's ``rlkit_grpo`` in a GSPO run is GSPO's group advantage: ``+algorithm.gspo.eps`` sets it (the trainer
    names the run's method to the estimator), where it once read GRPO's section."""
    t = trainer_for("algorithm.adv_estimator=rlkit_grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=rlkit_gspo",
                    "+algorithm.gspo.eps=0.5")
    assert t.method.name == "gspo" and not t.method.inputs
    actor = FakeActor(fake_tq)
    responses = [torch.arange(8, 8 + n) for n in (2, 5, 3, 4)]
    rewards, uids = [1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"]
    meta = put_step(fake_tq, actor, uids, rewards, responses)
    for key, uid in zip(meta.keys, uids):
        fake_tq.records["train"][key]["uid"] = uid
    t._compute_advantage(meta, {})
    got = fake_tq.kv_batch_get(meta.keys, "train", ["advantages"])["advantages"].to_padded_tensor(0.0)
    want = group_advantage(torch.tensor(rewards), torch.tensor([0, 0, 1, 1]), torch.ones(4, 1), eps=0.5)
    torch.testing.assert_close(got[:, 0].to(want.dtype), want[:, 0])  # (1 − 0.5) / (0.707 + 0.5) = 0.414
    assert abs(got[0, 0].item() - 0.5 / (0.5 ** 0.5 + 0.5)) < 1e-6


def test_spo_state_is_saved_in_and_restored_from_verls_checkpoint_folder(tmp_path, monkeypatch):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    def verl_save(self):  # verl's own save: actor, critic and dataloader into this folder, then the tracker file
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        # rlkit's part is on disk before verl names the checkpoint complete (a kill in between loses nothing)
        assert os.path.exists(os.path.join(folder, STATE_FILE))
        with open(os.path.join(self.config.trainer.default_local_dir, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(self.global_steps))

    def verl_load(self):  # verl's own load finds the newest folder and sets the step
        self.global_steps = 3

    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", verl_save)
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", verl_load)
    ckpt = f"trainer.default_local_dir={tmp_path}/ckpt"
    t = spo_trainer(tmp_path, {"p1": [1, 0, 1]}, ckpt)
    t.hooks.tracker.update(["p1", "p2"], torch.tensor([1.0, 0.0]), torch.tensor([0.03, 0.0]))
    t.hooks.sampler.sample(t.hooks.tracker.weights(), 3)
    t.global_steps = 3
    t._save_checkpoint()
    resumed = spo_trainer(tmp_path, {"p1": [1, 0, 1]}, ckpt)
    resumed._load_checkpoint()
    torch.testing.assert_close(resumed.hooks.tracker.alpha, t.hooks.tracker.alpha, rtol=0, atol=0)
    torch.testing.assert_close(resumed.hooks.tracker.beta, t.hooks.tracker.beta, rtol=0, atol=0)
    weights = t.hooks.tracker.weights()
    assert resumed.hooks.sampler.sample(weights, 5) == t.hooks.sampler.sample(weights, 5)  # the same next draws
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", lambda self: setattr(self, "global_steps", 7))
    with pytest.raises(FileNotFoundError, match=f"global_step_7/{STATE_FILE} is missing"):
        spo_trainer(tmp_path, {}, ckpt)._load_checkpoint()
