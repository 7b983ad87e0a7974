"""A tiny decoder-only transformer with rotary positions and a preallocated KV cache.

Pre-norm blocks (RMSNorm → fused QKV attention with RoPE → residual; RMSNorm → GELU MLP → residual; exact
GELU, 4× faster than the tanh form on CPU), optional grouped-query attention (``n_kv_heads``), tied
input/output embeddings, :func:`torch.nn.functional.scaled_dot_product_attention`. RoPE is what lets a model this
small copy digits from the question (NOTES-tiny-engine.md: learned absolute positions stalled at 3.5%); the default
size (d=128, 4 layers, 4 heads, ≈ 0.8M parameters) is the one measured to learn the tool-form word problems.

Padding and positions. Batches are left-padded with an ``attention_mask`` (B, L), True = real token. A token's
position is the number of real tokens before it (:func:`positions_from_mask`), so a padded row computes exactly what
the same row alone would. Padding keys are masked out; every query may attend to itself, so an all-padding prefix
gives finite (ignored) outputs instead of NaN.

Incremental decoding. :meth:`TinyDecoder.new_cache` preallocates keys and values for ``(B, max_len)``; each
:meth:`TinyDecoder.forward` with ``kv_cache=`` writes its tokens at the cache's next columns and attends to all
earlier valid columns. Columns are shared by the batch (one column per step for every row), which is what the
left-padded layout needs. :func:`token_logprobs` recomputes the log-probs of sampled responses with gradient for RL.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlkit.core.entropy import entropy_from_logits


@dataclass
class ModelConfig:
    """Shape of :class:`TinyDecoder`."""

    vocab_size: int
    """Number of token ids (the tokenizer's ``vocab_size``)."""
    d_model: int = 128
    """Width of the residual stream."""
    n_layers: int = 4
    """Number of transformer blocks."""
    n_heads: int = 4
    """Attention (query) heads; ``d_model / n_heads`` must be even (RoPE rotates pairs)."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None = ``n_heads`` (plain multi-head, the measured default).
    1 (multi-query) cuts the KV cache — which sampling reads every step — by ``n_heads``×."""
    max_len: int = 512
    """Longest sequence (prompt + response) the rotary tables and caches cover."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of ``d_model``."""
    rope_base: float = 10000.0
    """RoPE frequency base θ: pair i of a head rotates by position · θ^(−2i/d_head)."""
    tie_embeddings: bool = True
    """Use the input embedding matrix as the output projection."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Std of the normal initialisation; residual output projections get ``init_std / sqrt(2·n_layers)``."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"d_model ({self.d_model}) must split into n_heads ({self.n_heads}) heads of even width (RoPE)"
            )
        if self.n_kv_heads is not None and (
            not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads
        ):
            raise ValueError(f"n_kv_heads ({self.n_kv_heads!r}) must divide n_heads ({self.n_heads})")
        if self.rope_base <= 1 or self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError("rope_base must be > 1, norm_eps and init_std > 0")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return cls(**d)


def positions_from_mask(attention_mask: Tensor, start: Tensor | int = 0) -> Tensor:
    """Position of each token = real tokens before it (+ ``start`` (B,) from earlier chunks); pads get a clamp."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0) + (
        start.unsqueeze(-1) if isinstance(start, Tensor) else start
    )


