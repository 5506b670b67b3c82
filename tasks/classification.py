"""Long-document classification with real labels, scored by label log-likelihood.

- zero-shot: the document truncated to fill L tokens, then a question listing the options; each
  label's continuation log-likelihood decides (`accuracy`: summed log-prob; `accuracy_norm`: mean
  per token). Documents shorter than the space they must fill are skipped and counted.
- many-shot: excerpts of labelled demonstration documents ("Speech: ...\\nEra: <label>\\n\\n"),
  packed until the prompt is exactly L tokens, then the query excerpt and "Era:"; scored the same way.

Splits are grouped (sotu: by president), seeded: demonstrations and queries never share a speaker.
Queries are drawn round-robin over labels so classes are as balanced as the split allows.
Prompts start with the ids the tokenizer's own encoding puts before text (`special_prefix`; add_bos overrides,
records say what was used). The prompts of one length are scored in the order that shares the most prefix
(`extend.prefix_cache`): many-shot demonstrations run once per length, not once per query (share_prefix=False:
every prompt from scratch; same predictions).
"""

from __future__ import annotations

import functools
import random
from collections import Counter, defaultdict
from dataclasses import dataclass

from tqdm.auto import tqdm

from .common import check_lengths, encoder, prefix_options, record, special_prefix
from .data import Document, iter_corpus
from .errors import TaskError
from .kit import (
    Metric,
    choice,
    declare,
    flag,
    fraction_open,
    optional_choice,
    optional_flag,
    run_cells,
)
from .scoring import continuation_logprobs
from .sizes import DOC_COST, MAX_DOCS, MAX_TOKENS, TOKEN_COST, at_most

ERAS = [
    (1790, 1860, "1790-1860"),
    (1861, 1913, "1861-1913"),
    (1914, 1960, "1914-1960"),
    (1961, 9999, "1961-present"),
]


@dataclass(frozen=True)
class LabelTask:
    name: str
    question: str  # zero-shot question; the options are appended
    field: str  # many-shot "Field: label" line

    def label(self, doc: Document) -> str | None:
        if self.name == "era":
            year = doc.meta.get("year")
            return next((name for lo, hi, name in ERAS if year is not None and lo <= year <= hi), None)
        if self.name == "party":  # the two-party era only: Democratic vs Republican from 1861 on
            party = doc.meta.get("party")
            ok = doc.meta.get("year", 0) >= 1861 and party in ("Democratic", "Republican")
            return party if ok else None
        value = doc.meta.get("label")
        return None if value is None else str(value)

    # The prompt pieces, shared by the task (which encodes them around a document's token ids) and the lm-eval
    # task (tasks/lm_eval_tasks/utils.py, which writes `zero_shot_text`): one definition of the prompt.
    @property
    def header(self) -> str:
        """What precedes every document, query or demonstration."""
        return "Document:\n" if self.name == "label" else "Speech:\n"

    def zero_shot_suffix(self, classes) -> str:
        """What follows the document in a zero-shot prompt: the question and its options."""
        return f"\n\nQuestion: {self.question} Options: {', '.join(classes)}.\nAnswer:"

    def zero_shot_text(self, excerpt: str, classes) -> str:
        """A zero-shot prompt as text (the task builds the same prompt from token ids)."""
        return self.header + excerpt + self.zero_shot_suffix(classes)


LABEL_TASKS = {
    "era": LabelTask("era", "In which era was this speech given?", "Era"),
    "party": LabelTask("party", "Which party did the president who gave this speech belong to?", "Party"),
    "label": LabelTask("label", "Which category does this document belong to?", "Label"),
}


