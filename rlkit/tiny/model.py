"""A tiny decoder-only transformer with rotary positions and a KV cache for batched sampling.

Exactly Hugging Face's ``LlamaForCausalLM`` (pre-norm RMSNorm, fused QKV attention with rotate-half RoPE, gated
SiLU MLP, optional GQA, tied embeddings, no biases), so :mod:`rlkit.tiny.hf` exports it with the same logits. RoPE
lets a model this small copy digits from the question (learned absolute positions stalled at 3.5% accuracy).

Batches are left-padded with an ``attention_mask`` (True = real token); a token's position counts the real tokens
before it (:func:`positions_from_mask`), so a padded row computes what it would alone, and every query sees itself
(an all-padding prefix gives finite, ignored outputs).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
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
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4  # Attention (query) heads; ``d_model / n_heads`` must be even (RoPE rotates pairs).
    n_kv_heads: int | None = None  # Key/value heads (grouped-query attention); None = ``n_heads``.
    max_len: int = 512  # Longest sequence (prompt + response) the rotary tables and caches cover.
    d_ff: int | None = None  # Width of the gated MLP; None: ⌈8·d_model/3⌉ rounded up to a multiple of 8.
    rope_base: float = 10000.0  # RoPE frequency base θ: pair i of a head rotates by position · θ^(−2i/d_head).
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    init_std: float = 0.02  # Std of the normal init; residual output projections get init_std / sqrt(2·n_layers).

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_ff is not None and (not isinstance(self.d_ff, int) or self.d_ff < 1):
            raise ValueError(f"d_ff must be a positive int or None, got {self.d_ff!r}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model ({self.d_model}) must split into n_heads ({self.n_heads}) heads of even width "
                             "(RoPE)")
        if self.n_kv_heads is not None and (not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1
                                            or self.n_heads % self.n_kv_heads):
            raise ValueError(f"n_kv_heads ({self.n_kv_heads!r}) must divide n_heads ({self.n_heads})")
        if self.rope_base <= 1 or self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError("rope_base must be > 1, norm_eps and init_std > 0")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        return -(-math.ceil(8 * self.d_model / 3) // 8) * 8  # 128 → 344

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return cls(**d)


ARCHITECTURE = "llama"
"""The block's form (part of the SFT cache key: a checkpoint of another form is never loaded into this one)."""

PREFILL_CHUNK_TOKENS = 2048
"""Tokens per row chunk of a prefill: measured 1.2–1.5× faster than one chunk for 128 prompts × 97 tokens (CPU)."""


