"""Tiny engine: character tokenizer, RoPE decoder, KV cache, token_logprobs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.tasks.tools import first_code_token
from rlkit.tiny import model as model_module
from rlkit.tiny.model import ModelConfig, TinyDecoder, positions_from_mask, token_logprobs
from rlkit.tiny.tokenizer import SPECIALS, CharTokenizer

ALPHA = "0123456789+-*/ #=.abcdexyz?"
TOK = CharTokenizer(ALPHA)
TAGS = list(SPECIALS)


def small_model(seed: int = 0, **kw) -> TinyDecoder:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=TOK.vocab_size, d_model=32, n_layers=2, n_heads=4, max_len=64)
    cfg.update(kw)
    return TinyDecoder(ModelConfig(**cfg)).eval()


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_hand_example():
    assert TOK.vocab_size == 7 + len(ALPHA)
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id, TOK.code_id, TOK.end_code_id) == (0, 1, 2, 3, 4)
    ids = TOK.encode("<code>1+2</code><output>3</output> #### 3<eos>")
    one, plus, two, three = (7 + ALPHA.index(c) for c in "1+23")
    assert ids[:7] == [TOK.code_id, one, plus, two, TOK.end_code_id, TOK.output_id, three]
    assert ids[7] == TOK.end_output_id and ids[-1] == TOK.eos_id
    assert len(ids) == 8 + len(" #### 3") + 1
    assert TOK.decode(ids) == "<code>1+2</code><output>3</output> #### 3<eos>"
    assert TOK.decode(ids, skip_special=True) == "<code>1+2</code><output>3</output> #### 3"


def test_tags_win_over_characters_greedily():
    tok = CharTokenizer("<>/codeutp")  # every tag's characters are in the alphabet
    assert tok.encode("<code>") == [tok.code_id]
    assert tok.encode("</code>") == [tok.end_code_id]
    assert tok.encode("<<code>>") == [tok.stoi["<"], tok.code_id, tok.stoi[">"]]
    assert tok.encode("<cod>") == [tok.stoi[c] for c in "<cod>"]
    assert tok.encode("<code>", tags=False) == [tok.stoi[c] for c in "<code>"]


def test_unknown_characters():
    with pytest.raises(ValueError, match=r"'!'.*'Q'|'Q'.*'!'"):
        TOK.encode("1+2!Q")
    assert TOK.encode("1+2!Q", errors="ignore") == TOK.encode("1+2")
    with pytest.raises(ValueError, match="errors"):
        TOK.encode("1", errors="replace")
    with pytest.raises(ValueError, match="outside"):
        TOK.decode([TOK.vocab_size])


def test_bad_alphabets():
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("abca")
    with pytest.raises(ValueError, match="non-empty"):
        CharTokenizer("")
    with pytest.raises(ValueError, match="must include"):
        CharTokenizer("ab", specials=("<pad>", "<bos>"))


def test_offsets_hand_example_and_first_code_token():
    text = "ab 1+2<code>1+2</code><output>3</output>"
    ids, offsets = TOK.encode_with_offsets(text)
    assert offsets[:7] == [(i, i + 1) for i in range(6)] + [(6, 12)]
    assert ids[6] == TOK.code_id
    assert first_code_token(text, offsets) == 6
    assert first_code_token("1+2=3", TOK.encode_with_offsets("1+2=3")[1]) == -1


def test_checkpoint_round_trip_and_batch_encoding():
    tok = CharTokenizer.from_dict(TOK.to_dict())
    assert tok == TOK and tok.encode("<code>1</code>") == TOK.encode("<code>1</code>")
    ids, mask = TOK.encode_batch(["ab", "abcd"])
    assert ids.tolist() == [[0, 0, 1, *TOK.encode("ab")], [1, *TOK.encode("abcd")]]
    assert mask.tolist() == [[False, False, True, True, True], [True] * 5]
    ids, mask = TOK.encode_batch(["ab", "abcd"], bos=False, eos=True, pad_left=False)
    assert ids[0].tolist() == [*TOK.encode("ab"), TOK.eos_id, 0, 0]


pieces = st.lists(st.one_of(st.sampled_from(list(ALPHA)), st.sampled_from(TAGS)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(pieces)
def test_round_trip_and_offsets_property(parts):
    text = "".join(parts)
    ids, offsets = TOK.encode_with_offsets(text)
    assert len(ids) == len(parts)  # no '<' in ALPHA: every piece is one token
    assert TOK.decode(ids) == text
    assert TOK.encode(TOK.decode(ids)) == ids
    # spans tile the text and each span spells its token
    assert [s for s, _ in offsets] == ([0] + [e for _, e in offsets[:-1]] if offsets else [])
    assert all(text[s:e] == TOK.itos[i] for i, (s, e) in zip(ids, offsets))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="<>/codeutpbsa", max_size=40))
def test_round_trip_with_tag_characters_in_alphabet(text):
    tok = CharTokenizer("<>/codeutpbsa")
    ids, offsets = tok.encode_with_offsets(text)
    assert tok.decode(ids) == text
    assert "".join(text[s:e] for s, e in offsets) == text
    assert tok.decode(tok.encode(text, tags=False)) == text


# ---------------------------------------------------------------- model


def test_config_validation_and_size():
    with pytest.raises(ValueError, match="even width"):
        ModelConfig(vocab_size=10, d_model=12, n_heads=4)  # head width 3
    with pytest.raises(ValueError, match="divide"):
        ModelConfig(vocab_size=10, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="vocab_size"):
        ModelConfig(vocab_size=0)
    model = TinyDecoder(ModelConfig(vocab_size=82))
    assert 0.78e6 < model.num_params() < 0.82e6  # NOTES: d=128, 4 layers, 4 heads ≈ 0.8M
    assert ModelConfig.from_dict(model.config.to_dict()) == model.config


def test_positions_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert positions_from_mask(mask, torch.tensor([3, 0])).tolist() == [[3, 3, 3, 4, 5], [0, 1, 2, 3, 4]]


def test_rope_makes_attention_relative():
    """Shifting every position by a constant leaves the logits unchanged (RoPE scores depend on offsets only)."""
    model = small_model()
    ids = torch.randint(TOK.vocab_size, (2, 9))
    pos = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, positions=pos), model(ids, positions=pos + 17), atol=1e-5, rtol=1e-4)
        assert not torch.allclose(model(ids), model(ids.flip(1)).flip(1), atol=1e-3)


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
def test_left_padded_rows_equal_rows_alone(kv_heads):
    model = small_model(n_kv_heads=kv_heads)
    texts = ["12+3?", "a", "xyz 99 =", "7"]
    ids, mask = TOK.encode_batch(texts)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask)
        assert torch.isfinite(batch).all()  # all-padding prefixes stay finite
        torch.testing.assert_close(model(ids, attention_mask=mask, last_only=True), batch[:, -1:])
        for row, text in enumerate(texts):
            alone = model(TOK.encode_batch([text])[0])
            torch.testing.assert_close(batch[row, mask[row]], alone[0], atol=1e-5, rtol=1e-4)


@settings(max_examples=50, deadline=None)  # fewer: each example runs ~10 model forwards
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.integers(0, 2**16), st.sampled_from([None, 1]),
       st.sampled_from([2048, 5]), st.sampled_from([16, 2]))
def test_kv_cache_equals_full_forward(chunks, seed, kv_heads, prefill_chunk, grow):
    """Feeding a left-padded batch through the cache in chunks (prefill, then pieces, then single tokens)
    gives the full forward's logits at every real position. ``prefill_chunk`` 5 splits the prefill by rows;
    ``grow`` 2 widens the rows' tail buffer often (and by more for longer chunks)."""
    model = small_model(seed % 7, n_kv_heads=kv_heads)
    g = torch.Generator().manual_seed(seed)
    B, L = 3, sum(chunks) + 3
    ids = torch.randint(TOK.vocab_size, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    pads = torch.randint(0, chunks[0] + 1, (B,), generator=g)
    for r, p in enumerate(pads.tolist()):
        mask[r, :p] = False
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_module, "PREFILL_CHUNK_TOKENS", prefill_chunk)
        mp.setattr(model_module.KVCache, "GROW", grow)
        full = model(ids, attention_mask=mask)
        cache = model.new_cache(B, L)
        parts, s = [], 0
        for n in chunks + [1, 1, 1]:
            parts.append(model(ids[:, s : s + n], attention_mask=mask[:, s : s + n], kv_cache=cache))
            s += n
        last = model(ids[:, : chunks[0]], attention_mask=mask[:, : chunks[0]], kv_cache=model.new_cache(B, L),
                     last_only=True)
    assert cache.length == L
    assert cache.n_tokens.tolist() == mask.sum(1).tolist()
    torch.testing.assert_close(torch.cat(parts, 1)[mask], full[mask], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(last, parts[0][:, -1:])


@pytest.mark.parametrize("kv_heads", [None, 2])
@pytest.mark.parametrize("grow", [16, 2])
@pytest.mark.parametrize("rows, keep", [([2, 0, 2, 2, 1, 0], [0, 2, 5]), ([0, 0, 1, 1, 2, 2], [0, 1, 4])])
def test_shared_prefix_rows_equal_full_forward(kv_heads, grow, rows, keep, monkeypatch):
    """Rows selected (repeated, reordered, some dropped) from one prefill share their prompt's keys; appending a
    different continuation to each, in chunks of 2 and 1 tokens, gives each row's full forward (``grow`` 2: the
    rows' tail buffer is widened on the way). The second ``rows`` are
    already grouped prompt by prompt (GRPO's layout), the first are not; ``keep`` leaves two rows on one prompt."""
    monkeypatch.setattr(model_module.KVCache, "GROW", grow)
    model = small_model(5, n_kv_heads=kv_heads)
    g = torch.Generator().manual_seed(0)
    prompts, mask = TOK.encode_batch(["12+3?", "a", "xyz 99 ="])
    rows, keep = torch.tensor(rows), torch.tensor(keep)
    cont = torch.randint(7, TOK.vocab_size, (len(rows), 5), generator=g)
    with torch.no_grad():
        cache = model.new_cache(3, prompts.shape[1] + 6)
        model(prompts, attention_mask=mask, kv_cache=cache)
        cache.select(rows)
        assert cache.shared and len(cache.prefix_k[0]) == 3 and cache.regular == (rows.tolist() == sorted(rows))
        steps = [model(cont[:, :2], kv_cache=cache), model(cont[:, 2:3], kv_cache=cache)]
        cache.select(keep)  # the other rows finish: one prompt is no longer read, one serves two rows
        assert cache.shared and len(cache.prefix_k[0]) == 2
        steps += [model(cont[keep, 3:4], kv_cache=cache), model(cont[keep, 4:5], kv_cache=cache)]
        cache.select(torch.tensor([1, 2]))  # one row per prompt: no sharing left
        assert not cache.shared
        last = model(cont[keep[[1, 2]], 4:5], kv_cache=cache)  # a repeat of the last token, one step further
        for i, r in enumerate(rows.tolist()):
            seq = torch.cat([prompts[r, mask[r]], cont[i]])[None]
            full = model(seq)[0, -5:]
            torch.testing.assert_close(torch.cat([steps[0][i], steps[1][i]]), full[:3], atol=1e-5, rtol=1e-4)
            if i in keep.tolist():
                j = keep.tolist().index(i)
                torch.testing.assert_close(torch.cat([steps[2][j], steps[3][j]]), full[3:], atol=1e-5, rtol=1e-4)
                if j > 0:
                    again = model(torch.cat([seq, cont[i, 4:5][None]], 1))[0, -1]
                    torch.testing.assert_close(last[j - 1, 0], again, atol=1e-5, rtol=1e-4)


def test_cache_select_and_errors():
    model = small_model()
    ids = torch.randint(TOK.vocab_size, (3, 5))
    with torch.no_grad():
        cache = model.new_cache(3, 8)
        model(ids, kv_cache=cache)
        cache.select(torch.tensor([2, 0]))
        step = model(ids[[2, 0], :1], kv_cache=cache)
        full = model(torch.cat([ids[[2, 0]], ids[[2, 0], :1]], 1))
    torch.testing.assert_close(step[:, 0], full[:, -1], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="capacity"):
        model(ids[:2], kv_cache=cache)
    with pytest.raises(ValueError, match="rows"):
        model(ids[:1, :1], kv_cache=cache)
    with pytest.raises(ValueError, match="real"):
        model(ids[:2, :1], attention_mask=torch.tensor([[True], [False]]), kv_cache=cache)
    with pytest.raises(ValueError, match="max_len"):
        model.new_cache(1, 65)
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        model(ids[0])


def test_token_logprobs_hand_check_and_gradient():
    model = small_model().train()
    ids, mask = TOK.encode_batch(["1+2", "a"])
    resp = torch.tensor([TOK.encode("3#"), TOK.encode("b") + [TOK.pad_id]])
    seq = torch.cat([ids, resp], 1)
    att = torch.cat([mask, torch.tensor([[True, True], [True, False]])], 1)
    P = ids.shape[1]
    logp, ent = token_logprobs(model, seq, att, P)
    assert logp.shape == ent.shape == (2, 2)
    # row 1 alone: <bos> a b
    alone = model(torch.tensor([[TOK.bos_id] + TOK.encode("ab")]))[0].log_softmax(-1)
    torch.testing.assert_close(logp[1, 0], alone[1, TOK.encode("b")[0]], atol=1e-5, rtol=1e-4)
    p = alone[1].exp()
    torch.testing.assert_close(ent[1, 0], -(p * alone[1]).sum(), atol=1e-5, rtol=1e-4)
    # tempered: logp at T = 0.5 is log softmax(z / 0.5); a (B, T) tensor of 0.5 gives the same
    half, _ = token_logprobs(model, seq, att, P, temperature=0.5)
    torch.testing.assert_close(half, token_logprobs(model, seq, att, P, temperature=torch.full((2, 2), 0.5))[0])
    z = model(torch.tensor([[TOK.bos_id] + TOK.encode("ab")]))[0, 1]
    torch.testing.assert_close(half[1, 0], (z / 0.5).log_softmax(-1)[TOK.encode("b")[0]], atol=1e-5, rtol=1e-4)
    (grad,) = torch.autograd.grad((logp[:, 0]).sum(), model.embed.weight)
    assert grad.abs().sum() > 0
    with pytest.raises(ValueError, match="response_start"):
        token_logprobs(model, seq, att, 0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, seq, att, P, temperature=0.0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), chunk=st.integers(1, 5), per_token_temperature=st.booleans())
