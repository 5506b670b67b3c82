"""RULER's needles (retrieval's scenes): the variant table, keys and values, the questions, and the wrong
answers the likelihood scoring ranks the true one against (tasks/retrieval.py: the task; tasks/haystacks.py:
the text the needles stand in)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from .common import encoder
from .variable_tracking import (
    VT_ANSWER,
    VT_TEMPLATE,
    Example,
    chain_of,
    draw_example,
    example_text,
    variable,
)


@dataclass(frozen=True)
class Variant:
    """One row of the variant table: RULER's generator settings for one task (lm-eval 0.4.13's
    `generate_samples` arguments) and ropebench's likelihood negatives.

    haystack: RULER's haystack kind ("essay" or "noise"); ruler_haystack: the data RULER fills it with.
    noise_steps: the noise haystack's step in blocks at >= 4096 tokens and below (lm-eval's `incremental`).
    sized_with_prefix: the length rule counts the answer prefix (lm-eval's vt does, its needle tasks do not).
    negatives: the likelihood's hard negatives: "distractors" (the other keys' values), "rotations" (the asked
    values bound to the wrong keys), "near_misses" (the answer with one value replaced) or "random"."""

    name: str
    ruler_task: str
    haystack: str
    ruler_haystack: str
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1
    type_needle_v: str = "numbers"  # numbers: 7-digit values; variables: vt's 5-letter names
    tokens_to_generate: int = 128
    hops: int = 0  # vt: the chain's assignments after the value
    noise_steps: tuple[int, int] = (25, 5)
    sized_with_prefix: bool = False
    negatives: str = "random"


ESSAYS = "paul_graham_essays"  # RULER's essay haystack (a hub dataset)
# RULER's settings (lm-eval 0.4.13 tasks/ruler: niah_utils.py, vt_utils.py and each task's yaml)
VARIANT_TABLE = {
    row.name: row
    for row in (
        Variant("niah_multikey", "niah_multikey_1", "essay", ESSAYS, num_needle_k=4, negatives="distractors"),
        Variant(
            "niah_multivalue", "niah_multivalue", "essay", ESSAYS, num_needle_v=4, negatives="near_misses"
        ),
        Variant(
            "niah_multiquery",
            "niah_multiquery",
            "essay",
            ESSAYS,
            num_needle_k=4,
            num_needle_q=4,
            negatives="rotations",
        ),
        Variant(
            "vt",
            "vt",
            "noise",
            "noise",
            type_needle_v="variables",
            tokens_to_generate=30,
            hops=4,
            noise_steps=(10, 10),  # lm-eval vt's incremental
            sized_with_prefix=True,
            negatives="near_misses",
        ),
        Variant("niah_single", "niah_single_1", "noise", "noise"),
    )
}
VARIANTS = tuple(VARIANT_TABLE)  # a variant's index seeds its scenes: new rows go last
NEEDLES = 4  # the most needles a scene of the table draws (the pool checks count them)
NEW_TOKENS = {row.name: row.tokens_to_generate for row in VARIANT_TABLE.values()}

NIAH_TEMPLATE = (
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. I will "
    "quiz you about the {type_v} afterwards.\n{context}\nWhat are all the special magic {type_v} for "
    "{query} mentioned in the provided text?"
)
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
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
    """One trial of a variant: what is hidden and asked. `needles` hold the asked ones first (`queried` of
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
    example_draw: Example | None = None  # vt: lm-eval's in-context example, as drawn (`with_example`)
    example: str = ""  # the text before the question (vt's in-context example, written for a tokenizer)
    example_tokens: int = 0  # what lm-eval's length rule counts for the example


def answer_text(values) -> str:
    """An answer as the likelihood scoring continues the answer prefix with it."""
    return " " + ", ".join(values)


def _number(rng: random.Random) -> str:
    return str(rng.randint(10**6, 10**7 - 1))  # RULER's 7-digit values


def _variable(rng: random.Random) -> str:
    return variable(rng)  # RULER vt's variable names


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


def near_misses(answers, rng: random.Random, draw, taken: set) -> list[tuple[str, ...]]:
    """Wrong answers made of in-context values: the answer with value i replaced by value i + 1 (one value
    repeated, one left out), then value i replaced by a value absent from the context. One value: only the
    latter."""
    answers = list(answers)
    n = len(answers)
    repeats = (
        [tuple(answers[:i] + [answers[(i + 1) % n]] + answers[i + 1 :]) for i in range(n)] if n > 1 else []
    )
    absent = [tuple(answers[:i] + _distinct(draw, rng, 1, taken) + answers[i + 1 :]) for i in range(n)]
    return repeats + absent


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
    """The scene of one trial, drawn from `rng` alone (no hash(): the same in every process), by the variant's
    row of the table: keys 0 .. num_needle_q - 1 are asked (in a shuffled order when several), the others are
    distractors; each key holds num_needle_v values."""
    row = VARIANT_TABLE[variant]
    if row.hops:
        return _vt_scene(rng, candidates, row)
    taken: set = set()
    keys = _keys(rng, max(row.num_needle_k, row.num_needle_q))
    values = [_distinct(_number, rng, row.num_needle_v, taken) for _ in keys]
    asked = list(range(row.num_needle_q))
    if len(asked) > 1:
        rng.shuffle(asked)  # the question's key order is not the text's
    answers = [v for i in asked for v in values[i]]  # RULER's order: the question's keys, each key's values
    needles = [NEEDLE.format(type_v="numbers", key=k, value=v) for k, vs in zip(keys, values) for v in vs]
    queried = row.num_needle_q * row.num_needle_v  # the asked keys' needles come first, in text order
    distractors = needles[queried:]
    wrong: list[tuple[str, ...]] = []
    if row.negatives == "distractors":
        wrong = [tuple(values[i]) for i in range(row.num_needle_q, len(keys))]
    elif row.negatives == "rotations":
        wrong = [tuple(answers[r:] + answers[:r]) for r in range(1, len(answers))]
    elif row.negatives == "near_misses":
        wrong = near_misses(answers, rng, _number, taken)
    while len(wrong) < candidates:
        wrong.append(tuple(_distinct(_number, rng, len(answers), taken)))
    query = ", ".join(keys[i] for i in asked[:-1]) + ", and " + keys[asked[-1]] if len(asked) > 1 else keys[0]
    question, prefix = niah_question(query, plural=len(answers) > 1)
    depths = tuple(rng.random() for _ in distractors)
    return Scene(
        variant,
        tuple(needles),
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
    keys = _keys(rng, max(VARIANT_TABLE["niah_multikey"].num_needle_k, asked))
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


def _vt_scene(rng: random.Random, candidates: int, row: Variant) -> Scene:
    taken: set = set()
    names = _distinct(_variable, rng, row.hops + 1, taken)
    value = str(rng.randint(10000, 99999))
    chain = chain_of(names, value)
    wrong = near_misses(names, rng, _variable, taken) if row.negatives == "near_misses" else []
    while len(wrong) < candidates:
        wrong.append(tuple(_distinct(_variable, rng, row.hops + 1, taken)))
    question = VT_TEMPLATE.replace("{query}", value)
    return Scene(
        row.name,
        tuple(chain),
        len(chain),
        (),
        question,
        VT_ANSWER.format(num_v=row.hops + 1, query=value),
        tuple(names),
        tuple(wrong[:candidates]),
        example_draw=draw_example(rng, row.hops),  # drawn last: the scene's other draws stay as they were
    )


def with_example(scene: Scene, tokenizer, prefix, rule: str) -> Scene:
    """A vt scene under length_rule "lm-eval" with its in-context example written for `tokenizer` (lm-eval
    sizes the example's noise with it); other scenes, and vt under "fill" (ropebench's earlier prompt, which
    the lm-eval export writes), as they are."""
    if scene.example_draw is None or scene.example or rule != "lm-eval":
        return scene
    encode = encoder(tokenizer)
    text, counted = example_text(scene.example_draw, lambda t: len(prefix) + len(encode(t)))
    return replace(scene, example=text, example_tokens=counted)


def needle_depths(scene: Scene, depth: float) -> list[float]:
    """Depth of each needle: the asked ones from `depth` on, evenly over the rest of the haystack; then the
    distractors' own. A shared-haystack scene: each needle's own (`placed`)."""
    if scene.placed:
        return list(scene.placed)
    step = (1.0 - depth) / scene.queried
    return [depth + k * step for k in range(scene.queried)] + list(scene.distractor_depths)