def positions_from_mask(attention_mask: Tensor, start: Tensor | int = 0) -> Tensor:
    """Position of each token = real tokens before it (+ ``start`` (B,) from earlier chunks); pads get a clamp."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0) + (start.unsqueeze(-1) if isinstance(start, Tensor)
                                                                   else start)


class KVCache:
    """Keys/values of a batch in two parts, laid out so that every decode step reads them in long contiguous runs:
    ``prefix`` ``(U, kv_heads, P, d_head)`` per layer, the U prompts' keys, which rows point into (``prompt_of``; a
    prompt's rows query it in one product; ``regular``: as GRPO lays them out), and ``tail`` ``(n_layers, B,
    kv_heads, C, d_head)``, each row's appended tokens (``tail_len`` of C columns filled), grown ``GROW`` columns at
    a time (one buffer of the full capacity read ~3× slower) and read whole, masked (narrower products fall off
    torch's BLAS path). ``n_tokens`` (B,): each row's real tokens, the position of its next one.
    """

    GROW = 16

    def __init__(self, config: ModelConfig, batch_size: int, capacity: int, *, device: Any = None, dtype=None):
        if batch_size < 1 or capacity < 1:
            raise ValueError(f"batch_size and capacity must be ≥ 1, got {batch_size}, {capacity}")
        if capacity > config.max_len:
            raise ValueError(f"cache capacity {capacity} exceeds the model's max_len {config.max_len}")
        self.capacity = capacity
        self.prefix_k: list[Tensor] = []
        self.prefix_v: list[Tensor] = []
        self.prefix_pad = torch.zeros(batch_size, 1, 1, 0, dtype=torch.bool, device=device)  # (U, 1, 1, P) True = pad
        self.padded = False
        self._filled: list[int] = []  # per layer, prefix rows the prefill has written
        shape = (config.n_layers, batch_size, config.kv_heads, 0, config.d_head)
        self.tail_k = torch.zeros(shape, device=device, dtype=dtype)
        self.tail_v = torch.zeros(shape, device=device, dtype=dtype)
        self.tail_len = 0
        self._future: dict[tuple[int, ...], Tensor] = {}  # (r, L, rows, C) -> tail columns a query must not see
        self.prompt_of = torch.arange(batch_size, device=device)  # (B,) row -> its prompt in the prefix
        self.slots = 1  # S: most rows one prompt serves
        self.flat = self.prompt_of  # (B,) row -> its place prompt·S + slot in the grouped layout (U·S rows)
        self.shared = False
        self.regular = True
        self.n_tokens = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.prompt_of.shape[0]

    @property
    def prefilled(self) -> bool:
        return self.length > 0

    def store_prefix(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Copy one layer's prefill keys/values ``(rows, kv_heads, P, d_head)``, a row chunk, into the prefix."""
        if layer == len(self.prefix_k):
            shape = (self.batch_size, *k.shape[1:])
            self.prefix_k.append(k.new_empty(shape))
            self.prefix_v.append(v.new_empty(shape))
            self._filled.append(0)
        r, n = self._filled[layer], k.shape[0]
        self.prefix_k[layer][r : r + n] = k
        self.prefix_v[layer][r : r + n] = v
        self._filled[layer] = r + n

    def finish_prefill(self, real: Tensor) -> None:
        """After the prefill's last chunk: ``real`` (U, P) marks the prompts' real tokens."""
        self.prefix_pad = ~real[:, None, None, :]
        self.padded = not bool(real.all())  # else the decode steps skip the padding mask
        self.n_tokens = real.sum(-1)

    def select(self, rows: Tensor) -> None:
        """Make row i continue what row ``rows[i]`` held: repeat rows or drop finished ones (and unread prompts)."""
        self.n_tokens = self.n_tokens.index_select(0, rows)
        self.tail_k, self.tail_v = self.tail_k.index_select(1, rows), self.tail_v.index_select(1, rows)
        used, prompt_of = torch.unique(self.prompt_of.index_select(0, rows), return_inverse=True)
        if len(rows) == len(used):  # one row per prompt: keep the prefix in row order, no grouping needed
            used, prompt_of = used[prompt_of], torch.arange(len(rows), device=rows.device)
        identity = torch.equal(used, torch.arange(len(used), device=used.device))
        if len(used) != self.prefix_pad.shape[0] or not identity:
            self.prefix_k = [x.index_select(0, used) for x in self.prefix_k]
            self.prefix_v = [x.index_select(0, used) for x in self.prefix_v]
            self.prefix_pad = self.prefix_pad.index_select(0, used)
            self.padded = bool(self.prefix_pad.any())
        self.prompt_of, self.shared = prompt_of, len(rows) > len(used)
        same = prompt_of.unsqueeze(0) == prompt_of.unsqueeze(1)  # (B, B)
        slot = same.tril(-1).sum(1)  # earlier rows with the same prompt
        self.slots = int(slot.max()) + 1
        self.flat = prompt_of * self.slots + slot
        in_order = bool((self.flat == torch.arange(len(rows), device=rows.device)).all())
        self.regular = len(rows) == len(used) * self.slots and in_order

    def make_room(self, n: int) -> None:
        """Before appending ``n`` tokens: widen a full tail by ``GROW`` columns (or by what a longer chunk needs)."""
        n_layers, B, Hkv, C, dh = self.tail_k.shape
        if self.tail_len + n <= C:
            return
        zeros = self.tail_k.new_zeros(n_layers, B, Hkv, self.tail_len + max(n, self.GROW) - C, dh)
        self.tail_k, self.tail_v = torch.cat((self.tail_k, zeros), 3), torch.cat((self.tail_v, zeros), 3)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Append ``k``/``v`` (B, kv_heads, L, d_head) and attend (after :meth:`make_room`): q (B, H, L, d_head)."""
        B, H, L, dh = q.shape
        Hkv = k.shape[1]
        r = self.tail_len + L
        self.tail_k[layer, :, :, r - L : r] = k
        self.tail_v[layer, :, :, r - L : r] = v
        gl = (H // Hkv) * L  # query rows per key head: the heads sharing it (GQA) × the chunk's tokens
        q = q.reshape(B, Hkv, gl, dh) * dh**-0.5
        kp, vp = self.prefix_k[layer], self.prefix_v[layer]
        U, P = kp.shape[0], kp.shape[2]
        if self.shared:  # one (S·gl, P) product per prompt: queries to the grouped layout (U, Hkv, S·gl, dh)
            scores_p = torch.matmul(self._to_groups(q, U), kp.transpose(-1, -2))  # (U, Hkv, S·gl, P)
        else:
            scores_p = torch.matmul(q, kp.transpose(-1, -2))  # (B, Hkv, gl, P)
        if self.padded:
            scores_p.masked_fill_(self.prefix_pad, float("-inf"))
        if self.shared:
            scores_p = self._from_groups(scores_p)
        scores_t = torch.matmul(q, self.tail_k[layer].transpose(-1, -2))  # (B, Hkv, gl, C)
        scores_t.masked_fill_(self._future_mask(r, L, gl, q.device), float("-inf"))
        probs = torch.cat((scores_p, scores_t), dim=-1).softmax(-1)
        out = torch.matmul(probs[..., P:], self.tail_v[layer])
        if self.shared:
            out += self._from_groups(torch.matmul(self._to_groups(probs[..., :P], U), vp))
        else:
            out += torch.matmul(probs[..., :P], vp)
        return out.view(B, H, L, dh)

    def _to_groups(self, x: Tensor, U: int) -> Tensor:
        """(B, Hkv, gl, n) rows → (U, Hkv, S·gl, n): each prompt's rows stacked (absent slots zero)."""
        B, Hkv, gl, n = x.shape
        if not self.regular:
            x = x.new_zeros(U * self.slots, Hkv, gl, n).index_copy_(0, self.flat, x)
        return x.reshape(U, self.slots, Hkv, gl * n).transpose(1, 2).reshape(U, Hkv, self.slots * gl, n)

    def _from_groups(self, x: Tensor) -> Tensor:
        """Inverse of :meth:`_to_groups`: (U, Hkv, S·gl, n) → (B, Hkv, gl, n)."""
        U, Hkv, sgl, n = x.shape
        x = x.view(U, Hkv, self.slots, sgl // self.slots, n).transpose(1, 2).reshape(U * self.slots, Hkv, -1, n)
        return x if self.regular else x.index_select(0, self.flat)

    def _future_mask(self, r: int, L: int, rows: int, device) -> Tensor:
        """(rows, C) True where tail column c is hidden from query row i (token i % L, at column r − L + i % L)."""
        key = (r, L, rows, self.tail_k.shape[3])
        if key not in self._future:
            own_col = r - L + torch.arange(rows, device=device) % L
            self._future[key] = torch.arange(self.tail_k.shape[3], device=device) > own_col[:, None]
        return self._future[key]


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the halves' pairs of ``x``: ``x·cos + (x2, x1)·sin``, tables ``(cos θ, cos θ)``, ``(−sin θ, sin θ)``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin)


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
        self.gate_up = nn.Linear(d, 2 * config.ffn, bias=False)  # Llama's gate_proj and up_proj, fused
        self.down = nn.Linear(config.ffn, d, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: KVCache | None = None,
                layer: int = 0, last_only: bool = False) -> Tensor:
        """``last_only``: the last position only (B, 1, d); the keys/values of all positions are still made."""
        L = x.shape[1]
        q, k, v = self._qkv(x, cos, sin)
        if cache is not None and cache.prefilled:
            y = cache.attend(layer, q, k, v)
        else:
            if cache is not None:  # the prefill: attend as without a cache, keep the keys/values as the prefix
                cache.store_prefix(layer, k, v)
            if last_only and L > 1:  # the last query sees every key: no causal mask, padding only
                q, x, L = q[:, :, -1:], x[:, -1:], 1
                mask = None if mask is None else mask[:, :, -1:]
            y = self._attend(q, k, v, mask)
        return self._out(x, y)

    def forward_shared(self, xp: Tensor, xs: Tensor, rope_p: tuple[Tensor, Tensor], rope_s: tuple[Tensor, Tensor],
                       mask_p: Tensor | None, mask_s: Tensor, prompt_of: Tensor, last: bool) -> tuple[Tensor, Tensor]:
        """One block over U prefixes ``xp`` (U, P, d) and the B rows ``xs`` (B, S, d) continuing them; ``mask_s``
        (B, 1, S, P + S): the keys each row sees; ``last``: only the prefixes' keys/values are made."""
        qp, kp, vp = self._qkv(xp, *rope_p)
        qs, ks, vs = self._qkv(xs, *rope_s)
        k = torch.cat((kp.index_select(0, prompt_of), ks), 2)  # (B, Hkv, P + S, dh)
        v = torch.cat((vp.index_select(0, prompt_of), vs), 2)
        xs = self._out(xs, self._attend(qs, k, v, mask_s))
        return (xp if last else self._out(xp, self._attend(qp, kp, vp, mask_p))), xs

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, L, dh), RoPE'd keys and values (B, kv_heads, L, dh) of ``x`` (B, L, d)."""
        B, L, _ = x.shape
        H, Hkv, dh = self.n_heads, self.n_kv, self.d_head
        qkv = self.qkv(self.attn_norm(x))  # (B, L, (H + 2·Hkv)·dh)
        qk = _rope(qkv[..., : (H + Hkv) * dh].view(B, L, H + Hkv, dh), cos, sin)  # RoPE on q and k in one pass
        v = qkv[..., (H + Hkv) * dh :].view(B, L, Hkv, dh).transpose(1, 2)
        return qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2), v

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Attention of q (B, H, L, dh) over k/v (B, kv_heads, K, dh): causal without ``mask`` (K = L)."""
        gqa = self.n_kv != self.n_heads
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

    def _out(self, x: Tensor, y: Tensor) -> Tensor:
        """Residual stream after the attention output ``y`` (B, H, L, dh) and the MLP, adds fused (addmm)."""
        B, L, d = x.shape
        x = torch.addmm(x.reshape(B * L, d), y.transpose(1, 2).reshape(B * L, d), self.proj.weight.t())
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        x = torch.addmm(x, F.silu(gate) * up, self.down.weight.t())  # down(silu(gate(x)) · up(x))
        return x.view(B, L, d)


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
        cos, sin = angles.cos().float(), angles.sin().float()  # (max_len, d_head): the two halves, see _rope
        self.register_buffer("rope_cos", torch.cat((cos, cos), -1), persistent=False)
        self.register_buffer("rope_sin", torch.cat((-sin, sin), -1), persistent=False)
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
            nn.init.normal_(block.down.weight, std=std / math.sqrt(2 * self.config.n_layers))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch_size: int, capacity: int | None = None) -> KVCache:
        """An empty KV cache for ``batch_size`` rows and ``capacity`` tokens (default: ``max_len``)."""
        p = self.embed.weight
        return KVCache(self.config, batch_size, capacity or self.config.max_len, device=p.device, dtype=p.dtype)

    def forward(self, ids: Tensor, *, positions: Tensor | None = None, attention_mask: Tensor | None = None,
                kv_cache: KVCache | None = None, last_only: bool = False) -> Tensor:
        """Logits ``(B, L, vocab_size)`` for ``ids`` ``(B, L)`` (``last_only``: ``(B, 1, V)``); with ``kv_cache``, the
        first call is the prefill and later calls append real tokens (positions from the mask and the cache)."""
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, L), got shape {tuple(ids.shape)}")
        B, L = ids.shape
        appending = kv_cache is not None and kv_cache.prefilled
        if kv_cache is not None:
            if kv_cache.batch_size != B:
                raise ValueError(f"kv_cache holds {kv_cache.batch_size} rows, ids has {B}")
            if kv_cache.length + L > kv_cache.capacity:
                raise ValueError(f"kv_cache capacity {kv_cache.capacity} < {kv_cache.length + L} tokens")
        elif L > self.config.max_len:
            raise ValueError(f"sequence length {L} exceeds max_len {self.config.max_len}")
        if attention_mask is not None:
            if attention_mask.shape != ids.shape:
                raise ValueError(f"attention_mask {tuple(attention_mask.shape)} != ids {tuple(ids.shape)}")
            attention_mask = attention_mask.bool()
            if appending:
                if not bool(attention_mask.all()):
                    raise ValueError("after the prefill, cached tokens must all be real (pad in the prefill only)")
                attention_mask = None
        if positions is None:
            if appending:
                positions = kv_cache.n_tokens.unsqueeze(-1) + torch.arange(L, device=ids.device)
            elif attention_mask is None:
                positions = torch.arange(L, device=ids.device).expand(B, L)
            else:
                positions = positions_from_mask(attention_mask)
        cos = self.rope_cos[positions].unsqueeze(2)  # (B, L, 1, d_head): broadcast over heads
        sin = self.rope_sin[positions].unsqueeze(2)
        padded = attention_mask is not None and not bool(attention_mask.all())
        mask = _pad_causal_mask(attention_mask) if padded else None

        x = self.embed(ids)
        if kv_cache is None or appending:
            if appending:
                kv_cache.make_room(L)
            x = self._blocks(x, cos, sin, mask, kv_cache, last_only)
        else:  # the prefill, in row chunks: one chunk's activations stay in the CPU's caches, a whole batch's do not
            rows = max(1, PREFILL_CHUNK_TOKENS // L)
            x = torch.cat([
                self._blocks(x[r : r + rows], cos[r : r + rows], sin[r : r + rows],
                             None if mask is None else mask[r : r + rows], kv_cache, last_only)
                for r in range(0, B, rows)
            ])
        if kv_cache is not None:
            if appending:
                kv_cache.n_tokens += L
                kv_cache.tail_len += L
            else:
                real = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask
                kv_cache.finish_prefill(real)
            kv_cache.length += L
        x = self.norm(x)
        return F.linear(x, self.embed.weight if self.head is None else self.head.weight)

    def forward_after_prefixes(self, prefix_ids: Tensor, prefix_mask: Tensor, prompt_of: Tensor, ids: Tensor) -> Tensor:
        """Logits ``(B, S, vocab_size)`` of ``ids``, row i continuing prefix ``prompt_of[i]`` of ``prefix_ids``:
        the whole rows' logits up to float rounding, each prefix run once (a GRPO group's G responses share it)."""
        if prefix_ids.dim() != 2 or prefix_mask.shape != prefix_ids.shape or ids.dim() != 2:
            raise ValueError(f"prefix_ids/prefix_mask must be (U, P) and ids (B, S), got {tuple(prefix_ids.shape)}, "
                             f"{tuple(prefix_mask.shape)}, {tuple(ids.shape)}")
        if prompt_of.shape != ids.shape[:1]:
            raise ValueError(f"prompt_of must be ({ids.shape[0]},), got {tuple(prompt_of.shape)}")
        P, (B, S) = prefix_ids.shape[1], ids.shape
        if P + S > self.config.max_len:
            raise ValueError(f"sequence length {P + S} exceeds max_len {self.config.max_len}")
        prefix_mask = prefix_mask.bool()
        pos_p = positions_from_mask(prefix_mask)
        pos_s = prefix_mask.sum(-1).index_select(0, prompt_of)[:, None] + torch.arange(S, device=ids.device)
        rope_p = self.rope_cos[pos_p].unsqueeze(2), self.rope_sin[pos_p].unsqueeze(2)
        rope_s = self.rope_cos[pos_s].unsqueeze(2), self.rope_sin[pos_s].unsqueeze(2)
        mask_p = None if bool(prefix_mask.all()) else _pad_causal_mask(prefix_mask)
        own = torch.ones(S, S, dtype=torch.bool, device=ids.device).tril()  # a row's own tokens, causally
        mask_s = torch.cat((prefix_mask.index_select(0, prompt_of)[:, None, :].expand(B, S, P), own.expand(B, S, S)),
                           -1).unsqueeze(1)  # (B, 1, S, P + S)
        xp, xs = self.embed(prefix_ids), self.embed(ids)
        for i, block in enumerate(self.blocks):
            xp, xs = block.forward_shared(xp, xs, rope_p, rope_s, mask_p, mask_s, prompt_of,
                                          last=i == len(self.blocks) - 1)
        return F.linear(self.norm(xs), self.embed.weight if self.head is None else self.head.weight)

    def _blocks(self, x, cos, sin, mask, kv_cache, last_only) -> Tensor:
        """The blocks; with ``last_only`` the final block computes the last position alone (≈ 19% of a prefill)."""
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, mask, kv_cache, i, last_only=last_only and i == len(self.blocks) - 1)
        return x[:, -1:] if last_only else x


def _pad_causal_mask(key_valid: Tensor) -> Tensor:
    """Boolean mask (B, 1, L, L): query i sees valid keys ≤ i, and itself."""
    idx = torch.arange(key_valid.shape[1], device=key_valid.device)
    causal = idx[None, :] <= idx[:, None]  # (L, L)
    own = idx[None, :] == idx[:, None]
    return ((key_valid[:, None, :] & causal) | own).unsqueeze(1)


def token_logprobs(model: TinyDecoder, ids: Tensor, attention_mask: Tensor, response_start: int, *,
                   temperature: float | Tensor = 1.0, rows_per_chunk: int = 8, share_prompts: bool = True,
                   frozen: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Log-probs and entropies ``(B, T)`` of the response tokens ``ids[:, response_start:]`` under ``model``, with
    gradient (arguments as :meth:`rlkit.tiny.sampler.Rollout.sequences` gives them); 0 past a response's end.

    ``logp`` is under softmax(logits / ``temperature``), a float or (B, T), as the sampler's; ``entropy`` untempered.
    Rows of similar length run in chunks of ``rows_per_chunk`` without the padding they do not need, with
    ``share_prompts`` a chunk's rows of one prompt run it once, and a chunk of ``frozen`` rows runs without autograd.
    """
    if ids.dim() != 2 or attention_mask.shape != ids.shape:
        raise ValueError(f"ids and attention_mask must both be (B, L), got {tuple(ids.shape)}, "
                         f"{tuple(attention_mask.shape)}")
    B, L = ids.shape
    if not 1 <= response_start < L:
        raise ValueError(f"response_start must lie in [1, {L}) (the prompt needs ≥ 1 token), got {response_start}")
    T = L - response_start
    if isinstance(temperature, Tensor):
        if temperature.shape not in ((B, T), (B, 1), (B,), ()):
            raise ValueError(f"temperature must be a float or a {(B, T)} tensor, got {tuple(temperature.shape)}")
        temperature = temperature.to(ids.device, torch.float32).reshape(B, -1) if temperature.dim() else \
            temperature.to(ids.device, torch.float32).reshape(1, 1).expand(B, 1)
    elif temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    mask = attention_mask.bool()
    prompt_len, response_len = mask[:, :response_start].sum(-1), mask[:, response_start:].sum(-1)
    prompt_cols = ids[:, :response_start].masked_fill(~mask[:, :response_start], -1)
    prompt_id = torch.unique(prompt_cols, dim=0, return_inverse=True)[1]  # (B,) same id = same prompt
    order = torch.argsort((prompt_len * B + prompt_id) * (T + 1) + response_len, stable=True)
    logp = ids.new_zeros((B, T), dtype=torch.float32)
    entropy = ids.new_zeros((B, T), dtype=torch.float32)
    for rows in _chunks(order, prompt_id, rows_per_chunk):
        with torch.no_grad() if frozen is not None and bool(frozen[rows].all()) else nullcontext():
            chunk_logp, chunk_entropy, t = _chunk_logprobs(model, ids, mask, rows, prompt_id, prompt_len,
                                                           response_len, response_start, temperature, share_prompts)
        real = mask[rows, response_start : response_start + t]
        logp[rows, :t] = torch.where(real, chunk_logp, 0.0)
        entropy[rows, :t] = torch.where(real, chunk_entropy, 0.0)
    return logp, entropy


