"""The tiny engine's tokenizer and model shape in Hugging Face form: what transformers, vLLM and verl load.

:func:`hf_tokenizer` turns :class:`~rlkit.tiny.tokenizer.CharTokenizer` into a ``PreTrainedTokenizerFast`` with the
same ids: one token per character (a BPE vocabulary of single characters and no merges, split by a per-character
pre-tokenizer), ``<pad>``/``<bos>``/``<eos>`` as special tokens and the tool tags ``<code>``, ``</code>``,
``<output>``, ``</output>`` as added tokens, each a single id. The tags are *not* special, as Qwen's
``<tool_call>`` is not: decoding with ``skip_special_tokens=True`` (verl's reward path) keeps them in the text.
Characters outside the alphabet are dropped, as the tiny tokenizer's ``errors="ignore"`` does. The chat template
is the tiny engine's prompt: ``<bos>`` then the messages' contents, nothing added for the reply.

:func:`llama_config` is the matching ``LlamaConfig`` (RMSNorm, rotate-half RoPE, no biases, tied embeddings);
:func:`save_random_model` writes a randomly initialised model of that shape with the tokenizer — the default
model of ``rlkit launch --device cpu`` (:mod:`rlkit.verl.launch`). transformers is imported only in these
functions.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from rlkit.tiny.tokenizer import BOS, EOS, PAD, CharTokenizer

CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
"""The tiny engine's prompt as a chat template: ``<bos>`` + the contents (arithmetic prompts end in a newline)."""


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


def llama_config(*, vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int | None = None,
                 d_ff: int, max_len: int, rope_base: float = 10000.0, norm_eps: float = 1e-5,
                 init_std: float = 0.02, tokenizer: CharTokenizer | None = None) -> Any:
    """A ``LlamaConfig`` of this shape (float32, tied embeddings, no biases; the tokenizer's special ids)."""
    from transformers import LlamaConfig

    ids = {}
    if tokenizer is not None:
        ids = {"pad_token_id": tokenizer.pad_id, "bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id}
    return LlamaConfig(vocab_size=vocab_size, hidden_size=d_model, intermediate_size=d_ff,
                       num_hidden_layers=n_layers, num_attention_heads=n_heads,
                       num_key_value_heads=n_kv_heads or n_heads, head_dim=d_model // n_heads,
                       max_position_embeddings=max_len, rms_norm_eps=norm_eps, rope_theta=rope_base,
                       initializer_range=init_std, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                       hidden_act="silu", torch_dtype="float32", **ids)


def save_pretrained(path: str | os.PathLike, model: Any, tokenizer: Any, record: dict | None = None) -> Path:
    """Write ``model``, ``tokenizer`` and ``record`` (as ``rlkit_model.json``: how the model was made) to ``path``
    atomically: into a temporary sibling, which then replaces ``path``."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if record is not None:
        (tmp / "rlkit_model.json").write_text(json.dumps(record, indent=2))
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
        os.replace(path, old / path.name)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    return path


def save_random_model(path: str | os.PathLike, tokenizer: CharTokenizer, *, d_model: int = 64, n_layers: int = 2,
                      n_heads: int = 2, d_ff: int = 128, max_len: int = 512, seed: int = 0) -> Path:
    """A randomly initialised Llama of the tiny engine's vocabulary (head size ``d_model / n_heads``), with
    :func:`hf_tokenizer`, in ``path``. Deterministic in ``seed``; ``rlkit_model.json`` records how it was made."""
    from transformers import LlamaForCausalLM

    config = llama_config(vocab_size=tokenizer.vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                          d_ff=d_ff, max_len=max_len, tokenizer=tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    record = {"kind": "random", "seed": seed, "d_model": d_model, "n_layers": n_layers, "n_heads": n_heads,
              "d_ff": d_ff, "max_len": max_len, "vocab_size": tokenizer.vocab_size}
    return save_pretrained(path, model, hf_tokenizer(tokenizer), record)


__all__ = ["CHAT_TEMPLATE", "hf_tokenizer", "llama_config", "save_pretrained", "save_random_model"]