def test_token_logprobs_in_length_chunks_equal_one_padded_batch(seed, chunk, per_token_temperature):
    """Chunks of rows of similar length, each cut to its own padding, give the values and gradients of the whole
    padded batch, and 0 past each response's end."""
    g = torch.Generator().manual_seed(seed)
    model = small_model(seed % 7).train()
    B, P, T = 9, 12, 10
    prompt_len = torch.randint(1, P + 1, (B,), generator=g)
    response_len = torch.randint(0, T + 1, (B,), generator=g)
    cols = torch.arange(P + T)
    att = ((cols >= P - prompt_len[:, None]) & (cols < P)) | ((cols >= P) & (cols < P + response_len[:, None]))
    ids = torch.where(att, torch.randint(4, TOK.vocab_size, (B, P + T), generator=g), TOK.pad_id)
    temps = torch.rand(B, T, generator=g) + 0.5 if per_token_temperature else 0.7
    whole = token_logprobs(model, ids, att, P, temperature=temps, rows_per_chunk=B)
    parts = token_logprobs(model, ids, att, P, temperature=temps, rows_per_chunk=chunk)
    real = att[:, P:]
    for a, b in zip(whole, parts):
        torch.testing.assert_close(a[real], b[real], atol=2e-5, rtol=1e-4)
        assert torch.all(b[~real] == 0)
    grads = [torch.autograd.grad((lp * real).sum(), list(model.parameters()))
             for lp, _ in (whole, parts)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), chunk=st.integers(1, 9), n_prompts=st.integers(1, 5), gqa=st.booleans())