def _chunk_logprobs(model: TinyDecoder, ids: Tensor, mask: Tensor, rows: Tensor, prompt_id: Tensor,
                    prompt_len: Tensor, response_len: Tensor, response_start: int, temperature: float | Tensor,
                    share_prompts: bool) -> tuple[Tensor, Tensor, int]:
    """One chunk of :func:`token_logprobs`: ``(logp, entropy, t)`` of ``rows``' first ``t`` (their longest) tokens."""
    first = response_start - int(prompt_len[rows].max().clamp(min=1))
    t = max(1, int(response_len[rows].max()))
    temps = temperature[rows, :t] if isinstance(temperature, Tensor) and temperature.shape[1] > 1 else \
        temperature[rows] if isinstance(temperature, Tensor) else temperature
    prompts, prompt_of = torch.unique_consecutive(prompt_id[rows], return_inverse=True)
    if share_prompts and len(prompts) < len(rows) and first < response_start - 1:
        head = rows[torch.searchsorted(prompt_of, torch.arange(len(prompts), device=rows.device))]
        logits = model.forward_after_prefixes(ids[head, first : response_start - 1],
                                              mask[head, first : response_start - 1], prompt_of,
                                              ids[rows, response_start - 1 : response_start + t - 1])
    else:
        logits = model(ids[rows, first : response_start + t - 1],
                       attention_mask=mask[rows, first : response_start + t - 1])[:, response_start - 1 - first :]
    return (*_logp_and_entropy(logits, ids[rows, response_start : response_start + t], temps), t)


