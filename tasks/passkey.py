"""Passkey retrieval (Mohtashami & Jaggi 2023; the YaRN/PI passkey test).

Prompt: task description, haystack, the needle at a sentence boundary at the requested depth, the
question; greedy decoding of a few tokens, exact match of the first integer. The haystack is cut at
word granularity so the final prompt (after the chat template when enabled) has at most L tokens
and at least 99% of L; records report the actual prompt length. Pass keys and corpus haystacks come
from `random.Random` seeded by integers only, so the same seed gives the same prompts everywhere.

Each trial has its own haystack (`trial_sentences`), so that trials are independent units; rows record
`distance` (needle to question, tokens) and `cluster` (set only where trials share a haystack text). Prompts
start with the tokenizer's own special prefix (`special_prefix`; add_bos overrides). A cell builds all its
prompts, then generates in the order that shares the most prefix (`extend.prefix_cache`): a trial's haystack
before the needle is prefilled once, not per depth. In full: docs/tasks.md, "Passkey".
"""

from __future__ import annotations

import bisect
import itertools
import random
import re
import time

from ropebench.extend.prefix_cache import PrefixCache
from tqdm.auto import tqdm

from .common import check_lengths, prefix_options, record, special_prefix
from .data import iter_corpus, seeded_order
from .errors import TaskError
from .kit import Metric, choice, declare, flag, fractions, greedy, largest_fitting, optional_flag, run_cells
from .sizes import (
    DEPTH_COST,
    MAX_DEPTHS,
    MAX_NEW_TOKENS,
    MAX_TRIALS,
    NEW_TOKEN_COST,
    TRIAL_COST,
    at_most,
    bounded_list,
    length_example,
)

DESCRIPTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there."
)
FILLER = [
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
]
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key?"
ANSWER_PREFIX = "The pass key is"
MIX = 1_000_003  # a prime: combines integer seed parts without Python's per-process hash()
# The filler's sentence orders (lexicographic: the first is the classic order); trial t takes order
# (t x ORDER_STRIDE) mod 120, a stride coprime with 120, so trials 0-119 each get an order of their own
FILLER_ORDERS = tuple(itertools.permutations(range(len(FILLER))))
ORDER_STRIDE = 49


def fits(lengths: list[int], options: dict, corpus: str, tokenizer) -> None:
    """The shortest length must hold the prompt without haystack (known from the tokenizer alone)."""
    if tokenizer is None:
        return
    chat = bool(options.get("chat_template", False))
    if chat and not getattr(tokenizer, "chat_template", None):
        raise TaskError(
            "passkey option chat_template=True but the tokenizer has no chat template — use "
            "chat_template: false"
        )
    prefix = None if chat else special_prefix(tokenizer, options.get("add_bos"))
    bare = len(encode(tokenizer, prompt([], 0, 0.0, 99999), chat, prefix))  # the prompt without haystack
    if lengths[0] <= bare:
        raise TaskError(
            f"passkey length {lengths[0]} is too short for the passkey prompt itself ({bare} tokens "
            f"without haystack) — use lengths > {bare}, e.g. {length_example(bare, 1024)}"
        )


