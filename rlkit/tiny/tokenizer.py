"""Character-level tokenizer for the tiny engine, with the control and tool tags as single tokens: the specials
first (``<pad>`` = 0, ``<bos>``, ``<eos>``, the tool tags), then one id per character of ``alphabet``. ``encode``
reads the longest matching tag first, so ``"<code>"`` is the tag even when ``<`` is in the alphabet.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from rlkit.tasks.protocol import CODE, END_CODE, END_OUTPUT, OUTPUT

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS, CODE, END_CODE, OUTPUT, END_OUTPUT)
"""The default specials, in id order from 0 (trained checkpoints depend on it); the tool tags are the
calculator protocol's (:mod:`rlkit.tasks.protocol`)."""
ERRORS = ("strict", "ignore")


class CharTokenizer:
    """One token per character of ``alphabet``, plus ``specials`` (which must include the seven tags above)."""

    def __init__(self, alphabet: str, specials: Sequence[str] = SPECIALS):
        specials = tuple(specials)
        if not isinstance(alphabet, str) or not alphabet:
            raise ValueError("alphabet must be a non-empty str of the characters the tokenizer knows")
        if len(set(alphabet)) != len(alphabet):
            dup = sorted({c for c in alphabet if alphabet.count(c) > 1})
            raise ValueError(f"alphabet has repeated characters: {dup!r}")
        missing = [s for s in SPECIALS if s not in specials]
        if missing:
            raise ValueError(f"specials must include {missing} (the sampler and the tool protocol need them)")
        if len(set(specials)) != len(specials):
            raise ValueError(f"specials are not unique: {specials!r}")
        bad = [s for s in specials if not isinstance(s, str) or len(s) < 2]
        if bad:
            raise ValueError(f"special tokens must be strings of ≥ 2 characters (one is the alphabet's): {bad!r}")
        self.alphabet = alphabet
        self.specials = specials
        self.itos: list[str] = list(specials) + list(alphabet)
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        tags = "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
        self._pattern = re.compile(f"{tags}|.", re.DOTALL)
        self._chars = re.compile(".", re.DOTALL)
        self.pad_id, self.bos_id, self.eos_id = (self.stoi[s] for s in (PAD, BOS, EOS))
        self.code_id, self.end_code_id = self.stoi[CODE], self.stoi[END_CODE]
        self.output_id, self.end_output_id = self.stoi[OUTPUT], self.stoi[END_OUTPUT]

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, alphabet={self.alphabet!r})"

    def encode_with_offsets(self, text: str, *, errors: str = "strict",
                            tags: bool = True) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and their ``(start, end)`` spans in ``text``; ``errors="ignore"`` drops unknown characters,
        ``tags=False`` reads every character on its own (a tool's output cannot smuggle in a tag)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        if errors not in ERRORS:
            raise ValueError(f"errors must be one of {ERRORS}, got {errors!r}")
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        unknown: set[str] = set()
        stoi = self.stoi
        for m in (self._pattern if tags else self._chars).finditer(text):
            i = stoi.get(m.group())
            if i is None:
                unknown.add(m.group())
                continue
            ids.append(i)
            offsets.append(m.span())
        if unknown and errors == "strict":
            raise ValueError(f"characters not in the tokenizer's alphabet: {sorted(unknown)!r}")
        return ids, offsets

    def encode(self, text: str, *, errors: str = "strict", tags: bool = True) -> list[int]:
        """Token ids of ``text`` (tags read greedily; see :meth:`encode_with_offsets` for the options)."""
        return self.encode_with_offsets(text, errors=errors, tags=tags)[0]

    def decode(self, ids: Any, *, skip_special: bool = False) -> str:
        """Text of ``ids`` (a list, array or 1-D tensor); ``skip_special`` drops the specials but the tool tags."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"decode takes one sequence (1-D), got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        itos, n = self.itos, len(self.itos)
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"token ids outside [0, {n}): {bad[:10]}")
        if skip_special:
            keep = {self.code_id, self.end_code_id, self.output_id, self.end_output_id}
            return "".join(itos[i] for i in ids if i >= len(self.specials) or i in keep)
        return "".join(itos[i] for i in ids)

    def encode_batch(self, texts: Sequence[str], *, bos: bool = True, eos: bool = False,
                     pad_left: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode and pad ``texts`` → ``(ids (B, L) int64, attention_mask (B, L) bool)``, left by default."""
        if isinstance(texts, str) or len(texts) == 0:
            raise ValueError("texts must be a non-empty list of strings")
        seqs = [([self.bos_id] if bos else []) + self.encode(t) + ([self.eos_id] if eos else []) for t in texts]
        width = max(1, max(len(s) for s in seqs))
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.bool)
        for row, s in enumerate(seqs):
            if not s:
                continue
            cols = slice(width - len(s), width) if pad_left else slice(0, len(s))
            ids[row, cols] = torch.tensor(s, dtype=torch.long)
            mask[row, cols] = True
        return ids, mask

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description for checkpoints (:meth:`from_dict` rebuilds the same ids)."""
        return {"alphabet": self.alphabet, "specials": list(self.specials)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CharTokenizer:
        if not isinstance(d, dict) or "alphabet" not in d:
            raise ValueError("a tokenizer dict needs an 'alphabet' key (from CharTokenizer.to_dict)")
        return cls(d["alphabet"], d.get("specials", SPECIALS))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and self.itos == other.itos

    __hash__ = None  # type: ignore[assignment]
