"""One fixed batch through both trainers' update code; prints a JSON report (run by ``tests/test_two_engines.py``).

The same model — a TinyDecoder with weights far from their initialisation, and its export as a Llama model
directory — the same prompts, responses (with calculator output spans the model did not write), rewards and
behaviour log-probs go through:

- the tiny engine: the method's advantage and loss through :mod:`rlkit.registry` as ``rl_step`` calls them,
  :func:`token_logprobs`, ``backward``;
- verl 0.9.1: ``compute_advantage`` with ``rlkit_grpo`` (verl's estimator registry, a ``DataProto``), its FSDP2
  engine's ``forward_backward_batch`` with the rlkit trainer's actor loss (micro-batches of ``argv[1]`` rows),
  gradients read before any optimizer step, on rlkit's CPU platform.

Both run in float32. A fresh process: verl resolves its platform once, at import.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from functools import partial

os.environ.update(VERL_PLATFORM="cpu", VERL_ENGINE_DEVICE="cuda")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from rlkit.tasks import arithmetic  # noqa: E402
from rlkit.tiny.hf import export, llama_state_dict  # noqa: E402
from rlkit.tiny.model import ModelConfig, TinyDecoder, token_logprobs  # noqa: E402
from rlkit import registry  # noqa: E402
from rlkit.tiny.config import build_config  # noqa: E402
from rlkit.tiny.task import build_tokenizer  # noqa: E402

MICRO = int(sys.argv[1]) if len(sys.argv) > 1 else 8
"""Rows per verl micro-batch (the whole batch of 8 by default: statistics over the batch match the tiny engine)."""

LOSSES = {"grpo": "rlkit_ppo", "gspo": "rlkit_gspo", "aepo": "rlkit_aepo", "hapo": "rlkit_hapo"}


def fixed_batch(tok):
    """2 prompts × 4 responses: gold mixed-form solutions cut at different lengths (tool outputs inside), 0/1
    rewards, and behaviour log-probs a little off the model's (so ratios leave 1 and clips act)."""
    problems = arithmetic.make_split(2, "test", seed=11)
    prompts, responses, masks = [], [], []
    for p in problems:
        solution = tok.encode(p.solution("mixed")) + [tok.eos_id]
        for cut in (len(solution), len(solution) - 3, len(solution) // 2, 9):
            resp = solution[:cut]
            inside, mask = False, []
            for t in resp:  # the calculator's <output>…</output> is the environment's: mask 0
                inside = inside or t == tok.output_id
                mask.append(0 if inside else 1)
                inside = inside and t != tok.end_output_id
            prompts.append([tok.bos_id, *tok.encode(arithmetic.prompt(p))])
            responses.append(resp)
            masks.append(mask)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    return prompts, responses, masks, rewards


def padded(rows, width, fill=0, left=False):
    out = torch.full((len(rows), width), fill, dtype=torch.long)
    for i, r in enumerate(rows):
        if left:
            out[i, width - len(r):] = torch.tensor(r)
        else:
            out[i, : len(r)] = torch.tensor(r)
    return out


def main() -> None:
    tok = build_tokenizer()
    torch.manual_seed(0)
    tiny = TinyDecoder(ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=2))
    with torch.no_grad():
        for p in tiny.parameters():
            p.normal_(0, 0.2)
    model_dir = export(tiny, tok, tempfile.mkdtemp(prefix="rlkit-two-engines-") + "/model")

    prompts, responses, masks, rewards = fixed_batch(tok)
    B, P, T = len(prompts), max(map(len, prompts)), max(map(len, responses))
    prompt_ids, response_ids = padded(prompts, P, tok.pad_id, left=True), padded(responses, T, tok.pad_id)
    prompt_attn = padded([[1] * len(p) for p in prompts], P, 0, left=True)
    response_attn = padded([[1] * len(r) for r in responses], T)
    mask = padded(masks, T).float()  # (B, T) loss mask: real, model-written tokens
    group_ids = np.array(["q0"] * 4 + ["q1"] * 4, dtype=object)
    g = torch.Generator().manual_seed(1)
    ids, attn = torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_attn, response_attn], 1).bool()
    with torch.no_grad():
        logp0, _ = token_logprobs(tiny, ids, attn, P)
    old_logp = (logp0 + 0.3 * torch.randn(B, T, generator=g)) * response_attn  # the behaviour policy's

    # ---------------------------------------------------------------------------------------- verl's side
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.trainer.config.config import CheckpointConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig
    from verl.workers.engine import EngineRegistry

    from rlkit.verl.plugin import ensure_registered
    from rlkit.verl.trainer import actor_loss

    ensure_registered()
    scores = torch.zeros(B, T)
    scores[torch.arange(B), response_attn.sum(1) - 1] = rewards  # verl's token-level reward at the last token
    data = DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask},
                               non_tensors={"uid": group_ids})
    verl_adv = compute_advantage(data, adv_estimator="rlkit_grpo", num_repeat=4,
                                 norm_adv_by_std_in_grpo=True, config={}).batch["advantages"]

    engine = EngineRegistry.new(
        model_type="language_model", backend="fsdp2",
        model_config=HFModelConfig(path=str(model_dir), use_remove_padding=False, enable_gradient_checkpointing=False,
                                   override_config={"attn_implementation": "sdpa"}),
        engine_config=FSDPEngineConfig(strategy="fsdp2", use_torch_compile=False, model_dtype="fp32",
                                       mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                        "buffer_dtype": "fp32"}),
        optimizer_config=FSDPOptimizerConfig(lr=1e-3, clip_grad=1e9, total_training_steps=8),
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    names = [n for n, _ in engine.module.named_parameters()]
    nested = partial(torch.nested.as_nested_tensor, layout=torch.jagged)
    report = {"advantage_max_abs_diff": None, "methods": {}}

    cfg = build_config("grpo", "cpu")
    tiny_adv = None
    for method, loss_name in LOSSES.items():
        cfg = build_config(method, "cpu")
        # ---- the tiny engine's update code on the batch: rlkit.tiny.rl's registry calls
        inputs = registry.AdvantageInputs(rewards, group_ids, mask)
        tiny_adv = registry.advantage("grpo", inputs, cfg.method_configs)  # verl's side runs rlkit_grpo for all four
        tiny.zero_grad()
        logp, entropy = token_logprobs(tiny, ids, attn, P)
        loss, _ = registry.policy_loss(method, logp, old_logp, tiny_adv, mask, cfg.method_configs,
                                       entropy=entropy.detach())
        loss.backward()
        tiny_grads = {}
        grad_model = TinyDecoder(tiny.config)
        with torch.no_grad():
            for gp, p in zip(grad_model.parameters(), tiny.parameters()):
                gp.copy_(p.grad)
        tiny_grads = llama_state_dict(grad_model)

        # ---- verl's actor update code on the same batch
        lossc = getattr(cfg, method) if method != "grpo" else cfg.grpo
        config = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=MICRO, ppo_mini_batch_size=2,
                             clip_ratio_low=lossc.clip_low, clip_ratio_high=lossc.clip_high,
                             clip_ratio_c=getattr(lossc, "clip_c", None) or 3.0, loss_agg_mode=lossc.agg,
                             policy_loss=PolicyLossConfig(loss_mode=loss_name))
        options = {"grpo": cfg.grpo, method: getattr(cfg, method)} if method != "grpo" else {"grpo": cfg.grpo}
        rows = [torch.cat([torch.tensor(p), torch.tensor(r)]) for p, r in zip(prompts, responses)]
        batch = TensorDict({
            "input_ids": nested(rows),
            "position_ids": nested([torch.arange(len(r)) for r in rows]),
            "prompts": nested([torch.tensor(p) for p in prompts]),
            "responses": nested([torch.tensor(r) for r in responses]),
            "response_mask": nested([torch.tensor(m, dtype=torch.long) for m in masks]),
            "loss_mask": nested([torch.tensor(m, dtype=torch.long) for m in masks]),
            "old_log_probs": nested([old_logp[i, : len(r)] for i, r in enumerate(responses)]),
            "advantages": nested([verl_adv[i, : len(r)].float() for i, r in enumerate(responses)]),
        }, batch_size=[B])
        tu.assign_non_tensor(batch, use_remove_padding=False, use_dynamic_bsz=False, micro_batch_size_per_gpu=MICRO,
                             use_fused_kernels=False, temperature=1.0, calculate_entropy=True, global_batch_size=B,
                             max_token_len_per_gpu=4096)
        engine.optimizer_zero_grad()
        with engine.train_mode():
            out = engine.forward_backward_batch(batch, loss_function=partial(actor_loss, config=config,
                                                                             options=options), forward_only=False)
            # read inside train_mode: leaving it may offload or free the gradients
            verl_grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                          for n, p in engine.module.named_parameters() if p.grad is not None}
            missing = sorted(set(names) - set(verl_grads))
            assert not missing, f"verl's engine left no gradient on {missing[:4]}"
        diffs, scale = {}, 0.0
        for name, want in tiny_grads.items():
            got = verl_grads.get(name)
            if got is None and name == "model.embed_tokens.weight":
                got = verl_grads.get("lm_head.weight")
            diffs[name] = (got - want).abs().max().item()
            scale = max(scale, want.abs().max().item())
        report["methods"][method] = {
            "tiny_loss": loss.item(), "verl_loss": float(sum(out["loss"])) if isinstance(out["loss"], list)
            else float(out["loss"]), "grad_max_abs_diff": max(diffs.values()), "grad_max_abs": scale,
            "grad_names": len(diffs), "verl_param_names": len(verl_grads),
        }
    report["advantage_max_abs_diff"] = (verl_adv.float() - tiny_adv.float()).abs().max().item()
    report["advantage_nonzero"] = int((tiny_adv.abs() > 0).sum())
    print("REPORT " + json.dumps(report), flush=True)  # the last line; verl and transformers print above it
    dist.destroy_process_group()
    shutil.rmtree(os.path.dirname(model_dir), ignore_errors=True)


if __name__ == "__main__":
    main()
