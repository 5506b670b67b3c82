"""RULER-style retrieval (Hsieh et al. 2024, arXiv:2404.06654): several needles, distractors, variable
tracking.

Variants (RULER's settings, as in lm-eval 0.4.13's `ruler` tasks; needles "One of the special magic numbers
for <key> is: <7-digit number>.", keys adjective-noun words):
- `niah_multikey`: four keys, one queried; the other three are distractor needles (RULER niah_multikey_1);
- `niah_multivalue`: one key with four values, all asked for;
- `niah_multiquery`: four keys, all queried in one question (answers in the question's order);
- `vt`: variable tracking, one chain "VAR A = 12345", "VAR B = VAR A ", ... of four hops; asked which
  variables hold the value (RULER vt, without its in-context example).
RULER's templates and answer prefixes (`gen_prefix`); the haystack as passkey's ("filler": "The grass is
green. ...", or sentences of a corpus), cut at word granularity so that the prompt plus what is generated or
scored after it fits in L tokens (RULER's rule), at least 98% of it.

Grid: length x depth x trial. A trial is one scene (keys, values, distractor depths, haystack), the same at
every length and depth, so lengths and depths pair on the same needles. The queried needles go at `depth`
(the first) and spread evenly over the rest of the haystack after it (vt: the chain in order); distractors at
seeded depths of the trial. Prompts of one length share their haystack up to the shallowest needle and are
run through the prefix cache (tasks.kit.run_cells): the haystack is prefilled once per cell, not once per
prompt.

`shared_haystack=True` (niah_multikey only): the trials share one haystack (trial 0's) and one set of
max(4, trials) keys, whose needles sit together at `depth`, in key order; trial t asks key t, the others are
its distractors. Prompts of a depth then differ only in the question, so a cell prefills its haystack once per
depth, however deep the needles. The trials are not independent documents: they share the haystack, the
needles and their place.

Scoring (`scoring`: "likelihood", "generate" or "both"; every row per prompt, n = 1, with depth, trial and the
variant as `doc` set: a prompt is one unit of the results layer's intervals and pairing):
- generate: greedy, then RULER's `string_match_all` (lm-eval's common_utils): the prediction stripped, control
  characters made newlines; the share of the reference strings found in it, case-insensitive. Metrics
  `string_match_all` (that share) and `all_found` (0/1: every reference found).
- likelihood: the true answer (" v1, v2, ..." after the answer prefix) against `candidates` wrong answers of
  the same format: distractor values first (multikey: the other keys' values; multiquery: the values bound to
  the wrong keys), then random ones. Metrics `answer_logprob` (mean log-probability per token of the true
  answer), `answer_rank` (1 = best of 1 + candidates, ties in the answer's favour) and `answer_top1` (0/1:
  rank 1).
Plus `prompt_tokens`.
"""

from __future__ import annotations

import random
import re
import string
import time
from dataclasses import dataclass

from tqdm.auto import tqdm

from .common import check_lengths, encoder, prefix_options, record, special_prefix
from .data import iter_corpus
from .errors import TaskError
from .kit import (
    choice,
    choices,
    declare,
    flag,
    fractions,
    greedy,
    largest_fitting,
    optional_flag,
    positive,
    positive_or_none,
    run_cells,
)
from .passkey import MIX, cut_haystack, haystack_sentences
from .scoring import continuation_logprobs

VARIANTS = ("niah_multikey", "niah_multivalue", "niah_multiquery", "vt")
SCORINGS = ("likelihood", "generate", "both")
NEEDLES = 4  # RULER: niah_multikey_1 has 4 keys, niah_multivalue 4 values, niah_multiquery 4 queries
HOPS = 4  # RULER vt: one chain of 4 hops (5 variables)
NEW_TOKENS = {"vt": 30}  # RULER's tokens_to_generate: 128 for the needle tasks, 30 for vt
MIN_FILL = 0.98  # a prompt fills at least this share of its token budget