class KVCache:
    """Preallocated keys/values ``(n_layers, B, kv_heads, capacity, d_head)`` and which columns hold real tokens.

    ``length`` columns are filled (shared by all rows); ``n_tokens`` (B,) counts each row's real tokens, which is
    also the position of its next token.
    """

    def __init__(self, config: ModelConfig, batch_size: int, capacity: int, *, device: Any = None, dtype=None):
        if batch_size < 1 or capacity < 1:
            raise ValueError(f"batch_size and capacity must be ≥ 1, got {batch_size}, {capacity}")
        if capacity > config.max_len:
            raise ValueError(f"cache capacity {capacity} exceeds the model's max_len {config.max_len}")
        shape = (config.n_layers, batch_size, config.kv_heads, capacity, config.d_head)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.valid = torch.zeros(batch_size, capacity, dtype=torch.bool, device=device)
        self.n_tokens = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def select(self, rows: Tensor) -> None:
        """Keep only ``rows`` (a (B',) index tensor), in that order: drop finished sequences from the batch."""
        self.k = self.k.index_select(1, rows)
        self.v = self.v.index_select(1, rows)
        self.valid = self.valid.index_select(0, rows)
        self.n_tokens = self.n_tokens.index_select(0, rows)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the two halves of the last dim of ``x`` (…, d_head) by the angles whose cos/sin are given."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        d = config.d_model
        self.n_heads, self.n_kv, self.d_head = config.n_heads, config.kv_heads, config.d_head
        self.attn_norm = nn.RMSNorm(d, eps=config.norm_eps)
        self.qkv = nn.Linear(d, (self.n_heads + 2 * self.n_kv) * self.d_head, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.mlp_norm = nn.RMSNorm(d, eps=config.norm_eps)
        self.fc = nn.Linear(d, config.mlp_ratio * d, bias=False)
        self.out = nn.Linear(config.mlp_ratio * d, d, bias=False)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | None,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> Tensor:
        B, L, d = x.shape
        H, Hkv, dh = self.n_heads, self.n_kv, self.d_head
        qkv = self.qkv(self.attn_norm(x))  # (B, L, (H + 2·Hkv)·dh)
        qk = _rope(qkv[..., : (H + Hkv) * dh].view(B, L, H + Hkv, dh), cos, sin)  # RoPE on q and k in one pass
        q = qk[:, :, :H].transpose(1, 2)  # (B, H, L, dh)
        k = qk[:, :, H:].transpose(1, 2)  # (B, Hkv, L, dh)
        v = qkv[..., (H + Hkv) * dh :].view(B, L, Hkv, dh).transpose(1, 2)
        if cache is not None:
            s, e = cache.length, cache.length + L
            cache.k[layer, :, :, s:e] = k
            cache.v[layer, :, :, s:e] = v
            k, v = cache.k[layer, :, :, :e], cache.v[layer, :, :, :e]
        if cache is not None and L == 1:
            y = _decode_attention(q, k, v, mask)
        elif mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=L > 1, enable_gqa=Hkv != H)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=Hkv != H)
        x = x + self.proj(y.transpose(1, 2).reshape(B, L, d))
        return x + self.out(F.gelu(self.fc(self.mlp_norm(x))))


