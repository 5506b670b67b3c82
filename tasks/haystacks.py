"""The haystack a retrieval scene stands in (tasks/retrieval.py: the task; tasks/scenes.py: the scenes),
composed and sized to a length.

Haystacks (`haystack`; unset: RULER's of each variant): "noise" (RULER's repeat haystack, a needle per line),
"essay" (a corpus's sentences, RULER's joins and quirks kept) and "filler" (ropebench's earlier haystack).
Rows record `haystack`, `haystack_corpus` and `ruler_haystack`: a deviation from RULER shows as a difference.
Length (`length_rule`): "lm-eval" (default: lm-eval 0.4.13's ruler rule, the haystack grown in steps while
the input plus what is generated fits in L; tests/tasks/test_ruler_lm_eval.py compares the prompts with
lm-eval's) or "fill" (ropebench's earlier rule: at least 98% of L). Each in full: docs/tasks.md, "Retrieval".
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass

from .common import encoder, interleave
from .data import seeded_order
from .errors import TaskError
from .kit import largest_fitting

# plain_text (input, a space, the answer prefix) is also how lm-eval writes RULER's prompts
from .passkey import MIX, cut_haystack, encode_located, haystack_sentences, plain_text
from .scenes import (
    VARIANT_TABLE,
    VARIANTS,
    Scene,
    answer_text,
    make_scene,
    needle_depths,
    shared_scenes,
    with_example,
)
from .variable_tracking import NOISE, sized_text, vt_context

ESSAY_STEP = 500  # lm-eval's essay step, in words
MIN_FILL = 0.98  # length_rule "fill": a prompt fills at least this share of its token budget


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
        context = "\n".join(interleave(pieces, needles, at))
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
    pieces = interleave(haystack, [scene.needles[k] for k in order], [at[k] for k in order])
    return scene.example + scene.question.replace("{context}", " ".join(pieces)), scene.answer_prefix


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
        if self.kind == "essay":
            return len(self.words)
        return length // 16 + 1 if self.kind == "noise" else 2 * length


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