def test_token_logprobs_sharing_prompts_equals_each_row_alone(seed, chunk, n_prompts, gqa):
    """Rows answering the same prompt, its tokens run once (``share_prompts``), give the values and gradients of
    every row run whole — groups of any size, prompts of any length (1 token included), ragged responses, rows in
    any order, any chunk size."""
    g = torch.Generator().manual_seed(seed)
    model = small_model(seed % 7, **({"n_kv_heads": 1} if gqa else {})).train()
    B, P, T = 11, 9, 8
    prompt_len = torch.randint(1, P + 1, (n_prompts,), generator=g)
    prompt_tokens = torch.randint(4, TOK.vocab_size, (n_prompts, P), generator=g)
    prompt_of = torch.randint(0, n_prompts, (B,), generator=g)
    response_len = torch.randint(0, T + 1, (B,), generator=g)
    cols = torch.arange(P + T)
    att = ((cols >= P - prompt_len[prompt_of, None]) & (cols < P)) | ((cols >= P) & (cols < P + response_len[:, None]))
    ids = torch.cat((prompt_tokens[prompt_of], torch.randint(4, TOK.vocab_size, (B, T), generator=g)), 1)
    ids = torch.where(att, ids, TOK.pad_id)
    temps = torch.rand(B, T, generator=g) + 0.5
    alone = token_logprobs(model, ids, att, P, temperature=temps, rows_per_chunk=chunk, share_prompts=False)
    shared = token_logprobs(model, ids, att, P, temperature=temps, rows_per_chunk=chunk, share_prompts=True)
    real = att[:, P:]
    for a, b in zip(alone, shared):
        torch.testing.assert_close(a[real], b[real], atol=2e-5, rtol=1e-4)
        assert torch.all(b[~real] == 0)
    grads = [torch.autograd.grad((lp * real).sum() + (ent * real).sum(), list(model.parameters()))
             for lp, ent in (alone, shared)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_forward_after_prefixes_hand_check_and_bad_input():
    """Two rows continuing one left-padded prefix and one row another: each row's logits are those of its whole
    sequence run alone."""
    model = small_model().eval()
    prefix, prefix_mask = TOK.encode_batch(["12+", "a"])  # left-padded: (2, P)
    rows = torch.tensor([TOK.encode("3=4"), TOK.encode("5=6"), TOK.encode("bcd")])
    prompt_of = torch.tensor([0, 0, 1])
    out = model.forward_after_prefixes(prefix, prefix_mask, prompt_of, rows)
    assert out.shape == (3, 3, TOK.vocab_size)
    for i in range(3):
        whole = torch.cat((prefix[prompt_of[i]][prefix_mask[prompt_of[i]]], rows[i]))[None]
        torch.testing.assert_close(out[i], model(whole)[0, -3:], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="prompt_of"):
        model.forward_after_prefixes(prefix, prefix_mask, prompt_of[:2], rows)
    with pytest.raises(ValueError, match=r"\(U, P\)"):
        model.forward_after_prefixes(prefix[0], prefix_mask, prompt_of, rows)
    with pytest.raises(ValueError, match="max_len"):
        model.forward_after_prefixes(prefix, prefix_mask, prompt_of, rows.repeat(1, 40))


def test_sft_loss_in_length_chunks_equals_one_padded_batch():
    """``next_token_loss`` (rows of similar length together, padding cut) equals the padded batch's mean
    cross-entropy over the solution targets, in value and gradient."""
    from rlkit.tasks import arithmetic
    from rlkit.tiny.sft import next_token_loss
    from rlkit.tiny.task import build_tokenizer, sft_batch

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = TinyDecoder(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, max_len=512))
    ids, target = sft_batch(tok, arithmetic.make_split(13, "train", seed=1), "mixed")
    assert (ids == tok.pad_id).any()  # the rows differ in length
    padded = torch.nn.functional.cross_entropy(model(ids[:, :-1])[target], ids[:, 1:][target])
    for rows_per_chunk in (1, 4, 13):
        chunked = next_token_loss(model, ids, target, tok.pad_id, rows_per_chunk)
        torch.testing.assert_close(chunked, padded)
        for a, b in zip(torch.autograd.grad(padded, list(model.parameters()), retain_graph=True),
                        torch.autograd.grad(chunked, list(model.parameters()))):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