@declare(
    "passkey",
    options={
        "depths": bounded_list(fractions, MAX_DEPTHS, DEPTH_COST),
        "trials": at_most(MAX_TRIALS, TRIAL_COST),
        "max_new_tokens": at_most(MAX_NEW_TOKENS, NEW_TOKEN_COST),
        "haystack": choice("filler", "corpus"),
        "chat_template": flag,
        "add_bos": optional_flag,
        "share_prefix": flag,
    },
    metrics={
        "correct": Metric(
            "rate",
            "higher",
            "fraction of prompts",
            "the greedy answer's first integer is the pass key",
            reach=("threshold", "short", "trained"),
            independent_unit="trial",
            lo=0.0,
            hi=1.0,
        ),
        "prompt_tokens": Metric(
            "mean", None, "tokens", "tokens of the prompt", role="detail", independent_unit="trial"
        ),
    },
    tables=(("correct", "passkey retrieval accuracy"),),
    extra_tokens=lambda options: int(options.get("max_new_tokens", 8)),
    fits=fits,
    needs_tokenizer=lambda lengths, options: True,
)
def run(
    model,
    tokenizer,
    *,
    lengths,
    depths=(0.0, 0.5, 1.0),
    trials=2,
    haystack="filler",
    corpus="sotu",
    chat_template=False,
    max_new_tokens=8,
    add_bos=None,
    share_prefix=True,
    seed=0,
    progress=True,
) -> list[dict]:
    lengths = check_lengths(lengths)
    # checked: declare
    depths = [float(d) for d in ([depths] if isinstance(depths, (int, float)) else depths)]
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise TaskError("chat_template=True but the tokenizer has no chat template — use chat_template=False")
    texts = [d.text for d in iter_corpus(corpus)] if haystack == "corpus" else None
    if texts is not None and not any(t.strip() for t in texts):
        raise TaskError(f"corpus {corpus!r} is empty — use another corpus or haystack='filler'")
    options = {
        "haystack": haystack,
        "chat_template": bool(chat_template),
        "max_new_tokens": max_new_tokens,
        "trials": trials,
        "depths": list(depths),
    }
    if haystack == "corpus":
        options["haystack_corpus"] = corpus
    if chat_template:  # the template writes its own special tokens
        prefix, options["bos_setting"] = None, "chat_template"
    else:
        prefix = special_prefix(tokenizer, add_bos)
        options.update(prefix_options(tokenizer, prefix, add_bos))
    name = corpus if haystack == "corpus" else "filler"

    sentences = [trial_sentences(texts, seed, trial, int(1.5 * lengths[-1]) + 64) for trial in range(trials)]
    clusters = trial_clusters(sentences)
    # length -> prompts; (length, i) -> pass key, needle-to-question tokens, seconds to build
    cells, keys, distances, build_secs = {}, {}, {}, {}
    for length in lengths:
        cells[length] = []
        for trial in range(trials):
            for di, depth in enumerate(depths):
                t0 = time.perf_counter()
                key = key_for(seed, length, di, trial)
                ids, distances[length, len(cells[length])] = build_located_prompt(
                    tokenizer, length, depth, key, sentences[trial], chat_template, prefix=prefix
                )
                cells[length].append(ids)
                keys[length, len(cells[length]) - 1] = key
                build_secs[length, len(cells[length]) - 1] = time.perf_counter() - t0
    # A cell's prompts share their haystack up to the (shallowest) needle: each prefills only what it does not
    # share with the previous one (tasks.kit.run_cells)
    with tqdm(total=len(lengths) * len(depths) * trials, desc="passkey", disable=not progress) as bar:
        answers = run_cells(
            model,
            cells,
            lambda ids, cache, _: _generate(model, tokenizer, ids, max_new_tokens, cache),
            extra_tokens=max_new_tokens,
            share_prefix=share_prefix,
            bar=bar,
        )
    results = {}  # (trial, length, depth index) -> (correct, prompt tokens, distance, seconds)
    for length in lengths:
        for i, (answer, secs) in enumerate(answers[length]):
            trial, di = divmod(i, len(depths))
            found = re.search(r"\d+", answer)
            correct = float(found is not None and int(found.group()) == keys[length, i])
            results[trial, length, di] = (
                correct,
                len(cells[length][i]),
                distances[length, i],
                build_secs[length, i] + secs,
            )
    records = []
    for (trial, length, di), (correct, n_tokens, distance, secs) in sorted(results.items()):
        common = {"depth": depths[di], "trial": trial}
        # a trial with a haystack of its own: its own unit (None); trials sharing one text: one cluster
        located = {"distance": distance, "cluster": clusters[trial]}
        for metric, value in (("correct", correct), ("prompt_tokens", n_tokens)):
            records.append(
                {**record("passkey", name, length, metric, value, 1, secs, options, **common), **located}
            )
    return records


