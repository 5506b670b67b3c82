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

`shared_haystack=True` (niah_multikey only): one haystack holds max(4, trials x depths) keys, one
needle each: the keys of depth d (`trials` of them, in key order) at d, any extra ones (fewer than 4 asked)
at the first depth. Each question asks one key, so the (depth, trial) grid asks each key at its own distance
from the question, and every prompt differs only in the question: a cell prefills the haystack once, however
many depths and trials, and each question is a short continuation on its KV cache. `haystacks=N` draws N
such haystacks (own keys, values and, for a corpus haystack, own text; the same in every method's run);
their filler before the first needle is shared too. The questions about one haystack are not independent:
its rows share `cluster` "haystack-<h>" (results count them as one unit); without shared_haystack every
trial is its own haystack and `cluster` is None.

Every row records `distance`: the tokens from the first token of the needle the question asks about (the first
queried one in text order) to the first token of the question, counted on the tokenized prompt.

Scoring (`scoring`: "likelihood", "generate" or "both"; every row per prompt, n = 1, with depth, trial and the
variant as `doc` set: results pair prompts across methods by them, and count a prompt, or a shared haystack's
`cluster`, as one unit):
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
    Metric,
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
from .passkey import MIX, cut_haystack, encode_located, haystack_sentences
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
    `placed` (shared_haystack): each needle's own depth (the prompt's depth is then ignored); `asked`: the
    index of the needle whose distance from the question the rows record."""

    variant: str
    needles: tuple[str, ...]
    queried: int
    distractor_depths: tuple[float, ...]
    question: str  # the template with `{context}` left to fill
    answer_prefix: str
    answers: tuple[str, ...]
    wrong: tuple[tuple[str, ...], ...]
    placed: tuple[float, ...] = ()  # shared_haystack: every needle's depth, the same in every question
    asked: int = 0


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


def shared_scenes(rng: random.Random, trials: int, candidates: int, depths=(0.0,)) -> list[Scene]:
    """The niah_multikey scenes of one `shared_haystack` haystack, drawn from `rng` alone, in (depth, trial)
    order: max(NEEDLES, trials x depths) keys with distinct values, one needle each; key di x trials + t sits
    at depths[di] and is asked by the scene of (depths[di], trial t); extra keys sit at depths[0]. Needles at
    one depth stand together in key order. Wrong answers: the other keys' values first, then random ones."""
    taken: set = set()
    asked = trials * len(depths)
    keys = _keys(rng, max(NEEDLES, asked))
    values = _distinct(_number, rng, len(keys), taken)
    needles = tuple(
        NEEDLE.format(type_v="numbers", key=k, value=v) for k, v in zip(keys, values, strict=True)
    )
    placed = tuple(float(depths[i // trials]) if i < asked else float(depths[0]) for i in range(len(keys)))
    scenes = []
    for t in range(asked):
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
                placed=placed,
                asked=t,
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
    distractors' own. A shared-haystack scene: each needle's own (`placed`)."""
    if scene.placed:
        return list(scene.placed)
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
    words = fit_words(tokenizer, budget, [scene], depth, sentences, prefix)
    return located_prompt(tokenizer, scene, depth, cut_haystack(sentences, words), prefix)[0]


def fit_words(
    tokenizer, budget: int, scenes: list[Scene], depth: float, sentences: list[str], prefix: list[int]
) -> int:
    """The most haystack words with which every scene's prompt has at most `budget` tokens: one cut for all
    (the scenes of a shared haystack then differ only in the question). Fitted on the scene with the longest
    bare prompt, then checked on all."""
    encode = encoder(tokenizer)

    def size(scene: Scene, words: int) -> int:
        return len(prefix) + len(encode(plain_text(compose(scene, cut_haystack(sentences, words), depth))))

    longest = max(scenes, key=lambda scene: size(scene, 0))
    words = largest_fitting(lambda w: size(longest, w), sum(len(s.split()) for s in sentences), budget)
    if words < 0:
        raise TaskError(
            f"a budget of {budget} tokens is too short for the {longest.variant} prompt itself "
            f"({size(longest, 0)} tokens without haystack) — use longer lengths"
        )
    while words > 0 and any(size(scene, words) > budget for scene in scenes if scene is not longest):
        words -= 1  # a word boundary can tokenize differently with another question after it
    if size(longest, words) < MIN_FILL * budget:
        raise TaskError(
            f"could only build a {size(longest, words)}-token {longest.variant} prompt for {budget} "
            "tokens — use longer lengths"
        )
    return words


def located_prompt(
    tokenizer, scene: Scene, depth: float, haystack: list[str], prefix: list[int]
) -> tuple[list[int], int]:
    """The prompt's ids (`prefix` + the text) and the tokens from the asked needle's first token (the first
    queried needle) to the question's first token."""
    user, answer_prefix = compose(scene, haystack, depth)
    tail = scene.question.split("{context}", 1)[1]  # after the context: a newline, then the question
    question_at = len(user) - len(tail.lstrip())
    text = plain_text((user, answer_prefix))
    ids, distance = encode_located(tokenizer, text, user.index(scene.needles[scene.asked]), question_at)
    return list(prefix) + ids, distance


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
        if options.get("shared_haystack"):  # every question's needle in every prompt
            depths = options.get("depths", (0.0, 0.5, 1.0))
            depths = [depths] if isinstance(depths, (int, float)) else depths
            scene = shared_scenes(
                random.Random(0), options.get("trials", 2), options.get("candidates", 9), depths
            )[0]
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


def _options_together(options: dict) -> str | None:
    """shared_haystack asks one key per question (niah_multikey alone); several haystacks need it."""
    variants = options.get("variants", VARIANTS[:1])
    variants = [variants] if isinstance(variants, str) else list(variants)
    if options.get("shared_haystack") and variants != ["niah_multikey"]:
        return (
            f"option shared_haystack=True takes only variants=niah_multikey, not {variants} — "
            "drop the other variants or shared_haystack"
        )
    if options.get("haystacks", 1) != 1 and not options.get("shared_haystack"):
        return (
            f"option haystacks={options['haystacks']} takes shared_haystack=true (without it every trial "
            "is its own haystack already) — set shared_haystack: true or use trials"
        )
    return _within_pools(options, variants)


KEY_POOL = len(ADJECTIVES) * len(NOUNS)  # the adjective-noun keys
# What an answer draws from: (the pool's size, items per answer); a scene's draws stay under half its pool, so
# that drawing distinct items by rejection stays fast
ANSWER_POOLS = {
    "niah_multikey": (9 * 10**6, 1),  # RULER's 7-digit values
    "niah_multivalue": (9 * 10**6, NEEDLES),
    "niah_multiquery": (9 * 10**6, NEEDLES),
    "vt": (26**5, HOPS + 1),  # 5-letter variable names
}


def _within_pools(options: dict, variants: list[str]) -> str | None:
    """Refuse, before any model loads, a grid the scene generator cannot draw: more keys for one shared
    haystack than there are keys, or more wrong answers than the values (or names) allow."""
    trials = options.get("trials", 2)
    depths = options.get("depths", (0.0, 0.5, 1.0))
    asked = trials * (1 if isinstance(depths, (int, float)) else len(depths))
    if options.get("shared_haystack") and isinstance(trials, int) and asked > KEY_POOL:
        return (
            f"option shared_haystack=True with trials={trials} asks {asked} keys of one haystack (trials x "
            f"depths), more than the {KEY_POOL} keys there are — use at most {KEY_POOL} (trials x depths), "
            "or several haystacks (haystacks: N)"
        )
    candidates = options.get("candidates", 9)
    if not isinstance(candidates, int) or isinstance(candidates, bool):
        return None  # its own check says what is wrong
    for variant in variants:
        pool, each = ANSWER_POOLS.get(variant, (0, 0))
        if pool and (candidates + 1) * each + NEEDLES > pool // 2:
            most = (pool // 2 - NEEDLES) // each - 1
            return (
                f"option candidates={candidates} needs {(candidates + 1) * each} distinct answers' items for "
                f"{variant}, more than half of the {pool} there are — use candidates <= {most}, e.g. 9"
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
        "haystacks": positive,
    },
    # the questions that share one haystack (shared_haystack) are one independent unit: their rows carry one
    # cluster id
    metrics={
        "answer_logprob": Metric(
            "mean",
            "higher",
            "nats/token",
            "mean log-probability per token of the true answer",
            hi=0.0,
            independent_unit="haystack",
        ),
        "answer_rank": Metric(
            "rank",
            "lower",
            "rank (1 = first)",
            "rank of the true answer among the candidates",
            role="detail",
            lo=1.0,
            independent_unit="haystack",
        ),
        "answer_top1": Metric(
            "rate",
            "higher",
            "fraction of prompts",
            "the true answer ranks first among the candidates",
            reach=("threshold", "trained"),
            independent_unit="haystack",
            lo=0.0,
            hi=1.0,
        ),
        "string_match_all": Metric(
            "mean",
            "higher",
            "fraction of references",
            "RULER's score: share of the references in the answer",
            lo=0.0,
            hi=1.0,
            independent_unit="haystack",
        ),
        "all_found": Metric(
            "rate",
            "higher",
            "fraction of prompts",
            "every reference is in the greedy answer",
            reach=("threshold", "trained"),
            independent_unit="haystack",
            lo=0.0,
            hi=1.0,
        ),
        "prompt_tokens": Metric(
            "mean", None, "tokens", "tokens of the prompt", role="detail", independent_unit="haystack"
        ),
    },
    tables=(
        ("answer_top1", "retrieval: the true answer ranks first (likelihood)"),
        ("all_found", "retrieval: every reference in the greedy answer (generate)"),
    ),
    together=_options_together,
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
    haystacks=1,
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
        common.update(shared_haystack=True, haystacks=haystacks)
    words = int(1.5 * lengths[-1]) + 64
    if shared_haystack:
        stacks = shared_haystacks(texts, seed, haystacks, trials, candidates, depths, words)
    else:
        stacks = own_haystacks(texts, seed, variants, trials, candidates, words)
    # tokens after each prompt: the most any question of a haystack needs, so that they cut it alike
    reserve = [
        max(_reserve(tokenizer, q.scene, scoring, max_new_tokens) for q in stack.questions)
        for stack in stacks
    ]

    cells: dict[int, list[list[int]]] = {}
    where: dict[tuple[int, int], tuple[Question, int, float]] = {}  # (length, i) -> question, distance, secs
    for length in lengths:
        cells[length] = []
        for stack, after in zip(stacks, reserve, strict=True):
            for question, ids, distance, secs in stack.prompts(tokenizer, length - after, depths, prefix):
                where[length, len(cells[length])] = (question, distance, secs)
                cells[length].append(ids)
    encode = encoder(tokenizer)

    def score(ids, cache, at) -> dict:
        return score_prompt(model, tokenizer, ids, where[at][0].scene, scoring, max_new_tokens, cache, encode)

    bar = tqdm(total=sum(map(len, cells.values())), desc=f"retrieval {scoring}", disable=not progress)
    # one cell per length (dynamic methods see the cell's length; RULER: prompt + what follows <= L); its
    # prompts share the haystack up to the first needle where they differ (a shared haystack: up to the
    # question), prefilled once (tasks.kit.run_cells)
    scored = run_cells(model, cells, score, share_prefix=share_prefix, bar=bar)
    bar.close()
    records = []
    name = corpus if haystack == "corpus" else "filler"
    for length in lengths:
        for i, (metrics, secs) in enumerate(scored[length]):
            question, distance, build_secs = where[length, i]
            options = {"variant": question.scene.variant, **common}
            for metric, value in {**metrics, "prompt_tokens": len(cells[length][i])}.items():
                row = record(
                    "retrieval",
                    name,
                    length,
                    metric,
                    value,
                    1,
                    build_secs + secs,
                    options,
                    depth=question.depth,
                    trial=question.trial,
                    doc=question.scene.variant,  # results pair by variant x depth x trial (x length)
                )
                records.append({**row, "distance": distance, "cluster": question.cluster})
    return records


@dataclass(frozen=True)
class Question:
    """One prompt's question: its scene, the depth it is recorded at, its trial number (unique in the cell
    per variant and depth) and its cluster (None: its own haystack)."""

    scene: Scene
    depth: float | None  # None: asked at every depth of the grid (its own haystack)
    trial: int
    cluster: str | None = None


@dataclass
class Haystack:
    """The text one or more questions are asked about (`shared`: all of them on one cut of it, whatever
    their depth; else each question at its own depth cuts it for itself)."""

    sentences: list[str]
    questions: list[Question]
    shared: bool = False

    def prompts(self, tokenizer, budget: int, depths: list[float], prefix: list[int]):
        """(question, ids, distance, seconds to build) of every prompt on this haystack at `budget`
        tokens: a shared haystack is cut once for all its questions (they then differ only in the
        question); otherwise each question is asked at each depth, on its own cut."""
        if self.shared:
            t0 = time.perf_counter()
            scenes = [q.scene for q in self.questions]
            cut = cut_haystack(
                self.sentences, fit_words(tokenizer, budget, scenes, 0.0, self.sentences, prefix)
            )
            each = (time.perf_counter() - t0) / len(scenes)
            for q in self.questions:
                t0 = time.perf_counter()
                ids, distance = located_prompt(tokenizer, q.scene, q.depth, cut, prefix)
                yield q, ids, distance, each + time.perf_counter() - t0
            return
        for q in self.questions:
            for depth in depths:
                t0 = time.perf_counter()
                words = fit_words(tokenizer, budget, [q.scene], depth, self.sentences, prefix)
                ids, distance = located_prompt(
                    tokenizer, q.scene, depth, cut_haystack(self.sentences, words), prefix
                )
                yield Question(q.scene, depth, q.trial), ids, distance, time.perf_counter() - t0


def own_haystacks(
    texts, seed: int, variants: list[str], trials: int, candidates: int, words: int
) -> list[Haystack]:
    """Without shared_haystack: trial t of each variant is its own scene on trial t's haystack text (the
    variants share it), asked at every depth; each row its own unit."""
    stacks = []
    for v in variants:
        for t in range(trials):
            scene = make_scene(v, random.Random((seed * MIX + VARIANTS.index(v)) * MIX + t), candidates)
            text = haystack_sentences(texts, random.Random(seed * MIX + t), words=words)
            stacks.append(Haystack(text, [Question(scene, None, t)]))
    return stacks


def shared_haystacks(
    texts, seed: int, haystacks: int, trials: int, candidates: int, depths: list[float], words: int
) -> list[Haystack]:
    """shared_haystack: `haystacks` draws, each with its own keys, values and text (haystack h: the seeds
    of trial h), each asked trials x depths questions; trial numbers run on over the haystacks (h x trials +
    t), so that every question of a cell has its own (depth, trial)."""
    stacks = []
    for h in range(haystacks):  # -1 - h: no trial's seed (haystack 0 draws what the single haystack drew)
        rng = random.Random((seed * MIX + VARIANTS.index("niah_multikey")) * MIX - 1 - h)
        scenes = shared_scenes(rng, trials, candidates, depths)
        questions = [
            Question(scenes[di * trials + t], depth, h * trials + t, f"haystack-{h}")
            for di, depth in enumerate(depths)
            for t in range(trials)
        ]
        text = haystack_sentences(texts, random.Random(seed * MIX + h), words=words)
        stacks.append(Haystack(text, questions, shared=True))
    return stacks


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
