"""Passkey trials are independent units only when their haystacks differ (issue 37 item 6): each
trial's filler is the five filler sentences in an order of its own, and rows of trials that share a haystack
text carry one `cluster`. Expected values are read off the prompts themselves (the filler sentences between
the task description and the question), not taken from the functions under test."""

import itertools
import re

from ropebench.tasks import passkey
from ropebench.tasks.passkey import DESCRIPTION, FILLER, QUESTION, trial_clusters, trial_sentences

FILLER_SENTENCE = re.compile("|".join(re.escape(s) for s in FILLER))


def _haystack_order(text: str) -> tuple[str, ...]:
    """The first five filler sentences of a prompt's haystack, as they stand in the text."""
    body = text[text.index(DESCRIPTION) + len(DESCRIPTION) : text.rindex(QUESTION)]
    return tuple(FILLER_SENTENCE.findall(body)[:5])


def test_demo_trials_have_haystacks_of_their_own(tiny_model, tok, monkeypatch):
    """The demo's passkey shape (one depth near the end, 6 trials): 6 prompts whose haystacks differ (each a
    different order of the five filler sentences, trial 0 the classic one), so each row is its own unit."""
    prompts = []
    monkeypatch.setattr(passkey, "_generate", lambda m, t, ids, n, c: prompts.append(t.decode(ids)) or "0")
    records = passkey.run(tiny_model, tok, lengths=[256], depths=[0.99], trials=6, progress=False)
    # prompts run in the order that shares the most prefix: trial t's is the one holding its pass key
    by_trial = [next(p for p in prompts if str(passkey.key_for(0, 256, 0, t)) in p) for t in range(6)]
    orders = [_haystack_order(text) for text in by_trial]
    assert all(sorted(o) == sorted(FILLER) for o in orders)  # each: the five sentences, once each
    assert len(set(orders)) == 6 and orders[0] == tuple(FILLER)
    bodies = {text[: text.index("The pass key is")] for text in prompts}  # the haystack before the needle
    assert len(bodies) == 6
    assert {r["cluster"] for r in records} == {None} and len(records) == 6 * 2


def test_filler_orders_repeat_only_after_120_trials():
    """120 orders of five sentences: trials 0-119 all differ; trial 120 + t repeats trial t."""
    haystacks = [tuple(trial_sentences(None, 0, t, 100)[:5]) for t in range(121)]
    assert len(set(haystacks[:120])) == 120 == len(list(itertools.permutations(FILLER)))
    assert haystacks[120] == haystacks[0]
    assert all(len(" ".join(trial_sentences(None, 0, t, 300)).split()) >= 300 for t in (0, 7))


def test_trials_sharing_a_haystack_are_one_cluster():
    """Over 120 filler trials, trial 120 + t has trial t's text: both carry cluster "haystack-<t>"; a corpus
    of one document gives every trial the same text: one cluster for all."""
    sentences = [trial_sentences(None, 0, t, 60) for t in range(122)]
    clusters = trial_clusters(sentences)
    assert clusters[0] == clusters[120] == "haystack-0" and clusters[1] == clusters[121] == "haystack-1"
    assert clusters[2:120] == [None] * 118
    one_document = ["Alpha is here. Beta is there. Gamma goes on and on. " * 40]
    same = [trial_sentences(one_document, 0, t, 200) for t in range(3)]
    assert same[0] == same[1] == same[2]
    assert trial_clusters(same) == ["haystack-0"] * 3