def _decode_attention(q: Tensor, k: Tensor, v: Tensor, masked: Tensor) -> Tensor:
    """One query per row against the cache: q (B, H, 1, dh), k/v (B, Hkv, n, dh), ``masked`` (B, 1, 1, n) True =
    padding. Plain matmuls: for a single query they beat the fused SDPA kernel on CPU, and the query heads that
    share a key/value head become the rows of one product."""
    B, H, _, dh = q.shape
    Hkv = k.shape[1]
    qg = q.reshape(B, Hkv, H // Hkv, dh) * dh**-0.5
    scores = torch.matmul(qg, k.transpose(-1, -2)).masked_fill_(masked, float("-inf"))  # (B, Hkv, g, n)
    return torch.matmul(scores.softmax(-1), v).reshape(B, H, 1, dh)


class TinyDecoder(nn.Module):
    """Decoder-only transformer; ``forward(ids) -> logits (B, L, vocab_size)`` (see the module doc)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        half = config.d_head // 2
        inv_freq = config.rope_base ** (-torch.arange(half, dtype=torch.float64) / half)
        angles = torch.arange(config.max_len, dtype=torch.float64)[:, None] * inv_freq  # (max_len, d_head/2)
        self.register_buffer("rope_cos", angles.cos().float(), persistent=False)
        self.register_buffer("rope_sin", angles.sin().float(), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.blocks:  # residual branches start small (GPT-2 scaling)
            nn.init.normal_(block.proj.weight, std=std / math.sqrt(2 * self.config.n_layers))
            nn.init.normal_(block.out.weight, std=std / math.sqrt(2 * self.config.n_layers))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch_size: int, capacity: int | None = None) -> KVCache:
        """An empty KV cache for ``batch_size`` rows and ``capacity`` tokens (default: ``max_len``)."""
        p = self.embed.weight
        return KVCache(self.config, batch_size, capacity or self.config.max_len, device=p.device, dtype=p.dtype)

    def forward(
        self,
        ids: Tensor,
        *,
        positions: Tensor | None = None,
        attention_mask: Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> Tensor:
        """Logits ``(B, L, vocab_size)`` for ``ids`` ``(B, L)``.

        ``attention_mask`` (B, L), True/1 = real token (None: all real); ``positions`` (B, L) default from the mask
        (plus the tokens already in ``kv_cache``). With ``kv_cache`` the tokens are appended to the cache and
        attend to everything before them; without it, a causal mask over ``ids``.
        """
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, L), got shape {tuple(ids.shape)}")
        B, L = ids.shape
        start = 0 if kv_cache is None else kv_cache.length
        if kv_cache is not None:
            if kv_cache.batch_size != B:
                raise ValueError(f"kv_cache holds {kv_cache.batch_size} rows, ids has {B}")
            if start + L > kv_cache.capacity:
                raise ValueError(f"kv_cache capacity {kv_cache.capacity} < {start + L} tokens")
        elif L > self.config.max_len:
            raise ValueError(f"sequence length {L} exceeds max_len {self.config.max_len}")
        if attention_mask is not None:
            if attention_mask.shape != ids.shape:
                raise ValueError(f"attention_mask {tuple(attention_mask.shape)} != ids {tuple(ids.shape)}")
            attention_mask = attention_mask.bool()
        if positions is None:
            if attention_mask is None:
                offset = 0 if kv_cache is None else kv_cache.n_tokens.unsqueeze(-1)
                positions = torch.arange(L, device=ids.device).expand(B, L) + offset
            else:
                positions = positions_from_mask(attention_mask, 0 if kv_cache is None else kv_cache.n_tokens)
        cos = self.rope_cos[positions].unsqueeze(2)  # (B, L, 1, d_head/2): broadcast over heads
        sin = self.rope_sin[positions].unsqueeze(2)

        if kv_cache is None:
            # all-real rows: the fused causal kernel, no mask tensor
            padded = attention_mask is not None and not bool(attention_mask.all())
            mask = _pad_causal_mask(attention_mask, 0) if padded else None
        else:
            kv_cache.valid[:, start : start + L] = True if attention_mask is None else attention_mask
            kv_cache.n_tokens += L if attention_mask is None else attention_mask.sum(-1)
            valid = kv_cache.valid[:, : start + L]
            if L == 1:  # the decode path takes the complement: True = masked out
                mask = ~valid[:, None, None, :]
                if attention_mask is not None:
                    mask[..., -1] = False  # a padding query still sees itself (finite, ignored output)
            else:
                mask = _pad_causal_mask(valid, start)

        x = self.embed(ids)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, mask, kv_cache, i)
        if kv_cache is not None:
            kv_cache.length = start + L
        x = self.norm(x)
        return F.linear(x, self.embed.weight if self.head is None else self.head.weight)


def _pad_causal_mask(key_valid: Tensor, start: int) -> Tensor:
    """Boolean mask (B, 1, L, start+L): query i (column start+i) sees valid keys ≤ its column, and itself."""
    B, n_keys = key_valid.shape
    L = n_keys - start
    cols = torch.arange(n_keys, device=key_valid.device)
    query_cols = torch.arange(start, n_keys, device=key_valid.device)[:, None]  # (L, 1)
    causal = cols[None, :] <= query_cols  # (L, n_keys)
    own = cols[None, :] == query_cols
    return ((key_valid[:, None, :] & causal) | own).unsqueeze(1)


def token_logprobs(
    model: TinyDecoder,
    ids: Tensor,
    attention_mask: Tensor,
    response_start: int,
    *,
    temperature: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """Log-probs and entropies of the response tokens under ``model``, with gradient → ``(logp, entropy)`` (B, T).

    ``ids`` (B, L) are prompt + response (left-padded prompts, right-padded responses; see
    :meth:`rlkit.tiny.sampler.Rollout.sequences`), ``attention_mask`` (B, L) marks real tokens, and the response
    is ``ids[:, response_start:]`` (T = L − response_start). ``logp`` is under softmax(logits / temperature) —
    a float or a per-token (B, T) tensor such as the rollout's ``temperature`` — so it matches the sampler's logp;
    ``entropy`` is of the untempered distribution (:func:`rlkit.core.entropy.entropy_from_logits`).
    Padding positions get values too: mask them in the loss.
    """
    if ids.dim() != 2 or attention_mask.shape != ids.shape:
        raise ValueError(
            f"ids and attention_mask must both be (B, L), got {tuple(ids.shape)}, {tuple(attention_mask.shape)}"
        )
    B, L = ids.shape
    if not 1 <= response_start < L:
        raise ValueError(f"response_start must lie in [1, {L}) (the prompt needs ≥ 1 token), got {response_start}")
    T = L - response_start
    logits = model(ids[:, :-1], attention_mask=attention_mask[:, :-1])[:, response_start - 1 :]  # (B, T, V)
    if isinstance(temperature, Tensor):
        if temperature.shape not in ((B, T), (B, 1), (B,), ()):
            raise ValueError(f"temperature must be a float or a {(B, T)} tensor, got {tuple(temperature.shape)}")
        t = temperature.reshape(B, -1) if temperature.dim() else temperature.reshape(1, 1)
        tempered = logits.float() / t.to(logits.device, torch.float32).unsqueeze(-1)
    else:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        tempered = logits.float() if temperature == 1.0 else logits.float() / temperature
    logp = tempered.log_softmax(-1).gather(-1, ids[:, response_start:].unsqueeze(-1)).squeeze(-1)
    return logp, entropy_from_logits(logits)
