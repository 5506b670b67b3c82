"""RULER-style retrieval (Hsieh et al. 2024, arXiv:2404.06654): needles among distractors, variable tracking.

Variants are rows of one table (`VARIANT_TABLE`, tasks/scenes.py), as RULER's generator (lm-eval 0.4.13's
`ruler.prepare_niah.generate_samples`) takes them as parameters: niah_single, niah_multikey, niah_multivalue,
niah_multiquery and vt (tasks/variable_tracking.py), with RULER's templates, needles and answer prefixes.
Haystacks (`haystack`) and length (`length_rule`): tasks/haystacks.py; the scenes (needles, keys, values,
wrong answers): tasks/scenes.py.

Grid: length x depth x trial; a trial is one scene, the same at every length and depth, so lengths and depths
pair on the same needles. Prompts of one length share their haystack up to the shallowest needle and run
through the prefix cache (tasks.kit.run_cells). With `shared_haystack=True` (niah_multikey) one haystack holds
every question's needle and its rows share one `cluster` (one independent unit). Every row records `distance`
(needle to question, tokens). Scoring: "generate" (RULER's `string_match_all`, `all_found`), "likelihood"
(the true answer ranked against hard negatives: `answer_logprob`, `answer_rank`, `answer_top1` and its
`chance`) or "both". The protocol in full, with each choice's reason: docs/tasks.md, "Retrieval".
"""

from __future__ import annotations

import re

from tqdm.auto import tqdm

from .common import check_lengths, encoder, prefix_options, record, special_prefix
from .data import iter_corpus
from .errors import TaskError
from .haystacks import (
    Question,
    _after,
    _new_tokens,
    essay_words_needed,
    own_haystacks,
    shared_haystacks,
    sized_tokens,
)
from .kit import (
    Metric,
    choice,
    choices,
    declare,
    flag,
    fractions,
    greedy,
    optional_choice,
    optional_flag,
    run_cells,
)
from .scenes import (
    ADJECTIVES,
    NEEDLES,
    NOUNS,
    VARIANT_TABLE,
    VARIANTS,
    Scene,
    Variant,
    answer_text,
    with_example,
)
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

SCORINGS = ("likelihood", "generate", "both")
HAYSTACKS = ("essay", "noise", "filler")
LENGTH_RULES = ("lm-eval", "fill")


def string_match_all(prediction: str, references) -> float:
    """RULER's score of one sample (lm-eval common_utils.postprocess_pred + string_match_all): the prediction
    stripped, control characters as newlines; the share of references found in it, case-insensitive."""
    pred = re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip().lower()
    return sum(r.lower() in pred for r in references) / len(references)


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

    # one cell per length (dynamic methods see the cell's length); its prompts share the haystack up to the
    # first needle where they differ (a shared haystack: up to the question), prefilled once (run_cells)
    with tqdm(total=sum(map(len, cells.values())), desc=f"retrieval {scoring}", disable=not progress) as bar:
        scored = run_cells(model, cells, score, share_prefix=share_prefix, bar=bar)
    records = []
    for length in lengths:
        for i, (metrics, secs) in enumerate(scored[length]):
            question, distance, build_secs = where[length, i]
            variant = question.scene.variant
            kind = kinds[variant]
            options = {"variant": variant, "haystack": kind, **common}
            if kind == "essay":
                options["haystack_corpus"] = corpus
            # a deviation shows as a difference
            options["ruler_haystack"] = VARIANT_TABLE[variant].ruler_haystack
            if "answer_top1" in metrics:
                metrics = {**metrics, "chance": 1.0 / (1 + len(question.scene.wrong))}
            name, secs = (corpus if kind == "essay" else kind), build_secs + secs
            # results pair by variant x depth x trial (x length)
            pairing = {"depth": question.depth, "trial": question.trial, "doc": variant}
            for metric, value in {**metrics, "prompt_tokens": len(cells[length][i])}.items():
                row = record("retrieval", name, length, metric, value, 1, secs, options, **pairing)
                records.append({**row, "distance": distance, "cluster": question.cluster})
    return records


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
