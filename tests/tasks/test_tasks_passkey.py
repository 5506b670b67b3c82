"""tasks.passkey: exact prompt lengths, needle depth, determinism, records."""

import random

import pytest
from ropebench.tasks import TaskError, data, passkey
from ropebench.tasks.passkey import FILLER, build_prompt, haystack_sentences


def needle_depth(text, key):
    """Fraction of the haystack (characters between description and question) before the needle."""
    start = text.index("\n") + 1
    end = text.rindex("\nWhat is the pass key?")
    needle = len(passkey.NEEDLE.format(key=key)) + 1
    return (text.index(f"The pass key is {key}.") - start) / (end - start - needle)


@pytest.mark.parametrize("haystack", ["filler", "corpus"])
@pytest.mark.parametrize("chat", [False, True])
def test_prompt_length_within_one_percent_and_needle_at_depth(tok, haystack, chat):
    texts = None if haystack == "filler" else [d.text for d in data.load_corpus("sotu")[:40]]
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
                text = text[text.index("There is an important") :]
            haystack_chars = text.rindex("\nWhat is") - text.index("\n")
            assert abs(needle_depth(text, 12345) - depth) <= (longest + 2) / haystack_chars  # +- one sentence


def test_filler_haystack_is_the_classic_text(tok):
    ids = build_prompt(tok, 300, 0.5, 55555, haystack_sentences(None, random.Random(0), 400))
    text = tok.decode(ids)
    assert " ".join(FILLER) in text and "The pass key is 55555. Remember it. 55555 is the pass key." in text


def test_same_seed_same_prompts_and_results(tiny_model, tok, monkeypatch):
    prompts = []
    real = passkey._generate
    monkeypatch.setattr(
        passkey, "_generate", lambda m, t, ids, n, c: prompts.append(ids) or real(m, t, ids, n, c)
    )
    kw = {"lengths": [128, 256], "depths": [0.0, 1.0], "trials": 2, "progress": False}
    a = passkey.run(tiny_model, tok, seed=3, **kw)
    b = passkey.run(tiny_model, tok, seed=3, **kw)
    c = passkey.run(tiny_model, tok, seed=4, **kw)
    assert prompts[:8] == prompts[8:16] and prompts[:8] != prompts[16:]  # generation order included

    def strip(rs):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rs]

    assert strip(a) == strip(b) and len(c) == len(a)
    assert len(a) == 2 * 2 * 2 * 2 and {r["metric"] for r in a} == {"correct", "prompt_tokens"}
    assert all(r["value"] in (0.0, 1.0) for r in a if r["metric"] == "correct")
    assert all(0.99 * r["length"] <= r["value"] <= r["length"] for r in a if r["metric"] == "prompt_tokens")
    assert {(r["depth"], r["trial"]) for r in a} == {(0.0, 0), (0.0, 1), (1.0, 0), (1.0, 1)}


def test_exact_match_of_the_first_integer(tiny_model, tok, monkeypatch):
    keys = []
    real_key = passkey.key_for
    monkeypatch.setattr(passkey, "key_for", lambda *a: keys.append(real_key(*a)) or keys[-1])
    # trial 1's prompt gets its own key back (after a leading "12"-free text), trial 0's a wrong integer
    monkeypatch.setattr(
        passkey,
        "_generate",
        lambda m, t, ids, n, c: f" {keys[1]}. Remember" if str(keys[1]) in t.decode(ids) else "12 is it",
    )
    recs = passkey.run(tiny_model, tok, lengths=[128], depths=[0.5], trials=2, progress=False)
    assert [r["value"] for r in recs if r["metric"] == "correct"] == [0.0, 1.0]


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"lengths": [128], "depths": [1.5]}, r"\[0, 1\]"),
        ({"lengths": [128], "depths": [-0.1]}, r"\[0, 1\]"),
        ({"lengths": [-5]}, "positive"),
        ({"lengths": [10]}, "too short"),
        ({"lengths": [128], "trials": 0}, "trials"),
        ({"lengths": [128], "haystack": "x"}, "haystack"),
        ({"lengths": [128], "haystack": "corpus", "corpus": "nope"}, "unknown corpus"),
    ],
)
def test_bad_parameters(tiny_model, tok, kw, match):
    with pytest.raises(TaskError, match=match):
        passkey.run(tiny_model, tok, progress=False, **kw)


def _answers(monkeypatch):
    """Record every (prompt, answer) the task generates."""
    seen = {}
    real = passkey._generate

    def spy(m, t, ids, n, cache):
        seen[tuple(ids)] = out = real(m, t, ids, n, cache)
        return out

    monkeypatch.setattr(passkey, "_generate", spy)
    return seen


@pytest.mark.parametrize("haystack", ["filler", "corpus"])
def test_shared_prefix_same_prompts_and_answers(tiny_model, tok, monkeypatch, haystack):
    kw = {
        "lengths": [256, 384],
        "depths": [0.0, 0.5, 1.0],
        "trials": 2,
        "haystack": haystack,
        "progress": False,
    }
    seen = _answers(monkeypatch)
    shared = passkey.run(tiny_model, tok, **kw)
    first = dict(seen)
    seen.clear()
    unshared = passkey.run(tiny_model, tok, share_prefix=False, **kw)
    assert first == seen and len(seen) == 12

    def strip(rs):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rs]

    assert strip(shared) == strip(unshared)


@pytest.mark.real
def test_shared_prefix_same_answers_on_smollm2(smollm2, monkeypatch):
    """The real model (float32) answers every prompt of a passkey grid the same with and without sharing, and
    sharing prefills fewer tokens."""
    from ropebench.extend import prefix_cache
    from ropebench.tasks import kit  # run_cells makes every task's caches

    model, tok = smollm2
    monkeypatch.setattr(prefix_cache, "MIN_SHARED", 16)  # short prompts here: share even a short haystack
    counts = []
    real_cache = prefix_cache.PrefixCache
    monkeypatch.setattr(kit, "PrefixCache", lambda *a, **k: counts.append(real_cache(*a, **k)) or counts[-1])
    seen = _answers(monkeypatch)
    kw = {"lengths": [256], "depths": [0.5, 1.0], "trials": 2, "max_new_tokens": 6, "progress": False}
    shared = passkey.run(model, tok, **kw)
    first = dict(seen)
    seen.clear()
    passkey.run(model, tok, share_prefix=False, **kw)
    assert first == seen and len(seen) == 4
    assert sum(r["value"] for r in shared if r["metric"] == "correct") >= 3  # the model finds the keys here
    sharing, plain = counts
    assert plain.reused == 0 and sharing.reused > 0 and sharing.computed < 0.75 * plain.computed