@declare(
    "classification",
    options={
        "mode": choice("zero-shot", "many-shot"),
        "num_docs": at_most(MAX_DOCS, DOC_COST),
        "excerpt_tokens": at_most(MAX_TOKENS, TOKEN_COST),
        "demo_fraction": fraction_open,
        "label": optional_choice(*LABEL_TASKS),
        "add_bos": optional_flag,
        "share_prefix": flag,
    },
    # accuracies are graded against chance (the `chance` metric), not passed or failed: no reach rules
    metrics={
        "accuracy": Metric(
            "rate",
            "higher",
            "fraction of documents",
            "label by summed log-likelihood",
            chance_metric="chance",
            lo=0.0,
            hi=1.0,
        ),
        "macro_f1": Metric("mean", "higher", "F1", "macro F1", role="detail", lo=0.0, hi=1.0),
        "accuracy_norm": Metric(
            "rate",
            "higher",
            "fraction of documents",
            "label by mean log-likelihood per token",
            role="detail",
            chance_metric="chance",
            lo=0.0,
            hi=1.0,
        ),
        "macro_f1_norm": Metric(
            "mean", "higher", "F1", "macro F1 (mean log-likelihood)", role="detail", lo=0.0, hi=1.0
        ),
        "chance": Metric(
            "rate", None, "fraction of documents", "majority-class rate", role="reference", lo=0.0, hi=1.0
        ),
    },
    tables=(("accuracy", "classification accuracy"),),
)
def run(
    model,
    tokenizer,
    *,
    lengths,
    corpus="sotu",
    label=None,
    mode="zero-shot",
    num_docs=24,
    demo_fraction=0.5,
    excerpt_tokens=256,
    add_bos=None,
    share_prefix=True,
    seed=0,
    progress=True,
) -> list[dict]:
    lengths = check_lengths(lengths)
    label = label or ("era" if corpus == "sotu" else "label")
    if label not in LABEL_TASKS:
        raise TaskError(
            f"unknown label {label!r} — use one of {sorted(LABEL_TASKS)} ('label' = the corpus' "
            "own label field)"
        )
    if corpus != "sotu" and label != "label":
        raise TaskError(
            f"label {label!r} is defined for corpus 'sotu' only — use label='label' for {corpus!r}"
        )
    task = LABEL_TASKS[label]
    labelled = labelled_documents(corpus, task)
    if not labelled:
        raise TaskError(f"corpus {corpus!r} has no documents with a {label!r} label — check the label field")
    classes = sorted({y for _, y in labelled})
    if len(classes) < 2:
        raise TaskError(f"corpus {corpus!r} has a single class {classes} — classification needs two or more")
    demos, queries = grouped_split(labelled, demo_fraction, seed)

    encode = functools.lru_cache(maxsize=None)(encoder(tokenizer))  # documents are re-read per length
    bos = special_prefix(tokenizer, add_bos)
    answers = [encode(" " + c) for c in classes]
    options = {
        "mode": mode,
        "label": label,
        "num_docs": num_docs,
        "classes": classes,
        **prefix_options(tokenizer, bos, add_bos),
        "demo_fraction": demo_fraction,
        "seed_split": seed,
    }
    if mode == "many-shot":
        options["excerpt_tokens"] = excerpt_tokens
        options["demo_docs"] = len(demos)
        suffix = encode(f"\n{task.field}:")
    else:
        suffix = encode(task.zero_shot_suffix(classes))
    header = encode(task.header)

    plans = {}
    for L in lengths:  # choose queries per length: in zero-shot a query must fill L tokens by itself
        room = L - len(bos) - len(header) - len(suffix)
        if room <= (0 if mode == "zero-shot" else excerpt_tokens):
            raise TaskError(
                f"length {L} leaves no room for the document — use lengths > "
                f"{L - room + (0 if mode == 'zero-shot' else excerpt_tokens)}"
            )
        need = room if mode == "zero-shot" else 1
        chosen, skipped = pick_queries(queries, encode, need, num_docs, seed)
        if not chosen:
            raise TaskError(
                f"no query document has {need} tokens at length {L} ({skipped} skipped) — "
                "use shorter lengths or mode='many-shot'"
            )
        plans[L] = (chosen, skipped, room)

    if mode == "many-shot":
        demo_pool = _demo_excerpts(demos, encode, excerpt_tokens, seed, max(lengths))
    cells, used_demos = {}, {}
    for L, (chosen, skipped, room) in plans.items():
        cells[L], used_demos[L] = [], []
        for doc, y, ids in chosen:
            if mode == "zero-shot":
                cells[L].append(bos + header + ids[:room] + suffix)
            else:
                query = header + ids[:excerpt_tokens] + suffix
                context, n_demos = pack_demos(
                    demo_pool, header, task.field, encode, L - len(bos) - len(query)
                )
                cells[L].append(bos + context + query)
                used_demos[L].append(n_demos)
    bar = tqdm(total=sum(map(len, cells.values())), desc=f"classification {mode}", disable=not progress)
    # many-shot prompts of a length share their demonstrations: each runs only what it does not share with the
    # previous one (tasks.kit.run_cells)
    scored = run_cells(
        model,
        cells,
        lambda ids, cache, _: continuation_logprobs(model, ids, answers, prefix_cache=cache),
        extra_tokens=max(map(len, answers)),
        share_prefix=share_prefix,
        bar=bar,
    )
    bar.close()
    records = []
    for L, (chosen, skipped, room) in plans.items():
        scores = [s for s, _ in scored[L]]
        gold = [y for _, y, _ in chosen]
        pred_sum = [classes[max(range(len(classes)), key=lambda i: s[i].sum().item())] for s in scores]
        pred_mean = [classes[max(range(len(classes)), key=lambda i: s[i].mean().item())] for s in scores]
        secs = sum(t for _, t in scored[L])
        opts = dict(options, skipped_short=skipped)
        if used_demos[L]:
            opts["demos_per_prompt"] = round(sum(used_demos[L]) / len(used_demos[L]), 1)
        n = len(gold)
        majority = Counter(gold).most_common(1)[0][1] / n
        for metric, value in (
            ("accuracy", _accuracy(gold, pred_sum)),
            ("macro_f1", macro_f1(gold, pred_sum)),
            ("accuracy_norm", _accuracy(gold, pred_mean)),
            ("macro_f1_norm", macro_f1(gold, pred_mean)),
            ("chance", majority),
        ):
            records.append(record("classification", corpus, L, metric, value, n, secs, opts))
        # one 0/1 row per query: the unit of the query bootstrap and of paired comparisons between methods
        for (doc, _, _), y, p in zip(chosen, gold, pred_sum, strict=True):
            records.append(
                record("classification", corpus, L, "accuracy", float(y == p), 1, secs, opts, doc=doc.id)
            )
    return records


