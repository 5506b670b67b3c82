"""tasks.passkey: exact prompt lengths, needle depth, determinism, records."""
import random

import pytest
from conftest import tiny_llama

from tasks import TaskError, passkey
from tasks.passkey import FILLER, build_prompt, haystack_sentences


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def tiny(tok):
    return tiny_llama(max_position_embeddings=1024, vocab_size=len(tok))


def needle_depth(text, key):
    """Fraction of the haystack (characters between description and question) before the needle."""
    start = text.index("\n") + 1
    end = text.rindex("\nWhat is the pass key?")
    needle = len(passkey.NEEDLE.format(key=key)) + 1
    return (text.index(f"The pass key is {key}.") - start) / (end - start - needle)


@pytest.mark.parametrize("haystack", ["filler", "corpus"])
@pytest.mark.parametrize("chat", [False, True])
def test_prompt_length_within_one_percent_and_needle_at_depth(tok, haystack, chat):
    texts = None if haystack == "filler" else [d.text for d in __import__("tasks").data.load_corpus("sotu")[:40]]
    sentences = haystack_sentences(texts, random.Random(1), words=5000)
    longest = max(len(s) for s in sentences[:400])
    for length in (500, 2000, 3000):
        for depth in (0.0, 0.3, 0.5, 1.0):
            ids = build_prompt(tok, length, depth, 12345, sentences, chat)
            assert 0.99 * length <= len(ids) <= length
            text = tok.decode(ids)
            assert text.count("12345") == 2 and text.rstrip().endswith("The pass key is")
            if chat:
                assert text.startswith("<|im_start|>")
                text = text[text.index("There is an important"):]
            haystack_chars = text.rindex("\nWhat is") - text.index("\n")
            assert abs(needle_depth(text, 12345) - depth) <= (longest + 2) / haystack_chars  # +- one sentence


def test_filler_haystack_is_the_classic_text(tok):
    ids = build_prompt(tok, 300, 0.5, 55555, haystack_sentences(None, random.Random(0), 400))
    text = tok.decode(ids)
    assert " ".join(FILLER) in text and "The pass key is 55555. Remember it. 55555 is the pass key." in text


def test_same_seed_same_prompts_and_results(tiny, tok, monkeypatch):
    prompts = []
    real = passkey._generate
    monkeypatch.setattr(passkey, "_generate", lambda m, t, ids, n: prompts.append(ids) or real(m, t, ids, n))
    kw = {"lengths": [128, 256], "depths": [0.0, 1.0], "trials": 2, "progress": False}
    a = passkey.run(tiny, tok, seed=3, **kw)
    b = passkey.run(tiny, tok, seed=3, **kw)
    c = passkey.run(tiny, tok, seed=4, **kw)
    assert prompts[:8] == prompts[8:16] and prompts[:8] != prompts[16:]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]
    assert strip(a) == strip(b) and len(c) == len(a)
    assert len(a) == 2 * 2 * 2 * 2 and {r["metric"] for r in a} == {"correct", "prompt_tokens"}
    assert all(r["value"] in (0.0, 1.0) for r in a if r["metric"] == "correct")
    assert all(0.99 * r["length"] <= r["value"] <= r["length"] for r in a if r["metric"] == "prompt_tokens")
    assert {(r["depth"], r["trial"]) for r in a} == {(0.0, 0), (0.0, 1), (1.0, 0), (1.0, 1)}


def test_exact_match_of_the_first_integer(tiny, tok, monkeypatch):
    keys = []
    real_build = passkey.build_prompt
    monkeypatch.setattr(passkey, "build_prompt", lambda t, L, d, key, s, c: keys.append(key) or real_build(t, L, d, key, s, c))
    answers = iter(["12 is it", None])
    monkeypatch.setattr(passkey, "_generate", lambda m, t, ids, n: f" {keys[-1]}. Remember" if next(answers) is None
                        else "12 is it")
    recs = passkey.run(tiny, tok, lengths=[128], depths=[0.5], trials=2, progress=False)
    assert [r["value"] for r in recs if r["metric"] == "correct"] == [0.0, 1.0]


@pytest.mark.parametrize("kw, match", [
    ({"lengths": [128], "depths": [1.5]}, r"\[0, 1\]"), ({"lengths": [128], "depths": [-0.1]}, r"\[0, 1\]"),
    ({"lengths": [-5]}, "positive"), ({"lengths": [10]}, "too short"), ({"lengths": [128], "trials": 0}, "trials"),
    ({"lengths": [128], "haystack": "x"}, "haystack"), ({"lengths": [128], "haystack": "corpus", "corpus": "nope"}, "unknown corpus"),
])
def test_bad_parameters(tiny, tok, kw, match):
    with pytest.raises(TaskError, match=match):
        passkey.run(tiny, tok, progress=False, **kw)
