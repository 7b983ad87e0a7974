"""One verl actor update per rlkit loss, on CPU, in verl 0.9.1's own FSDP2 engine; prints a JSON report.

Run as a script by ``tests/test_verl_actor_update.py`` (a fresh process: verl resolves its platform once, at import).

verl 0.9.1 ships no CPU platform: without an accelerator it falls back to its CUDA platform, and the engine then
calls ``torch.cuda.current_device()``. verl's own extension point for new hardware (``PlatformRegistry`` +
``VERL_PLATFORM``) takes the small CPU platform below; ``VERL_ENGINE_DEVICE=cuda`` picks the FSDP engine
(registered for cuda/npu only); gloo replaces NCCL; the tiny Qwen2 model uses SDPA (no flash-attn on CPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from functools import partial

os.environ.update(VERL_USE_EXTERNAL_PLUGINS="none", VERL_PLATFORM="cpu", VERL_ENGINE_DEVICE="cuda")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from verl.plugin.platform.platform_cuda import PlatformCUDA  # noqa: E402
from verl.plugin.platform.platform_manager import PlatformRegistry  # noqa: E402


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformCUDA):
    """verl's CUDA platform with every device call pointed at the CPU."""

    device_name = property(lambda self: "cpu")
    vendor_name = property(lambda self: "cpu")
    device_module = property(lambda self: torch.cpu)

    def is_available(self):
        return True

    def is_platform_available(self, use_smi_check=False):
        return True

    def current_device(self):
        return "cpu"

    def device_count(self):
        return 1

    def set_device(self, device_index):
        pass

    def synchronize(self, device_index=None):
        pass

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings):
        pass

    def empty_cache(self):
        pass

    def get_device_capability(self, device_index=0):
        return (None, None)

    def communication_backend_name(self):
        return "gloo"

    def nvtx_range(self, msg):
        return contextlib.nullcontext()

    def is_ipc_supported(self):
        return False


def tiny_model_dir() -> tuple[str, int]:
    """A randomly initialised 2-layer Qwen2 with a byte-level BPE tokenizer trained here (no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = tempfile.mkdtemp(prefix="rlkit-tiny-qwen2-")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["the answer is 42. print(1+1)"] * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    hf_tok.save_pretrained(path)
    config = Qwen2Config(vocab_size=len(hf_tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path, len(hf_tok)


def main() -> None:
    model_dir, vocab = tiny_model_dir()
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    from tensordict import TensorDict
    from verl.trainer.config.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig
    from verl.workers.engine import EngineRegistry
    from verl.workers.utils.padding import response_from_nested

    from rlkit.methods import aepo, cispo, gspo, grpo, hapo
    from rlkit.verl.plugin import ensure_registered
    from rlkit.verl.trainer import actor_loss

    ensure_registered()  # the entry point was switched off above, so the platform could be registered first
    engine = EngineRegistry.new(
        model_type="language_model", backend="fsdp2",
        model_config=HFModelConfig(path=model_dir, use_remove_padding=False,
                                   enable_gradient_checkpointing=False,
                                   override_config={"attn_implementation": "sdpa"}),
        engine_config=FSDPEngineConfig(strategy="fsdp2", use_torch_compile=False, model_dtype="fp32",
                                       mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                        "buffer_dtype": "fp32"}),
        optimizer_config=FSDPOptimizerConfig(lr=1e-3, clip_grad=1.0, total_training_steps=8),
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, vocab, (n,), generator=g) for n in (3, 4, 3, 5)]
    responses = [torch.randint(2, vocab, (n,), generator=g) for n in (5, 2, 4, 3)]
    advantages = (1.0, -0.5, 0.7, -1.2)
    nested = partial(torch.nested.as_nested_tensor, layout=torch.jagged)

    def batch(**fields):  # what verl's agent loop and trainer put in TransferQueue for the actor
        data = TensorDict({
            "input_ids": nested([torch.cat([p, r]) for p, r in zip(prompts, responses)]),
            "position_ids": nested([torch.arange(len(p) + len(r)) for p, r in zip(prompts, responses)]),
            "prompts": nested(prompts), "responses": nested(responses),
            "response_mask": nested([torch.ones(len(r), dtype=torch.long) for r in responses]),
            "loss_mask": nested([torch.ones(len(r), dtype=torch.long) for r in responses]), **fields,
        }, batch_size=[len(prompts)])
        tu.assign_non_tensor(data, use_remove_padding=False, use_dynamic_bsz=False, micro_batch_size_per_gpu=2,
                             use_fused_kernels=False, temperature=1.0, calculate_entropy=True,
                             global_batch_size=len(prompts), max_token_len_per_gpu=1024)
        return data

    options = {"gspo": gspo.Config(variant="token"), "aepo": aepo.Config(coef=0.3), "hapo": hapo.Config(adv_beta=0.8)}
    direct = {  # rlkit's functions called directly on one micro-batch at ratio 1, in the engine's float32
        "rlkit_ppo": lambda lp, adv, m, h: grpo.ppo_clip_loss(lp, lp, adv, m, clip_low=0.2, clip_high=0.28, clip_c=3.0),
        "rlkit_gspo": lambda lp, adv, m, h: gspo.gspo_loss(lp, lp, adv, m, clip_low=0.2, clip_high=0.28,
                                                           agg="token-mean", variant="token"),
        "rlkit_aepo": lambda lp, adv, m, h: aepo.aepo_loss(lp, lp, adv, m, entropy=h, coef=0.3, clip_c=3.0),
        "rlkit_hapo": lambda lp, adv, m, h: hapo.hapo_loss(lp, lp, adv, m, entropy=h, adv_beta=0.8, clip_c=3.0),
        "rlkit_cispo": lambda lp, adv, m, h: cispo.cispo_loss(lp, lp, adv, m, clip_low=0.2, clip_high=0.28),
    }
    report = {}
    for name, expected_fn in direct.items():
        with engine.eval_mode():  # verl's old-log-prob pass
            out = engine.infer_batch(batch())["model_output"]
        mask = batch()["response_mask"]
        old = response_from_nested(out["log_probs"], mask)
        entropy = response_from_nested(out["entropy"], mask)
        adv = nested([torch.full((len(r),), a) for r, a in zip(responses, advantages)])
        config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=2, clip_ratio_low=0.2,
                             clip_ratio_high=0.28, clip_ratio_c=3.0, policy_loss=PolicyLossConfig(loss_mode=name))
        before = [p.detach().clone() for p in engine.module.parameters()]
        with engine.train_mode():
            result = engine.train_batch(batch(old_log_probs=old, advantages=adv),
                                        loss_function=partial(actor_loss, config=config, options=options))
        moved = sum((p.detach() - b).abs().sum().item() for p, b in zip(engine.module.parameters(), before))
        expected, total = [], sum(len(r) for r in responses)
        old_p, ent_p, adv_p, m_p = (t.to_padded_tensor(0.0) for t in (old, entropy, adv, mask))
        for rows in (slice(0, 2), slice(2, 4)):  # verl's micro-batches of 2, in order
            m = m_p[rows].float()
            loss, _ = expected_fn(old_p[rows], adv_p[rows], m, ent_p[rows])
            expected.append(loss.item() * m.sum().item() / total)  # verl's global token-mean normalisation
        report[name] = {"loss": list(result["loss"]), "expected": expected, "moved": moved,
                        "grad_norm": float(result["metrics"]["grad_norm"]),
                        "metrics": sorted(result["metrics"])}
    json.dump(report, sys.stdout)
    dist.destroy_process_group()
    shutil.rmtree(model_dir)


if __name__ == "__main__":
    main()
