"""What a verl run sets: method presets, datasets, tools, the CPU preset and the batch arithmetic.

``rlkit launch`` merges :data:`COMMON`, :data:`DATASETS`, :data:`PRESETS` (each value with the paper section
it comes from, or read from the method's ``Config``: :data:`DEFAULTS`), the batch (:func:`scaled_batch`), the
paths and the user's overrides. Keys with a leading ``+`` are not in verl's schema. Imports no verl or Hydra.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit import registry
from rlkit.environ import cache_root
from rlkit.verl import TRAINER, LaunchError
from rlkit.verl.launch.data import DAPO_TRAIN_FILE, DAPO_VAL_FILE


COMMON: dict[str, Any] = {
    "trainer.v1.trainer_mode": TRAINER,  # rlkit's trainer (rlkit/verl/trainer.py) runs every method's hooks
    "actor_rollout_ref.rollout.name": "vllm",
    # AEPO scripts, SPO train.sh, HAPO recipes (method notes: AEPO, SPO, HAPO); verl's GSPO and GSM8K examples
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    # KL = 0: GSPO §5.1, SPO train.sh, HAPO recipes, AEPO scripts (method notes: AEPO, GSPO, SPO, HAPO)
    "actor_rollout_ref.actor.use_kl_loss": False,
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.actor.entropy_coeff": 0,  # AEPO/ARLArena and HAPO: no entropy bonus (method notes: AEPO, HAPO)
    "actor_rollout_ref.rollout.temperature": 1.0,  # ASPO §4.1; HAPO's base temperature (method notes: ASPO, HAPO)
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,  # verl's GSM8K GRPO example
    "actor_rollout_ref.actor.use_dynamic_bsz": True,  # micro-batches packed by tokens (verl's DAPO recipe)
    "data.filter_overlong_prompts": True,
    "trainer.critic_warmup": 0,
    "trainer.project_name": "rlkit",
    "trainer.logger": ["console", "file"],  # "file": verl's JSONL logger, read by rlkit.metrics
    "trainer.save_freq": 20,
    "trainer.max_actor_ckpt_to_keep": 2,
    "trainer.resume_mode": "auto",
}

GSM8K_SAMPLES_PER_GPU = 256
"""GSM8K: responses sampled per GPU per step (32 prompts × 8 for GRPO); prompts per step = this × GPUs / n."""


@dataclass(frozen=True)
class Dataset:
    """A dataset's parquet files, the overrides every method shares on it, vLLM's tensor parallelism, tool."""

    train: str
    val: str
    keys: dict[str, Any]
    rollout_tp: int
    tool: str | None = None


DATASETS: dict[str, Dataset] = {
    # Small Qwen models (0.5B–1.5B), one GPU and up: verl's examples/grpo_trainer/run_qwen2-7b.sh on GSM8K
    "gsm8k": Dataset(train="train.parquet", val="test.parquet", rollout_tp=1, keys={
        "data.max_prompt_length": 512,
        "data.max_response_length": 1024,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,  # ≥ 10 full sequences per micro-batch
        "trainer.total_epochs": 15,
        "trainer.test_freq": 5,
        # reward: verl's own GSM8K rule for data_source "openai/gsm8k" (the answer after "####")
        # validation: greedy (verl's default val_kwargs), one answer per problem
    }),
    # The tiny engine's word problems (rlkit data arithmetic): CPU runs by default; any model on GPUs.
    # Every method calls the calculator here, as in the tiny engine (verl's tool agent loop, rlkit.verl.tools).
    "arithmetic": Dataset(train="train.parquet", val="test.parquet", rollout_tp=1, tool="calculator", keys={
        "data.max_prompt_length": 256,  # questions ≤ 200 characters (rlkit.tasks.arithmetic)
        "data.max_response_length": 512,
        "reward.custom_reward_function.path": "pkg://rlkit.tasks.arithmetic",  # the tiny engine's answer rule
        "reward.custom_reward_function.name": "compute_score",
        "trainer.total_epochs": 15,
        "trainer.test_freq": 5,
    }),
    # The papers' scale: DAPO-Math-17k, AIME 2024 for validation, 8B models on 8+ GPUs.
    "dapo": Dataset(train=DAPO_TRAIN_FILE, val=DAPO_VAL_FILE, rollout_tp=2, keys={
        "data.max_prompt_length": 2048,  # verl's DAPO recipe (recipe/dapo/run_dapo_qwen2.5_32b.sh)
        "reward.custom_reward_function.path": "pkg://rlkit.tasks.dapo_math",  # math-verify's symbolic check
        "reward.custom_reward_function.name": "compute_score",
        "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
        "trainer.total_epochs": 1,  # verl's DAPO recipe; a method whose paper states its epochs overrides it
        "trainer.test_freq": 10,  # verl's GSPO example on DAPO-Math
    }),
}


TOOLS: dict[str, dict[str, Any]] = {
    # rlkit's sandboxed Python for tool-integrated presets (ASPO, SPO) on GSM8K and DAPO-Math: verl's hermes calls
    "sandbox": {},
    # the tiny engine's calculator: <code>expr</code> ends a turn, <output>value</output> comes back (mask 0);
    # up to 8 calls and the answer, as the tiny sampler's max_tool_calls
    "calculator": {"actor_rollout_ref.rollout.multi_turn.format": "rlkit_code",
                   "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 9},
}
"""Tools a run can use (a copy of the tool's config goes into the run directory) and their overrides."""


@dataclass(frozen=True)
class DataFile:
    """A file in the run's data directory (``--data``, default ``data/<dataset>``)."""

    name: str


@dataclass(frozen=True)
class Preset:
    """One method's settings: ``n`` responses per prompt, ``updates`` optimizer steps per batch, the paper's
    ``dapo_prompts`` per step, ``keys`` everywhere, ``dapo`` on DAPO-Math only, ``tools``: the sandbox."""

    n: int
    updates: int
    dapo_prompts: int
    keys: dict[str, Any]
    dapo: dict[str, Any]
    tools: bool = False


# DAPO's dynamic sampling as verl's DAPO recipe and HAPO's recipes set it (method notes: HAPO: "filter_groups
# on acc"), with the DAPO recipe's max_num_gen_batches=10 (verl 0.9.1 ignores it, rlkit's trainer enforces it)
_DYNAMIC_SAMPLING = {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc",
                     "algorithm.filter_groups.max_num_gen_batches": 10}


def overlong(buffer: int = 4096, penalty: float = 1.0) -> dict[str, Any]:
    """DAPO's soft overlong penalty over the last ``buffer`` tokens (verl's ``dapo`` reward manager)."""
    return {"reward.reward_manager.name": "dapo",
            "+reward.reward_kwargs.max_resp_len": "${data.max_response_length}",
            "+reward.reward_kwargs.overlong_buffer_cfg.enable": True,
            "+reward.reward_kwargs.overlong_buffer_cfg.len": buffer,
            "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": penalty,
            "+reward.reward_kwargs.overlong_buffer_cfg.log": True}


def _clip(low: float, high: float, c: float) -> dict[str, Any]:
    return {"actor_rollout_ref.actor.clip_ratio_low": low, "actor_rollout_ref.actor.clip_ratio_high": high,
            "actor_rollout_ref.actor.clip_ratio_c": c}


DEFAULTS = {name: registry.get_method(name).config() for name in registry.list_methods()["method"]}
"""rlkit method → its ``Config()``: its paper's values, written once in its module and read here."""
_GRPO_CLIP = _clip(0.2, 0.28, 10.0)  # SPO train.sh, shared by its GRPO runs (method notes: SPO)


def _val(n: int, temperature: float, top_p: float | None = None, top_k: int | None = None) -> dict[str, Any]:
    """Validation sampling: ``n`` answers per problem (verl reports their mean accuracy, ``mean@n``)."""
    given = {"n": n, "temperature": temperature, "top_p": top_p, "top_k": top_k}
    return {f"actor_rollout_ref.rollout.val_kwargs.{k}": v for k, v in given.items() if v is not None}


# AIME as SPO's recipe samples it (method notes: SPO): 16 answers per problem, T 0.6, top-p 0.95, top-k 20.
_SPO_VAL = _val(16, 0.6, 0.95, 20)

# SPO's reward (seed 002, the recipe's compute_score): one </think>, no code block after it, then the answer.
_SPO_FORMAT = {"+reward.custom_reward_function.reward_kwargs.format_rule": True}

PRESETS: dict[str, Preset] = {
    # GRPO, the baseline: SPO's GRPO column (method notes: SPOrecipe/spo/train.sh): 128 prompts × 8, mini-batch 16.
    "grpo": Preset(
        n=8, updates=8, dapo_prompts=128, keys={
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            **_GRPO_CLIP,
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",  # SPO recipe (method notes: SPO)
        },
        dapo={"data.max_response_length": 8192, **_SPO_VAL, **_SPO_FORMAT},  # SPO train.sh (method notes: SPO)
    ),
    # GSPO (paper v2 §5.1): sequence-ratio loss on GRPO advantages, no critic (AEPO/GSPO integration guide).
    "gspo": Preset(
        n=16, updates=4,  # n = 16: verl's GSPO example on DAPO-Math; 4 mini-batches per batch: paper §5.1
        dapo_prompts=256, keys={  # verl's examples/gspo_trainer/run_qwen30b_gspo.sh; the paper gives none
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_gspo",
            # ε_left, ε_right: paper §5.1 (gspo.Config's); c = 10: verl's GSPO example
            **_clip(DEFAULTS["gspo"].clip_low, DEFAULTS["gspo"].clip_high, 10.0),
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["gspo"].agg,  # Eq. 5's (1/G)Σ_i (method notes: GSPO)
        },
        # verl's GSPO example on DAPO-Math: 8k responses, overlong penalty, validation top-p 0.7 at T 1.0
        dapo={"data.max_response_length": 8192, **overlong(), **_val(1, 1.0, 0.7)},
    ),
    # ASPO (§4.1): DAPO with a Python tool, 96 prompts × 8, max length 16,384, 3 epochs; Eq. 2's δ, k (§4.5).
    "aspo": Preset(
        n=8, updates=16,  # mini-batch not stated; DAPO's 16 steps per batch (512/32, method notes: HAPO)
        dapo_prompts=96, keys={
            "algorithm.adv_estimator": "rlkit_aspo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            # DAPO's clip-higher (verl's DAPO recipe, HAPO recipes: c = 10)
            **_clip(DEFAULTS["dapo"].clip_low, DEFAULTS["dapo"].clip_high, 10.0),
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["dapo"].agg,  # DAPO's token-level loss
            **_DYNAMIC_SAMPLING,  # DAPO (method notes: ASPO: "DAPO dynamic sampling removes all-correct groups")
            "+algorithm.aspo.delta": DEFAULTS["aspo"].delta,  # conservative setting, §4.5
            "+algorithm.aspo.k": DEFAULTS["aspo"].k,  # §4.5
        },
        # §4.1: 16,384 tokens, 3 epochs, evaluation at T 0.6; AIME scored avg@16 (§4.5)
        dapo={"data.max_response_length": 16384, **overlong(), "trainer.total_epochs": 3, **_val(16, 0.6)},
        tools=True,  # the Python interpreter whose first call ASPO moves earlier (§4.1)
    ),
    # AEPO: GRPO advantages, the AEPO loss, no critic (AEPO/GSPO integration guide); ARLArena's math trainer
    # (examples/math_trainer/4B/train_aepo.sh, method notes: AEPO): 512 prompts × 4, mini-batch 128, 16k lengths.
    "aepo": Preset(
        n=4, updates=4, dapo_prompts=512, keys={
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_aepo",
            # ARLArena math_agent_trainer.yaml (method notes: AEPO)
            **_clip(DEFAULTS["aepo"].clip_low, DEFAULTS["aepo"].clip_high, DEFAULTS["aepo"].clip_c),
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["aepo"].agg,  # both codes (method notes: implementation)
        },
        dapo={"data.max_response_length": 16384},  # ARLArena's 4B script (its KL loss left off: coefficient?)
    ),
    # SPO (recipe/spo/train.sh, method notes: SPO): one response per prompt, 1024 prompts, mini-batch 128, a tool.
    "spo": Preset(
        n=1, updates=8, dapo_prompts=1024, keys={
            "algorithm.adv_estimator": "rlkit_spo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            **_clip(DEFAULTS["spo"].clip_low, DEFAULTS["spo"].clip_high, DEFAULTS["spo"].clip_c),  # train.sh
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["spo"].agg,
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 8,  # train.sh (method notes: SPO)
        },
        dapo={"data.max_response_length": 8192, **_SPO_VAL, **_SPO_FORMAT,  # train.sh (method notes: SPO)
              "+algorithm.spo.offline_values": DataFile("offline_values.json")},  # rlkit data's SPO pipeline
        tools=True,  # the recipe's ReTool-style multi-turn Python agent (method notes: SPO)
    ),
    # HAPO (recipes, method notes: HAPO): DAPO + the four components; 512 prompts × 16, mini-batch 32, 32×A100.
    "hapo": Preset(
        n=16, updates=16, dapo_prompts=512, keys={
            "algorithm.adv_estimator": "rlkit_hapo_tlga",  # B: token-level group average
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_hapo",  # C, D: redistribution, clip
            # the paper's clip-higher (the recipes': 0.2), the recipes' c (method notes: HAPO)
            **_clip(DEFAULTS["hapo"].clip_low, DEFAULTS["hapo"].clip_high, DEFAULTS["hapo"].clip_c),
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["hapo"].agg,
            **_DYNAMIC_SAMPLING,
            "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,  # recipes (method notes: HAPO)
            "actor_rollout_ref.actor.optim.weight_decay": 0.1,  # recipes (method notes: HAPO)
        },
        # Qwen3 recipes: 12,288 tokens, overlong 4096 with penalty 1.0; validation n 8, T 0.5, top-p 0.7
        dapo={"data.max_response_length": 12288, **overlong(), **_val(8, 0.5, 0.7)},
    ),
    # DAPO (arXiv 2503.14476 §4.1): 512 prompts × 16, mini-batches of 512 responses (32 prompts: 16 updates per step).
    # verl's filter_groups refills the batch with groups of mixed accuracy, as the paper does (the tiny
    # engine's DapoHooks over-sample up front); the overlong penalty is verl's dapo reward manager.
    "dapo": Preset(
        n=16, updates=16, dapo_prompts=512, keys={
            "algorithm.adv_estimator": "rlkit_grpo",  # GRPO's group advantage (Eq. 10)
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            # clip-higher ε_low, ε_high (§3.1); c = 10: verl's DAPO recipe
            **_clip(DEFAULTS["dapo"].clip_low, DEFAULTS["dapo"].clip_high, 10.0),
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["dapo"].agg,  # token-level loss (§3.3, Eq. 12)
            **_DYNAMIC_SAMPLING,  # dynamic sampling (§3.2, Eq. 11)
            "actor_rollout_ref.actor.optim.lr_warmup_steps": 20,  # lr 1e-6 with 20 warm-up steps (§4.1)
        },
        # L_max 16,384 + L_cache 4,096 = 20,480 tokens with the soft overlong penalty (§3.4, Eq. 13; §4.1);
        # AIME avg@32 at top-p 0.7 (§4.1)
        dapo={"data.max_response_length": 20480, **overlong(4096, 1.0), **_val(32, 1.0, 0.7)},
    ),
    # Dr. GRPO (arXiv 2503.20783): GRPO's preset with the two terms §3 removes — nothing else changed, so the two
    # presets differ only there.
    "dr_grpo": Preset(
        n=8, updates=8, dapo_prompts=128, keys={  # GRPO's preset
            "algorithm.adv_estimator": "rlkit_dr_grpo",  # Â = R − mean R (§3.2, Fig. 1) ...
            "algorithm.norm_adv_by_std_in_grpo": DEFAULTS["dr_grpo"].norm_by_std,  # ... no std: verl's key
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            **_GRPO_CLIP,  # GRPO's preset
            # each response's token losses summed and divided by one constant, the generation budget (§3.2; the
            # paper's code divides by MAX_TOKENS): verl pads a micro-batch only to its longest response, so the
            # constant is set rather than left to the padded width
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["dr_grpo"].agg,
            "actor_rollout_ref.actor.loss_scale_factor": "${data.max_response_length}",
        },
        dapo={"data.max_response_length": 8192, **_SPO_VAL, **_SPO_FORMAT},  # GRPO's preset
    ),
    # CISPO (MiniMax-M1, arXiv 2506.13585 §3.1) on GRPO's group advantage (the paper's Eq. 2); rlkit's cispo loss,
    # equal to verl's own `cispo` in values and gradients (tests/test_cispo.py), which also logs cispo/clipped_frac.
    # The paper states no batch for its CISPO runs: GRPO's preset.
    "cispo": Preset(
        n=8, updates=8, dapo_prompts=128, keys={  # GRPO's preset
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_cispo",
            # ε_low^IS 1.0: no lower bound on the weight (§3.1); ε_high^IS tuned, value not given: DAPO's 0.28;
            # c: not read by CISPO (verl's default)
            **_clip(DEFAULTS["cispo"].clip_low, DEFAULTS["cispo"].clip_high, 3.0),
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["cispo"].agg,  # Eq. 4's 1/Σ_i|o_i|
        },
        dapo={"data.max_response_length": 8192, **_SPO_VAL, **_SPO_FORMAT},  # GRPO's preset
    ),
    # SAPO (arXiv 2511.20347, Eq. 5) on GRPO's group advantage; rlkit's sapo loss, equal to verl's own `sapo` in values
    # and gradients at the paper's aggregation (tests/test_sapo.py). The paper states no batch or lengths:
    # GSPO's preset, the same team's setup with the same 4 updates per batch.
    "sapo": Preset(
        n=16, updates=4, dapo_prompts=256, keys={  # GSPO's preset; 4 mini-batches per batch: the paper's runs
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_sapo",
            # no clip: SAPO reads none of verl's clip_ratio_* keys (verl's defaults stand)
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["sapo"].agg,  # Eq. 5's (1/G) Σ_i (1/|y_i|) Σ_t
            "+algorithm.sapo.tau_pos": DEFAULTS["sapo"].tau_pos,  # τ_pos, the paper's
            "+algorithm.sapo.tau_neg": DEFAULTS["sapo"].tau_neg,  # τ_neg > τ_pos (Fig. 5); verl's actor.tau_* unread
        },
        dapo={"data.max_response_length": 8192, **overlong(), **_val(1, 1.0, 0.7)},  # GSPO's preset
    ),
    # GMPO (arXiv 2507.20673) on GRPO's group advantage; rlkit's gmpo loss, equal to verl's own `geo_mean` in values
    # and gradients at the paper's aggregation (tests/test_gmpo.py), which also logs where its clip binds. The paper
    # trains as Dr. GRPO's code does: 1,024 responses a step, 8 per prompt, in mini-batches of 128 (8 updates).
    "gmpo": Preset(
        n=8, updates=8, dapo_prompts=128,  # 128 prompts × 8 = 1,024 responses, mini-batches of 128 responses
        keys={
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_gmpo",
            # ε_low = ε_high = 0.4 in log space: ratios within (e^-0.4, e^0.4), the paper's best (Table 4); verl's keys,
            # read in log space by this loss; no clip_ratio_c: GMPO has no dual clip
            "actor_rollout_ref.actor.clip_ratio_low": DEFAULTS["gmpo"].clip_low,
            "actor_rollout_ref.actor.clip_ratio_high": DEFAULTS["gmpo"].clip_high,
            "actor_rollout_ref.actor.loss_agg_mode": DEFAULTS["gmpo"].agg,  # the objective's (1/G) Σ_i
        },
        # the paper's 3,000-token responses and greedy evaluation (Dr. GRPO's protocol, which it follows)
        dapo={"data.max_response_length": 3000, **_val(1, 0.0)},
    ),
}
METHODS = tuple(PRESETS)

DEVICES = ("gpu", "cpu")
CPU_SAMPLES = 16
"""Responses per step in CPU runs: 4 prompts × :data:`CPU_GROUP`, or 16 prompts × 1 for SPO."""
CPU_GROUP = 4
"""Responses per prompt in CPU runs (SPO keeps its one)."""
CPU_UPDATES = 2
"""Optimizer steps per rollout batch in CPU runs."""
CPU_STEPS = 10
"""Training steps of a CPU run unless ``--steps`` says otherwise."""
CPU_MODEL = "tiny-random-llama"

CPU: dict[str, Any] = {
    # verl on the CPU (rlkit.verl.cpu): FSDP1 refuses CPU parameters with sync_module_states, so FSDP2 (gloo);
    # float32 throughout (verl's default mixed precision computes in bf16)
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.ref.strategy": "fsdp2",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype": "fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype": "fp32",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
    "actor_rollout_ref.model.use_remove_padding": False,  # flash-attn's packed path: GPUs only
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
    "actor_rollout_ref.actor.optim.lr": 1e-3,  # a tiny model: large steps, visible in a few updates
    # vLLM's CPU build: eager, float32, no sleep mode, KV cache sized by VLLM_CPU_KVCACHE_SPACE (cpu.ENV)
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.rollout.dtype": "float32",
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.1,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 2048,
    "actor_rollout_ref.rollout.max_model_len": 512,
    "actor_rollout_ref.rollout.enable_prefix_caching": False,
    "+actor_rollout_ref.rollout.enable_sleep_mode": False,
    "actor_rollout_ref.rollout.free_cache_engine": False,
    "actor_rollout_ref.rollout.agent.num_workers": 1,
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend": "uni",  # no worker process
    # the sampler's log-probs, whose mismatch with the actor's verl 0.9.1 logs (rollout_corr/*): pinned
    "actor_rollout_ref.rollout.calculate_log_probs": True,
    # toy scale: 64-token answers, 256 training problems, 64 held-out ones and a checkpoint every 5 steps
    "data.max_prompt_length": 256,
    "data.max_response_length": 64,
    "data.truncation": "error",
    "data.dataloader_num_workers": 0,
    "data.val_max_samples": 64,
    "data.train_max_samples": 256,  # a pool small enough that prompts come back within a run (SPO's tracker)
    "trainer.test_freq": 5,
    "trainer.save_freq": 5,
    "trainer.val_before_train": True,
    # Ray local: one fake GPU resource for verl's placement; CPU slots are scheduling units, not cores
    "ray_kwargs.ray_init.num_cpus": 16,
    "+ray_kwargs.ray_init.num_gpus": 1,
    "+ray_kwargs.ray_init.include_dashboard": False,
    "+ray_kwargs.ray_init.address": "local",  # a Ray of its own, even where `ray start` left one running
    # one process per role (verl starts 8 of each): every Ray actor imports verl, ~10 s of CPU each
    "reward.num_workers": 1,
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
}
"""Overrides of every CPU run (after the method's preset; the user's own overrides still come last)."""

CPU_PRETRAINED: dict[str, Any] = {
    # a model that talks (--model DIR): the GPU presets' learning rate; the toy model's 1e-3 would wreck it
    "actor_rollout_ref.actor.optim.lr": COMMON["actor_rollout_ref.actor.optim.lr"],
    # SmolLM2-135M's GSM8K answers cut at 256 tokens averaged 212, 69% cut (reproductions/LOG.md, 2026-12-02)
    "data.max_response_length": 512,
    "actor_rollout_ref.rollout.max_model_len": 768,  # prompt (CPU's 256) + response
    # 8 × 768 × 49,152 logits (1.2 GB a copy) held the FSDP worker at 12.2 GB (LOG 2026-12-02); 2: 0.3 GB
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 2,
}
"""Overrides of a CPU run on a model of its own (after :data:`CPU`; not with ``--tiny-scale``)."""


@dataclass(frozen=True)
class Batch:
    """One step's batch in verl's units: prompts per step, prompts per mini-batch, responses per prompt."""

    prompts: int
    mini_batch: int
    n: int


def scaled_batch(method: str, dataset: str, n_gpus: int) -> Batch:
    """The batch of ``method`` on ``n_gpus``: GSM8K keeps the samples per GPU, DAPO-Math the paper's batch."""
    preset, _ = method_preset(method), dataset_spec(dataset)
    if n_gpus < 1:
        raise LaunchError(f"the number of GPUs must be ≥ 1, got {n_gpus}")
    prompts = GSM8K_SAMPLES_PER_GPU * n_gpus // preset.n if dataset == "gsm8k" else preset.dapo_prompts
    return Batch(prompts=prompts, mini_batch=prompts // preset.updates, n=preset.n)


def cpu_batch(method: str) -> Batch:
    """The batch of ``method`` in a CPU run (:data:`CPU_SAMPLES` responses, :data:`CPU_UPDATES` mini-batches)."""
    n = 1 if method_preset(method).n == 1 else CPU_GROUP
    prompts = CPU_SAMPLES // n
    return Batch(prompts=prompts, mini_batch=prompts // CPU_UPDATES, n=n)


def default_cpu_model_path() -> Path:
    """Where :func:`default_cpu_model` builds the default CPU model (in ``$RLKIT_CACHE``)."""
    return cache_root() / "models" / CPU_MODEL


def default_cpu_model() -> str:
    """The default CPU model, built once: a random 2-layer Llama over the tiny engine's vocabulary."""
    path = default_cpu_model_path()
    if not (path / "config.json").exists():
        from rlkit.tiny.hf import save_random_model
        from rlkit.tiny.task import build_tokenizer

        save_random_model(path, build_tokenizer(), seed=0)
    return str(path)


def method_preset(method: str) -> Preset:
    """``method``'s preset, or :class:`LaunchError` listing the valid methods."""
    if method not in PRESETS:
        raise LaunchError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")
    return PRESETS[method]


def dataset_spec(dataset: str) -> Dataset:
    """``dataset``'s entry of :data:`DATASETS`, or :class:`LaunchError` listing the valid datasets."""
    if dataset not in DATASETS:
        raise LaunchError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    return DATASETS[dataset]