def _chunks(order: Tensor, prompt_id: Tensor, rows_per_chunk: int) -> list[Tensor]:
    """``order`` (a prompt's rows adjacent) cut into chunks of ≤ ``rows_per_chunk`` rows, at prompt bounds."""
    ids = prompt_id[order].tolist()
    chunks, begin = [], 0
    for i in range(1, len(ids) + 1):
        full = i - begin == rows_per_chunk
        if i == len(ids) or full or (ids[i] != ids[i - 1] and _rows_of(ids, i) + i - begin > rows_per_chunk):
            chunks.append(order[begin:i])
            begin = i
    return chunks


def _rows_of(ids: list[int], i: int) -> int:
    """How many rows from ``i`` on answer the prompt of row ``i``."""
    n = i
    while n < len(ids) and ids[n] == ids[i]:
        n += 1
    return n - i


def _logp_and_entropy(logits: Tensor, targets: Tensor, temperature: float | Tensor) -> tuple[Tensor, Tensor]:
    """log softmax(logits / temperature) at ``targets`` (B, T), and the untempered entropy (B, T)."""
    if isinstance(temperature, Tensor):
        tempered = logits.float() / temperature.unsqueeze(-1)
    else:
        tempered = logits.float() if temperature == 1.0 else logits.float() / temperature
    logp = tempered.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, entropy_from_logits(logits)
