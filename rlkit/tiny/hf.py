"""The tiny engine's model and tokenizer in Hugging Face form: what transformers, vLLM and verl load.

:class:`~rlkit.tiny.model.TinyDecoder` is a ``LlamaForCausalLM``: :func:`export` renames its weights
(:func:`llama_state_dict`), same logits. :func:`hf_tokenizer` has the same ids; the tool tags are added tokens, not
special (as Qwen's ``<tool_call>``), so ``skip_special_tokens=True`` (verl's reward path) keeps them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from rlkit.files import EXPORT, claim_dir
from rlkit.models import write_model_dir
from rlkit.tasks.protocol import END_OUTPUT, OUTPUT
from rlkit.tiny.model import ModelConfig, TinyDecoder
from rlkit.tiny.tokenizer import BOS, EOS, PAD, CharTokenizer

CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'tool' %}"
                 + OUTPUT + "{{ message['content'] }}" + END_OUTPUT
                 + "{% else %}{{ message['content'] }}{% endif %}{% endfor %}")
"""The tiny engine's text as a chat template: ``<bos>``, then each message's content as it is — a tool's answer
inside ``<output>…</output>``, as the tiny sampler writes it — and nothing added for the reply."""

VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM's CPU attention accepts (``CPUAttentionBackend.get_supported_head_sizes`` in vLLM
0.32; a test keeps this equal to the installed vLLM's list)."""


def hf_tokenizer(tokenizer: CharTokenizer) -> Any:
    """``tokenizer`` as a ``transformers.PreTrainedTokenizerFast`` with identical ids (module doc)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: i for i, char in enumerate(tokenizer.itos)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    special = {PAD, BOS, EOS}
    core.add_tokens([AddedToken(s, special=s in special, normalized=False) for s in tokenizer.specials])
    core.add_special_tokens([s for s in tokenizer.specials if s in special])
    fast = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def llama_config(config: ModelConfig, tokenizer: CharTokenizer) -> Any:
    """The ``LlamaConfig`` of a :class:`~rlkit.tiny.model.ModelConfig` (float32; the tokenizer's special ids)."""
    from transformers import LlamaConfig

    if not config.tie_embeddings:
        raise ValueError("export writes tied embeddings (the tiny engine's default): tie_embeddings=False is not "
                         "supported")
    return LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.ffn,
                       num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
                       num_key_value_heads=config.kv_heads, head_dim=config.d_head,
                       max_position_embeddings=config.max_len, rms_norm_eps=config.norm_eps,
                       rope_theta=config.rope_base, initializer_range=config.init_std, tie_word_embeddings=True,
                       attention_bias=False, mlp_bias=False, hidden_act="silu", torch_dtype="float32",
                       pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.bos_id,
                       eos_token_id=tokenizer.eos_id)


def llama_state_dict(model: TinyDecoder) -> dict[str, torch.Tensor]:
    """``model``'s weights under Llama's names (``model.layers.{i}.self_attn.q_proj.weight``, ...)."""
    cfg = model.config
    q, kv = cfg.n_heads * cfg.d_head, cfg.kv_heads * cfg.d_head
    out = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm.weight}
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        wq, wk, wv = block.qkv.weight.split([q, kv, kv])
        gate, up = block.gate_up.weight.chunk(2)
        out.update({
            p + "input_layernorm.weight": block.attn_norm.weight,
            p + "self_attn.q_proj.weight": wq, p + "self_attn.k_proj.weight": wk, p + "self_attn.v_proj.weight": wv,
            p + "self_attn.o_proj.weight": block.proj.weight,
            p + "post_attention_layernorm.weight": block.mlp_norm.weight,
            p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight": block.down.weight,
        })
    return {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in out.items()}


def check_vllm_shape(config: ModelConfig) -> None:
    """Refuse a shape vLLM's CPU attention cannot serve, naming the sizes it takes."""
    if config.d_head not in VLLM_HEAD_SIZES:
        raise ValueError(f"head size {config.d_head} (d_model {config.d_model} / {config.n_heads} heads) is refused "
                         f"by vLLM's CPU attention, which takes {', '.join(map(str, VLLM_HEAD_SIZES))}: choose "
                         "d_model and n_heads whose quotient is one of them")


def export(model: TinyDecoder, tokenizer: CharTokenizer, path: str | os.PathLike, *, record: dict | None = None,
           check_vllm: bool = True, force: bool = False) -> Path:
    """Write ``model`` as a Llama model directory to ``path``, with ``record`` as ``rlkit_model.json``;
    ``check_vllm``: refuse head sizes vLLM's CPU attention cannot serve; ``force``: as :func:`rlkit.files.claim_dir`."""
    from transformers import LlamaForCausalLM

    if check_vllm:
        check_vllm_shape(model.config)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids, the model {model.config.vocab_size}")
    with torch.device("meta"):
        hf = LlamaForCausalLM(llama_config(model.config, tokenizer))
    hf.load_state_dict(llama_state_dict(model), strict=False, assign=True)
    hf.tie_weights()
    extra = {} if record is None else {"rlkit_model.json": json.dumps(record, indent=2, default=str)}
    return write_model_dir(path, EXPORT, hf, hf_tokenizer(tokenizer), extra, force=force, signature="rlkit_model.json")


def export_sft(path: str | os.PathLike, sft: Any, *, scale: str | None = None, sft_cache: str | os.PathLike | None = None,
               device: str = "cpu", progress: bool = True, force: bool = False) -> Path:
    """``rlkit export``: the SFT start of ``sft`` (an :class:`~rlkit.tiny.sft.SFTConfig`) as a model directory."""
    from dataclasses import asdict

    from rlkit.tiny.sft import warm_start

    check_vllm_shape(ModelConfig(vocab_size=1, d_model=sft.d_model, n_layers=sft.n_layers, n_heads=sft.n_heads,
                                 n_kv_heads=sft.n_kv_heads))  # before minutes of SFT
    claim_dir(path, EXPORT, force=force, signature="rlkit_model.json")  # so is a directory not rlkit's
    model, tokenizer, info = warm_start(sft, device=device, cache_dir=sft_cache, progress=progress)
    record = {"kind": "sft", "scale": scale, "sft_config": asdict(sft), "sft": info,
              "model_config": model.config.to_dict()}
    return export(model, tokenizer, path, record=record, force=force)


def save_random_model(path: str | os.PathLike, tokenizer: CharTokenizer, *, d_model: int = 64, n_layers: int = 2,
                      n_heads: int = 2, max_len: int = 512, seed: int = 0) -> Path:
    """An untrained, seeded :class:`~rlkit.tiny.model.TinyDecoder` exported to ``path``: CPU verl runs' default."""
    config = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                         max_len=max_len)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyDecoder(config)
    return export(model, tokenizer, path, record={"kind": "random", "seed": seed, "model_config": config.to_dict()},
                  check_vllm=False)