NIAH_TEMPLATE = (
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. I will "
    "quiz you about the {type_v} afterwards.\n{context}\nWhat are all the special magic {type_v} for "
    "{query} mentioned in the provided text?"
)
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER = (
    "Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assgined the value {query}, they are:"
)  # RULER's spelling, kept: the prompt is RULER's
ADJECTIVES = (
    "ancient",
    "bitter",
    "brave",
    "calm",
    "clever",
    "crooked",
    "curious",
    "damp",
    "eager",
    "faint",
    "fierce",
    "gentle",
    "glossy",
    "hollow",
    "humble",
    "icy",
    "jolly",
    "lively",
    "lucky",
    "mellow",
    "narrow",
    "noisy",
    "polite",
    "proud",
    "quiet",
    "rapid",
    "rusty",
    "shiny",
    "silent",
    "sturdy",
    "tender",
    "tidy",
    "vast",
    "wicked",
    "witty",
    "zealous",
)
NOUNS = (
    "anchor",
    "badger",
    "bridge",
    "candle",
    "canyon",
    "castle",
    "cherry",
    "comet",
    "desert",
    "falcon",
    "feather",
    "forest",
    "garden",
    "glacier",
    "harbor",
    "helmet",
    "island",
    "jacket",
    "kettle",
    "ladder",
    "lantern",
    "meadow",
    "mirror",
    "needle",
    "orchard",
    "pebble",
    "pepper",
    "rabbit",
    "saddle",
    "shovel",
    "spider",
    "teapot",
    "tunnel",
    "valley",
    "violin",
    "whistle",
)


@dataclass(frozen=True)
class Scene:
    """One trial of a variant: what is hidden and asked. `needles` hold the queried ones first (`queried` of
    them, in text order), then the distractors (at `distractor_depths`). `answers`: the strings the answer
    must contain (RULER's `outputs`); `wrong`: wrong answers of the same format, for the likelihood ranking.
    `together` (shared_haystack): `needles` are every key's in key order, all at `depth`, whichever key is
    asked."""

    variant: str
    needles: tuple[str, ...]
    queried: int
    distractor_depths: tuple[float, ...]
    question: str  # the template with `{context}` left to fill
    answer_prefix: str
    answers: tuple[str, ...]
    wrong: tuple[tuple[str, ...], ...]
    together: bool = (
        False  # every needle at `depth`, in needle order (shared_haystack: the same in each trial)
    )


def answer_text(values) -> str:
    """An answer as the likelihood scoring continues the answer prefix with it."""
    return " " + ", ".join(values)


def _number(rng: random.Random) -> str:
    return str(rng.randint(10**6, 10**7 - 1))  # RULER's 7-digit values


def _variable(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_uppercase, k=5))  # RULER vt's variable names


def _distinct(draw, rng: random.Random, count: int, taken: set) -> list[str]:
    out = []
    while len(out) < count:
        v = draw(rng)
        if v not in taken:
            taken.add(v)
            out.append(v)
    return out


def _keys(rng: random.Random, count: int) -> list[str]:
    return rng.sample([f"{a}-{n}" for a in ADJECTIVES for n in NOUNS], count)


def niah_question(query: str, *, plural: bool) -> tuple[str, str]:
    """RULER's NIAH question and answer prefix for `query` (one key, or several joined); one answer takes
    RULER's singular wording (on the template, before the query goes in)."""
    if plural:
        question = NIAH_TEMPLATE.replace("{type_v}", "numbers")
        prefix = f"The special magic numbers for {query} mentioned in the provided text are"
    else:
        question = NIAH_TEMPLATE.replace("Some", "A").replace("are all", "is").replace("are", "is")
        question = question.replace("{type_v}", "number")
        prefix = f"The special magic number for {query} mentioned in the provided text is"
    return question.replace("{query}", query), prefix


