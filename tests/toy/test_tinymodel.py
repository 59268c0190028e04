"""The tiny-model kit: trained tokenizer, chat template masks, and a saved folder that loads offline."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from corag.prompts import subanswer_messages
from corag.toy.tinymodel import END, build_tiny_model, save_tiny, train_tokenizer
from corag.toy.world import generate_world


def test_folder_loads_offline_and_runs(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Who is the director of Kavo Ralu?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] <= ids.shape[1] + 3 and torch.equal(out[0, : ids.shape[1]], ids[0])


def test_model_vocabulary_covers_the_largest_token_id(tiny_tokenizer, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    largest = max(tiny_tokenizer.get_vocab().values())
    assert model.config.vocab_size > largest
    assert model.get_input_embeddings().weight.shape[0] == model.config.vocab_size


def test_assistant_mask_covers_exactly_the_answer_and_its_end_token(tiny_model_dir, toy_world):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ex = toy_world.test[0]
    answer = ex.answers[0]
    messages = [
        {"role": "user", "content": ex.query},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And then?"},
        {"role": "assistant", "content": "No relevant information found"},
    ]
    rendered = tok.apply_chat_template(messages, return_assistant_tokens_mask=True, return_dict=True)
    ids, mask = rendered["input_ids"], rendered["assistant_masks"]
    masked = [i for i, m in zip(ids, mask, strict=True) if m]
    expected = tok(answer + END)["input_ids"] + tok("No relevant information found" + END)["input_ids"]
    assert masked == expected
    # The masked tokens form two contiguous runs, one per assistant turn.
    runs = [r for r in "".join(str(m) for m in mask).split("0") if r]
    assert len(runs) == 2
    ends = [i for i, (t, m) in enumerate(zip(ids, mask, strict=True)) if m and t == tok.eos_token_id]
    assert len(ends) == 2 and all(mask[i + 1] == 0 for i in ends)


def test_tokenizer_round_trips_text_exactly(tiny_tokenizer, toy_world):
    passages = toy_world.passages[:3]
    samples = [
        subanswer_messages(toy_world.test[0].decomposition[0].subquery, passages)[0]["content"],
        "  leading spaces, tabs\tand\nnew lines\n\n",
        "Unseen text: Café naïve – 東京 🙂 [START_ENT] x [END_ENT] 3.14",
    ]
    for text in samples:
        ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tiny_tokenizer.decode(ids) == text


def test_world_text_tokenizes_compactly(tiny_tokenizer, toy_world):
    # Trained on the world, the tokenizer spends about one token per word on its passages.
    text = " ".join(p.contents for p in toy_world.passages)
    n_tokens = len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
    assert n_tokens < 1.5 * len(text.split())


def test_every_name_word_of_any_world_is_one_token(tiny_tokenizer):
    other_world = generate_world(
        seed=123, num_entities=60, num_distractors=5, train_per_hop=1, test_per_hop=1
    )
    for entity in other_world.entities:
        *first, last = entity.name.split()
        expected = [f"{word}Ġ" for word in first] + [last]  # each word of a name right after the one before
        assert tiny_tokenizer.tokenize(entity.name) == expected
        assert tiny_tokenizer.tokenize(f"of {entity.name}?")[-len(expected) - 1 :] == [*expected, "?"]


def test_whole_words_become_single_tokens_even_when_rare():
    words = ["Zorblat", "Quenvix"]
    tok = train_tokenizer(["the cat sat on the mat"] * 5, vocab_size=300, words=words)
    for word in words:
        assert tok.tokenize(word) == [word] and tok.tokenize(f"{word} Quenvix") == [f"{word}Ġ", "Quenvix"]
        assert tok.tokenize(f"met {word}")[-1] == word  # the space before a capital ends the piece before
    text = "Zorblat met Quenvix, then Zorblatz left."
    assert tok.decode(tok(text)["input_ids"]) == text
    plain = train_tokenizer(["the cat sat on the mat"] * 5, vocab_size=300)
    assert len(plain.tokenize("Zorblat")) > 1  # the guarantee comes from `words`, not from training


def test_build_is_deterministic_per_seed(tiny_tokenizer):
    a, b = build_tiny_model(tiny_tokenizer, seed=1), build_tiny_model(tiny_tokenizer, seed=1)
    c = build_tiny_model(tiny_tokenizer, arch="qwen2", seed=2)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert c.config.model_type == "qwen2" and c.config.head_dim == 64


def test_a_head_size_wider_than_the_residual_stream_saves_and_reloads(tiny_tokenizer, tmp_path):
    model = build_tiny_model(tiny_tokenizer, hidden_size=64, num_heads=4, head_dim=32, intermediate_size=128)
    attention = model.model.layers[0].self_attn
    assert (attention.q_proj.out_features, attention.o_proj.in_features) == (128, 128)
    reloaded = AutoModelForCausalLM.from_pretrained(save_tiny(tmp_path, model, tiny_tokenizer))
    ids = torch.tensor([tiny_tokenizer("The director of Kavo Ralu is")["input_ids"]])
    with torch.inference_mode():
        assert torch.allclose(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)


def test_a_tokenizer_trained_without_a_world_still_knows_the_prompt_words(tiny_tokenizer):
    from corag.toy.world import name_pool, tokenizer_texts

    generic = train_tokenizer(tokenizer_texts(None), words=name_pool())
    world = generate_world(seed=4242, num_entities=60, num_distractors=10, train_per_hop=2, test_per_hop=1)
    fact = world.single_hop[0]
    messages = subanswer_messages(fact.query, [p for p in world.passages if p.id in fact.supporting_ids])
    text = generic.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = generic(text, add_special_tokens=False)["input_ids"]
    # The instruction words are whole tokens, not spelled out letter by letter.
    assert "Ġhallucinate" in generic.convert_ids_to_tokens(ids)
    assert len(ids) <= 1.1 * len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