def haystack_sentences(texts, rng: random.Random, words: int) -> list[str]:
    """At least `words` words of haystack, as sentences: the filler repeated, or corpus sentences
    from documents in a seeded order."""
    if texts is None:
        return FILLER * (words // 15 + 1)  # the 5 filler sentences have 15 words
    out, count = [], 0
    for text in seeded_order(texts, rng.randrange(2**31)):
        for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            if s:
                out.append(s)
                count += len(s.split())
        if count >= words:
            return out
    raise TaskError(
        f"the corpus has only {count} words, fewer than the {words} a haystack needs — "
        "use a larger corpus or haystack='filler'"
    )


def trial_sentences(texts, seed: int, trial: int, words: int) -> list[str]:
    """Trial `trial`'s haystack, at least `words` words as sentences: the filler's five sentences in the
    trial's own order (``FILLER_ORDERS``; trial 0: the classic order), repeated; or the corpus's sentences
    from documents in the trial's own seeded order."""
    if texts is None:
        order = FILLER_ORDERS[(trial * ORDER_STRIDE) % len(FILLER_ORDERS)]
        return [FILLER[i] for i in order] * (words // 15 + 1)  # the 5 filler sentences have 15 words
    return haystack_sentences(texts, random.Random(seed * MIX + trial), words)


def trial_clusters(sentences: list[list[str]]) -> list[str | None]:
    """Each trial's ``cluster``: None when its haystack text is its own, else "haystack-<t>" with t the first
    trial whose haystack is the same text (the trials that share a haystack are one independent unit)."""
    first: dict[tuple[str, ...], int] = {}
    owners = [first.setdefault(tuple(s), t) for t, s in enumerate(sentences)]
    shared = {o for t, o in enumerate(owners) if o != t}
    return [f"haystack-{o}" if o in shared else None for o in owners]


def key_for(seed: int, length: int, depth_index: int, trial: int) -> int:
    """The 5-digit pass key of one (length, depth, trial): the same in every process (no hash())."""
    return random.Random(((seed * MIX + length) * MIX + depth_index) * MIX + trial).randint(10000, 99999)


def cut_haystack(sentences: list[str], words: int) -> list[str]:
    """The haystack cut after `words` words (the last sentence may be cut mid-way)."""
    cut, left = [], words
    for s in sentences:
        if left <= 0:
            break
        n = len(s.split())
        cut.append(s if n <= left else " ".join(s.split()[:left]))
        left -= n
    return cut


def fit_haystack_words(
    tokenizer,
    length: int,
    depth: float,
    key: int,
    sentences: list[str],
    chat_template: bool = False,
    prefix: list[int] | None = None,
) -> int:
    """The most haystack words whose prompt has at most `length` tokens (binary search), checked to land
    within 1% of `length`."""

    def n_tokens(k):
        return len(encode(tokenizer, prompt(sentences, k, depth, key), chat_template, prefix))

    most = sum(len(s.split()) for s in sentences)
    if n_tokens(0) > length:
        raise TaskError(
            f"length {length} is too short for the passkey prompt itself "
            f"({n_tokens(0)} tokens without haystack) — use longer lengths"
        )
    if n_tokens(most) <= length:
        raise TaskError(f"not enough haystack for {length} tokens — this is a bug, please report it")
    lo = largest_fitting(n_tokens, most, length)
    if n_tokens(lo) < 0.99 * length:
        raise TaskError(
            f"could only build a {n_tokens(lo)}-token prompt for length {length} — use longer lengths"
        )
    return lo


def build_prompt(
    tokenizer,
    length: int,
    depth: float,
    key: int,
    sentences: list[str],
    chat_template: bool = False,
    prefix: list[int] | None = None,
) -> list[int]:
    """Token ids of the longest prompt with at most `length` tokens; the needle at the sentence boundary
    nearest the depth. `prefix`: the special ids before the text (default: the tokenizer's own, see
    encode)."""
    return build_located_prompt(tokenizer, length, depth, key, sentences, chat_template, prefix)[0]


def build_located_prompt(
    tokenizer,
    length: int,
    depth: float,
    key: int,
    sentences: list[str],
    chat_template: bool = False,
    prefix: list[int] | None = None,
) -> tuple[list[int], int]:
    """`build_prompt`'s ids and the needle's distance from the question in tokens (`located_encode`)."""
    words = fit_haystack_words(tokenizer, length, depth, key, sentences, chat_template, prefix)
    return located_encode(tokenizer, prompt(sentences, words, depth, key), key, chat_template, prefix)


def prompt(sentences: list[str], words: int, depth: float, key: int) -> tuple[str, str]:
    """(user text, answer prefix) of the prompt whose haystack is `sentences` cut after `words` words. The one
    prompt builder: the task encodes it (`encode`), the lm-eval task (tasks/lm_eval_tasks/utils.py) writes it
    as `plain_text`."""
    return compose(cut_haystack(sentences, words), depth, key)


def plain_text(parts: tuple[str, str]) -> str:
    """A prompt as one text, without chat template: the user text, a space, the answer prefix."""
    user, answer_prefix = parts
    return f"{user} {answer_prefix}"


def compose(haystack: list[str], depth: float, key: int) -> tuple[str, str]:
    """(user text, answer prefix). The needle goes to the sentence boundary whose character offset
    is nearest to depth x haystack characters."""
    offsets, total = [0], 0
    for s in haystack:
        total += len(s) + 1
        offsets.append(total)
    at = min(range(len(offsets)), key=lambda i: abs(offsets[i] - depth * total))
    body = " ".join(haystack[:at] + [NEEDLE.format(key=key)] + haystack[at:])
    return f"{DESCRIPTION}\n{body}\n{QUESTION}", ANSWER_PREFIX


def encode(
    tokenizer, parts: tuple[str, str], chat_template: bool, prefix: list[int] | None = None
) -> list[int]:
    """The prompt's ids: through the chat template, or `prefix` (default: what the tokenizer's own encoding
    puts before text, `special_prefix`) + the text without special tokens."""
    ids = tokenizer(prompt_text(tokenizer, parts, chat_template), add_special_tokens=False)["input_ids"]
    return ids if chat_template else _special(tokenizer, prefix) + ids


def _special(tokenizer, prefix: list[int] | None) -> list[int]:
    return list(special_prefix(tokenizer) if prefix is None else prefix)


def prompt_text(tokenizer, parts: tuple[str, str], chat_template: bool) -> str:
    """The text the prompt's ids encode (after `prefix` without a chat template; the template writes its own
    special tokens)."""
    if not chat_template:
        return plain_text(parts)
    user, answer_prefix = parts
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    return text + answer_prefix


def located_encode(
    tokenizer, parts: tuple[str, str], key: int, chat_template: bool, prefix: list[int] | None = None
) -> tuple[list[int], int]:
    """`encode`'s ids and the distance from the needle's first token to the question's first token."""
    text = prompt_text(tokenizer, parts, chat_template)
    ids, distance = encode_located(tokenizer, text, text.index(NEEDLE.format(key=key)), text.rindex(QUESTION))
    return (ids if chat_template else _special(tokenizer, prefix) + ids), distance


def encode_located(tokenizer, text: str, needle_at: int, question_at: int) -> tuple[list[int], int]:
    """The ids of `text` (no special tokens) and the tokens from the one that holds character `needle_at` to
    the one that holds character `question_at`, counted on those very ids (the tokenizer's offsets). A
    tokenizer without offsets (a slow one) gets the count of the text before each character, which can be
    off by the one token that straddles a boundary."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]

        def before(char: int) -> int:
            return len(tokenizer(text[:char], add_special_tokens=False)["input_ids"])

        return ids, before(question_at) - before(needle_at)
    ends = [end for _, end in enc["offset_mapping"]]  # non-decreasing: the holder of c is the first end > c
    return list(enc["input_ids"]), bisect.bisect_right(ends, question_at) - bisect.bisect_right(
        ends, needle_at
    )


def _generate(
    model, tokenizer, ids: list[int], max_new_tokens: int, prefix_cache: PrefixCache | None = None
) -> str:
    """Greedy answer to prompt `ids`; with a `PrefixCache` the prompt's shared prefix is not prefilled
    again."""
    return greedy(model, tokenizer, ids, max_new_tokens, prefix_cache)