def make_scene(variant: str, rng: random.Random, candidates: int) -> Scene:
    """The scene of one trial, drawn from `rng` alone (no hash(): the same in every process)."""
    if variant == "vt":
        return _vt_scene(rng, candidates)
    taken: set = set()
    n_keys = 1 if variant == "niah_multivalue" else NEEDLES
    keys = _keys(rng, n_keys)
    values = [_distinct(_number, rng, NEEDLES if variant == "niah_multivalue" else 1, taken) for _ in keys]
    asked = list(range(NEEDLES)) if variant == "niah_multiquery" else [0]
    if variant == "niah_multiquery":
        rng.shuffle(asked)  # the question's key order is not the text's
    answers = [v for i in asked for v in values[i]]
    needles = [
        NEEDLE.format(type_v="numbers", key=keys[i], value=v) for i in range(n_keys) for v in values[i]
    ]
    queried = len(answers)
    if variant == "niah_multiquery":  # text order: key 0, 1, 2, 3; the answer follows the question's order
        queried = NEEDLES
    distractors = needles[queried:]
    wrong: list[tuple[str, ...]] = []
    if variant == "niah_multikey":
        wrong = [tuple(values[i]) for i in range(1, n_keys)]  # the distractor keys' values
    elif variant == "niah_multiquery":
        wrong = [
            tuple(answers[r:] + answers[:r]) for r in range(1, len(answers))
        ]  # values bound to wrong keys
    while len(wrong) < candidates:
        wrong.append(tuple(_distinct(_number, rng, len(answers), taken)))
    query = ", ".join(keys[i] for i in asked[:-1]) + ", and " + keys[asked[-1]] if len(asked) > 1 else keys[0]
    question, prefix = niah_question(query, plural=len(answers) > 1)
    depths = tuple(rng.random() for _ in distractors)
    return Scene(
        variant,
        tuple(needles[:queried] + distractors),
        queried,
        depths,
        question,
        prefix,
        tuple(answers),
        tuple(wrong[:candidates]),
    )


def shared_scenes(rng: random.Random, trials: int, candidates: int) -> list[Scene]:
    """The niah_multikey scenes of `shared_haystack`, drawn from `rng` alone: max(NEEDLES, trials) keys with
    distinct values, one needle each, together in key order; trial t asks key t (wrong answers: the other
    keys' values first, then random ones)."""
    taken: set = set()
    keys = _keys(rng, max(NEEDLES, trials))
    values = _distinct(_number, rng, len(keys), taken)
    needles = tuple(
        NEEDLE.format(type_v="numbers", key=k, value=v) for k, v in zip(keys, values, strict=True)
    )
    scenes = []
    for t in range(trials):
        wrong = [(v,) for i, v in enumerate(values) if i != t][:candidates]
        while len(wrong) < candidates:
            wrong.append(tuple(_distinct(_number, rng, 1, taken)))
        question, prefix = niah_question(keys[t], plural=False)
        scenes.append(
            Scene(
                "niah_multikey",
                needles,
                1,
                (),
                question,
                prefix,
                (values[t],),
                tuple(wrong),
                together=True,
            )
        )
    return scenes


def _vt_scene(rng: random.Random, candidates: int) -> Scene:
    taken: set = set()
    names = _distinct(_variable, rng, HOPS + 1, taken)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(HOPS)]
    wrong = [tuple(_distinct(_variable, rng, HOPS + 1, taken)) for _ in range(candidates)]
    question = VT_TEMPLATE.replace("{query}", value)
    return Scene(
        "vt",
        tuple(chain),
        len(chain),
        (),
        question,
        VT_ANSWER.format(num_v=HOPS + 1, query=value),
        tuple(names),
        tuple(wrong),
    )