def labelled_documents(corpus: str, task: LabelTask) -> list[tuple[Document, str]]:
    """(document, label) for the corpus' documents the task gives a label."""
    labelled = ((d, task.label(d)) for d in iter_corpus(corpus))
    return [(d, y) for d, y in labelled if y is not None]


def grouped_split(labelled, demo_fraction: float, seed: int):
    """(demonstrations, queries): whole groups (sotu: presidents) go to one side, in a seeded order."""
    groups = sorted({d.meta.get("group", d.id) for d, _ in labelled})
    random.Random(seed).shuffle(groups)
    cut = max(1, min(len(groups) - 1, round(len(groups) * demo_fraction)))
    demo_groups = set(groups[:cut])
    demos = [(d, y) for d, y in labelled if d.meta.get("group", d.id) in demo_groups]
    queries = [(d, y) for d, y in labelled if d.meta.get("group", d.id) not in demo_groups]
    return demos, queries


def pick_queries(queries, encode, min_tokens: int, count: int, seed: int):
    """Up to `count` queries with >= min_tokens tokens, round-robin over labels in a seeded order;
    returns ([(doc, label, ids)], number of too-short documents skipped)."""
    by_label = defaultdict(list)
    for d, y in queries:
        by_label[y].append(d)
    rng = random.Random(seed + 1)
    for y in sorted(by_label):
        by_label[y].sort(key=lambda d: d.id)
        rng.shuffle(by_label[y])
    chosen, skipped = [], 0
    cursors = {y: 0 for y in by_label}
    while len(chosen) < count and any(cursors[y] < len(by_label[y]) for y in by_label):
        for y in sorted(by_label):
            while cursors[y] < len(by_label[y]) and len(chosen) < count:
                d = by_label[y][cursors[y]]
                cursors[y] += 1
                ids = encode(d.text)
                if len(ids) >= min_tokens:
                    chosen.append((d, y, ids))
                    break
                skipped += 1
    return chosen, skipped


def _demo_excerpts(demos, encode, excerpt_tokens: int, seed: int, enough: int) -> list[tuple[list, str]]:
    """Demonstration excerpts interleaved over labels (seeded): each document's first chunk, then its second,
    ... (long contexts do not run out), up to `enough` tokens: only the documents prompts can use are read."""
    rng = random.Random(seed + 2)
    by_label = defaultdict(list)
    for d, y in sorted(demos, key=lambda p: p[0].id):
        by_label[y].append(d)
    for y in by_label:
        rng.shuffle(by_label[y])
    pool, chunk, total = [], 0, 0
    while True:
        added = False
        for i in range(max(map(len, by_label.values()))):
            for y in sorted(by_label):
                ids = encode(by_label[y][i].text) if i < len(by_label[y]) else []
                excerpt = ids[chunk * excerpt_tokens : (chunk + 1) * excerpt_tokens]
                if excerpt:
                    pool.append((excerpt, y))
                    added, total = True, total + len(excerpt)
                    if total >= enough:
                        return pool
        if not added:
            return pool
        chunk += 1


def pack_demos(pool, header: list[int], field: str, encode, room: int) -> tuple[list[int], int]:
    """Demonstrations filling exactly `room` tokens; the first one loses its beginning if needed,
    so every demonstration in the prompt keeps its label line."""
    blocks = []
    for excerpt, y in pool:
        blocks.append(header + excerpt + encode(f"\n{field}: {y}\n\n"))
        if sum(map(len, blocks)) >= room:
            break
    else:
        if sum(map(len, blocks)) < room:
            raise TaskError(f"not enough demonstrations to fill {room} tokens — use shorter lengths")
    context = [t for b in blocks for t in b]
    return context[len(context) - room :], len(blocks)


def _accuracy(gold, pred) -> float:
    return sum(g == p for g, p in zip(gold, pred)) / len(gold)


def macro_f1(gold, pred) -> float:
    """Mean F1 over the classes present in gold or predictions (sklearn's default label set)."""
    scores = []
    for c in sorted(set(gold) | set(pred)):
        tp = sum(g == c and p == c for g, p in zip(gold, pred))
        fp = sum(g != c and p == c for g, p in zip(gold, pred))
        fn = sum(g == c and p != c for g, p in zip(gold, pred))
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores)