def needle_depths(scene: Scene, depth: float) -> list[float]:
    """Depth of each needle: the queried ones from `depth` on, evenly over the rest of the haystack; then the
    distractors' own. A `together` scene: every needle at `depth`."""
    if scene.together:
        return [depth] * len(scene.needles)
    step = (1.0 - depth) / scene.queried
    return [depth + k * step for k in range(scene.queried)] + list(scene.distractor_depths)


def compose(scene: Scene, haystack: list[str], depth: float) -> tuple[str, str]:
    """(user text, answer prefix): the needles at the sentence boundaries nearest their depths (as a share of
    the haystack's characters), in needle order where several meet."""
    offsets, total = [0], 0
    for s in haystack:
        total += len(s) + 1
        offsets.append(total)
    at = [
        min(range(len(offsets)), key=lambda i, d=d: abs(offsets[i] - d * total))
        for d in needle_depths(scene, depth)
    ]
    order = sorted(range(len(scene.needles)), key=lambda k: (at[k], k))
    pieces, next_needle = [], 0
    for i in range(len(haystack) + 1):
        while next_needle < len(order) and at[order[next_needle]] == i:
            pieces.append(scene.needles[order[next_needle]])
            next_needle += 1
        if i < len(haystack):
            pieces.append(haystack[i])
    return scene.question.replace("{context}", " ".join(pieces)), scene.answer_prefix


def plain_text(parts: tuple[str, str]) -> str:
    """A prompt as one text, as lm-eval writes RULER's: the input, a space, the answer prefix."""
    user, answer_prefix = parts
    return f"{user} {answer_prefix}"


def build_prompt(
    tokenizer, budget: int, scene: Scene, depth: float, sentences: list[str], prefix: list[int]
) -> list[int]:
    """Token ids of the longest prompt with at most `budget` tokens (`prefix` + the text)."""
    encode = encoder(tokenizer)

    def n_tokens(words: int) -> int:
        return len(prefix) + len(encode(plain_text(compose(scene, cut_haystack(sentences, words), depth))))

    words = largest_fitting(n_tokens, sum(len(s.split()) for s in sentences), budget)
    if words < 0:
        raise TaskError(
            f"a budget of {budget} tokens is too short for the {scene.variant} prompt itself "
            f"({n_tokens(0)} tokens without haystack) — use longer lengths"
        )
    if n_tokens(words) < MIN_FILL * budget:
        raise TaskError(
            f"could only build a {n_tokens(words)}-token {scene.variant} prompt for {budget} tokens — "
            "use longer lengths"
        )
    return prefix + encode(plain_text(compose(scene, cut_haystack(sentences, words), depth)))


def string_match_all(prediction: str, references) -> float:
    """RULER's score of one sample (lm-eval common_utils.postprocess_pred + string_match_all): the prediction
    stripped, control characters as newlines; the share of references found in it, case-insensitive."""
    pred = re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip().lower()
    return sum(r.lower() in pred for r in references) / len(references)


def _reserve(tokenizer, scene: Scene, scoring: str, max_new_tokens: int | None) -> int:
    """Tokens after the prompt: those generated and/or the longest answer scored (RULER: prompt + these
    <= L)."""
    encode = encoder(tokenizer)
    scored = max(len(encode(answer_text(a))) for a in (scene.answers, *scene.wrong))
    generated = max_new_tokens or NEW_TOKENS.get(scene.variant, 128)
    return {"likelihood": scored, "generate": generated, "both": max(scored, generated)}[scoring]


def fits(lengths: list[int], options: dict, corpus: str, tokenizer) -> None:
    """The shortest length must hold each variant's prompt without haystack plus what follows it."""
    if tokenizer is None:
        return
    prefix = special_prefix(tokenizer, options.get("add_bos"))
    variants = options.get("variants", VARIANTS[:1])
    for variant in [variants] if isinstance(variants, str) else variants:
        scene = make_scene(variant, random.Random(0), options.get("candidates", 9))
        if options.get("shared_haystack"):  # all the trials' needles in every prompt
            scene = shared_scenes(random.Random(0), options.get("trials", 2), options.get("candidates", 9))[0]
        bare = len(prefix) + len(encoder(tokenizer)(plain_text(compose(scene, [], 0.0))))
        need = bare + _reserve(
            tokenizer, scene, options.get("scoring", "likelihood"), options.get("max_new_tokens")
        )
        if lengths[0] <= need:
            raise TaskError(
                f"retrieval length {lengths[0]} is too short for the {variant} prompt itself ({bare} "
                f"tokens without haystack, plus {need - bare} after it) — use lengths > {need}, e.g. "
                "2048"
            )


def _shared_needs_multikey(options: dict) -> str | None:
    variants = options.get("variants", VARIANTS[:1])
    variants = [variants] if isinstance(variants, str) else list(variants)
    if options.get("shared_haystack") and variants != ["niah_multikey"]:
        return (
            f"option shared_haystack=True takes only variants=niah_multikey, not {variants} — "
            "drop the other variants or shared_haystack"
        )
    return None


@declare(
    "retrieval",
    options={
        "variants": choices(*VARIANTS),
        "scoring": choice(*SCORINGS),
        "depths": fractions,
        "trials": positive,
        "candidates": positive,
        "haystack": choice("filler", "corpus"),
        "max_new_tokens": positive_or_none,
        "add_bos": optional_flag,
        "share_prefix": flag,
        "shared_haystack": flag,
    },
    metrics={
        "answer_logprob": "likelihood: mean log-probability per token of the true answer",
        "answer_rank": "likelihood: rank of the true answer among 1 + candidates (1 = best)",
        "answer_top1": "likelihood, 0/1: the true answer ranks first",
        "string_match_all": "generate: RULER's score, the share of the references in the greedy answer",
        "all_found": "generate, 0/1: every reference is in the greedy answer",
        "prompt_tokens": "tokens of the prompt",
    },
    pass_fail=("answer_top1", "all_found"),
    tables=(
        ("answer_top1", "retrieval: the true answer ranks first (likelihood)"),
        ("all_found", "retrieval: every reference in the greedy answer (generate)"),
    ),
    together=_shared_needs_multikey,
    fits=fits,
    needs_tokenizer=lambda lengths, options: True,
)
def run(
    model,
    tokenizer,
    *,
    lengths,
    variants=("niah_multikey",),
    scoring="likelihood",
    depths=(0.0, 0.5, 1.0),
    trials=2,
    candidates=9,
    haystack="filler",
    corpus="sotu",
    max_new_tokens=None,
    add_bos=None,
    share_prefix=True,
    shared_haystack=False,
    seed=0,
    progress=True,
) -> list[dict]:
    lengths = check_lengths(lengths)
    variants = [variants] if isinstance(variants, str) else list(dict.fromkeys(variants))
    depths = [float(d) for d in ([depths] if isinstance(depths, (int, float)) else depths)]
    texts = [d.text for d in iter_corpus(corpus)] if haystack == "corpus" else None
    if texts is not None and not any(t.strip() for t in texts):
        raise TaskError(f"corpus {corpus!r} is empty — use another corpus or haystack='filler'")
    prefix = special_prefix(tokenizer, add_bos)
    common = {
        "scoring": scoring,
        "haystack": haystack,
        "trials": trials,
        "depths": depths,
        "candidates": candidates,
        "max_new_tokens": max_new_tokens,
        **prefix_options(tokenizer, prefix, add_bos),
    }
    if haystack == "corpus":
        common["haystack_corpus"] = corpus
    if shared_haystack:  # recorded only when set: rows of the default runs keep their options
        common["shared_haystack"] = True
    sentences = [
        haystack_sentences(texts, random.Random(seed * MIX + trial), words=int(1.5 * lengths[-1]) + 64)
        for trial in range(1 if shared_haystack else trials)
    ]
    if shared_haystack:  # checked: niah_multikey only; one draw (-1: no trial's seed) for all the trials
        rng = random.Random((seed * MIX + VARIANTS.index("niah_multikey")) * MIX - 1)
        scenes = {("niah_multikey", t): s for t, s in enumerate(shared_scenes(rng, trials, candidates))}
        sentences = sentences * trials
    else:
        scenes = {
            (v, t): make_scene(v, random.Random((seed * MIX + VARIANTS.index(v)) * MIX + t), candidates)
            for v in variants
            for t in range(trials)
        }
    # tokens after each prompt; shared_haystack: the most any trial needs, so that every trial cuts the same
    # haystack
    reserve = {key: _reserve(tokenizer, scene, scoring, max_new_tokens) for key, scene in scenes.items()}
    if shared_haystack:
        reserve = dict.fromkeys(reserve, max(reserve.values()))

    cells, where, build_secs = (
        {},
        {},
        {},
    )  # length -> prompts; (length, i) -> (variant, trial, depth), seconds
    for length in lengths:
        cells[length] = []
        for (variant, trial), scene in scenes.items():
            budget = length - reserve[variant, trial]
            for depth in depths:
                t0 = time.perf_counter()
                cells[length].append(build_prompt(tokenizer, budget, scene, depth, sentences[trial], prefix))
                where[length, len(cells[length]) - 1] = (variant, trial, depth)
                build_secs[length, len(cells[length]) - 1] = time.perf_counter() - t0
    encode = encoder(tokenizer)

    def score(ids, cache, at) -> dict:
        variant, trial, _ = where[at]
        return score_prompt(
            model, tokenizer, ids, scenes[variant, trial], scoring, max_new_tokens, cache, encode
        )

    bar = tqdm(total=sum(map(len, cells.values())), desc=f"retrieval {scoring}", disable=not progress)
    # one cell per length (dynamic methods see the cell's length; RULER: prompt + what follows <= L); its
    # prompts share the haystack up to the shallowest needle, prefilled once (tasks.kit.run_cells)
    scored = run_cells(model, cells, score, share_prefix=share_prefix, bar=bar)
    bar.close()
    records = []
    for length in lengths:
        for i, (metrics, secs) in enumerate(scored[length]):
            variant, trial, depth = where[length, i]
            options = {"variant": variant, **common}
            name = corpus if haystack == "corpus" else "filler"
            for metric, value in {**metrics, "prompt_tokens": len(cells[length][i])}.items():
                records.append(
                    record(
                        "retrieval",
                        name,
                        length,
                        metric,
                        value,
                        1,
                        build_secs[length, i] + secs,
                        options,
                        depth=depth,
                        trial=trial,
                        doc=variant,  # the unit is variant x depth x trial: results pair and pool by it
                    )
                )
    return records


def score_prompt(
    model, tokenizer, ids: list[int], scene: Scene, scoring: str, max_new_tokens: int | None, cache, encode
) -> dict[str, float]:
    """The metrics of one prompt: likelihood (the true answer among the wrong ones) and/or generate (greedy,
    RULER's string match); both run on one prefilled prompt."""
    out = {}
    if scoring in ("likelihood", "both"):
        answers = [encode(answer_text(a)) for a in (scene.answers, *scene.wrong)]
        means = [
            lp.double().mean().item() for lp in continuation_logprobs(model, ids, answers, prefix_cache=cache)
        ]
        rank = 1 + sum(m > means[0] for m in means[1:])
        out.update(answer_logprob=means[0], answer_rank=float(rank), answer_top1=float(rank == 1))
    if scoring in ("generate", "both"):
        prediction = greedy(
            model, tokenizer, ids, max_new_tokens or NEW_TOKENS.get(scene.variant, 128), cache
        )
        match = string_match_all(prediction, scene.answers)
        out.update(string_match_all=match, all_found=float(match == 1.0))
    return out
