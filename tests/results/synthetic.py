"""A small, deterministic synthetic sweep in the row schema: test data, not part of the product. Tests get
its functions as fixtures (`synthetic_records`, `synthetic_task_records`, `synthetic_theory_records`:
tests/conftest.py); tests/project/test_bad_inputs.py, which also runs as a script, loads it by path.

The numbers follow simple formulas (documented per task below) so a test can compute the expected
table cells by hand; they are not measurements.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

MODEL = "smollm2-135m"
TRAINED = 8192
LENGTHS = (1024, 2048, 4096, 8192, 16384)
SETTINGS = (
    ("plain", 1.0, {}),
    ("linear", 2.0, {}),
    ("yarn", 2.0, {"beta_fast": 32}),
    ("yarn", 4.0, {"beta_fast": 32}),
)


def cell_id(*parts: Any) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _ppl(method: str, factor: float, length: int) -> float:
    # plain explodes beyond the trained context; extended methods degrade gently with their factor.
    base = 12.0 + 0.5 * math.log2(length / 1024)
    if method == "plain":
        return base * (1.0 if length <= TRAINED else 40.0)
    reach = TRAINED * factor
    return base * (1.0 + 0.02 * factor) * (1.0 if length <= reach else 3.0)


def _correct(method: str, factor: float, length: int, depth: float, trial: int) -> int:
    reach = TRAINED * (factor if method != "plain" else 1.0)
    if length > reach:
        return 0
    # deterministic "misses": one miss per depth 0.5 at the largest length inside the reach
    return 0 if (depth == 0.5 and trial == 0 and length * 2 > reach) else 1


def _doc_factor(d: int, docs: int) -> float:
    # symmetric on the log scale: the token-weighted geometric mean over documents is the formula's value
    return math.exp(0.1 * (d - (docs - 1) / 2))


def _acc(method: str, factor: float, length: int) -> float:
    reach = TRAINED * (factor if method != "plain" else 1.0)
    return (0.6 + 0.05 * math.log2(length / 1024)) if length <= reach else 0.5


def synthetic_records(
    run: str = "synthetic",
    *,
    model: str = MODEL,
    lengths=LENGTHS,
    settings=SETTINGS,
    tasks=("perplexity", "passkey", "classification"),
    docs: int = 3,
    trials: int = 2,
    depths=(0.0, 0.5, 1.0),
    seed: int = 0,
    error_cells: int = 0,
    queries: int = 20,
    per_query: bool = False,
) -> list[dict[str, Any]]:
    """Rows as the sweep writes them. ``error_cells`` adds that many failed cells (status "error").

    perplexity: per document d, loss = log(ppl) + 0.1 (d - (docs-1)/2), so the aggregate ppl is exactly the
    formula's; ``ppl_tail`` (tokens between the previous length and this one) follows the same formula, per
    document and aggregated. classification: aggregate rows over ``queries`` queries; ``per_query=True``
    adds one 0/1 ``accuracy`` row per query (the first round(acc x queries) correct).
    """
    rows: list[dict[str, Any]] = []

    def add(cell: str, method: str, factor: float, options: dict, **r: Any) -> None:
        row = {
            "run": run,
            "cell": cell,
            "model": model,
            "method": method,
            "factor": factor,
            "options": options,
            "depth": None,
            "doc": None,
            "trial": None,
            "seed": seed,
            "seconds": 0.5,
            "status": "ok",
            "error": None,
        }
        row.update(r)
        rows.append(row)

    for method, factor, options in settings:
        for length in lengths:
            if "perplexity" in tasks:
                cell = cell_id(run, model, method, factor, options, "perplexity", length)
                topts = {"protocol": "truncate", "num_docs": docs, "trained_context": TRAINED}
                ppl = _ppl(method, factor, length)
                previous = max((x for x in lengths if x < length), default=None)
                for d in range(docs):
                    doc_ppl = ppl * _doc_factor(d, docs)
                    for metric, v in (("loss", math.log(doc_ppl)), ("ppl", doc_ppl)):
                        add(
                            cell,
                            method,
                            factor,
                            options,
                            task="perplexity",
                            corpus="sotu",
                            task_options=topts,
                            length=length,
                            doc=f"doc{d}",
                            metric=metric,
                            value=v,
                            n=length - 1,
                        )
                    if previous:
                        add(
                            cell,
                            method,
                            factor,
                            options,
                            task="perplexity",
                            corpus="sotu",
                            task_options=topts,
                            length=length,
                            doc=f"doc{d}",
                            metric="ppl_tail",
                            value=doc_ppl,
                            n=length - previous,
                        )
                for metric, v in (("loss", math.log(ppl)), ("ppl", ppl)):
                    add(
                        cell,
                        method,
                        factor,
                        options,
                        task="perplexity",
                        corpus="sotu",
                        task_options=topts,
                        length=length,
                        metric=metric,
                        value=v,
                        n=docs * (length - 1),
                    )
                if previous:
                    add(
                        cell,
                        method,
                        factor,
                        options,
                        task="perplexity",
                        corpus="sotu",
                        task_options=topts,
                        length=length,
                        metric="ppl_tail",
                        value=ppl,
                        n=docs * (length - previous),
                    )
            if "passkey" in tasks:
                cell = cell_id(run, model, method, factor, options, "passkey", length)
                topts = {"haystack": "filler", "trials": trials}
                for depth in depths:
                    for t in range(trials):
                        add(
                            cell,
                            method,
                            factor,
                            options,
                            task="passkey",
                            corpus="filler",
                            task_options=topts,
                            length=length,
                            depth=depth,
                            trial=t,
                            metric="correct",
                            value=float(_correct(method, factor, length, depth, t)),
                            n=1,
                        )
            if "classification" in tasks:
                cell = cell_id(run, model, method, factor, options, "classification", length)
                topts = {"label": "era", "mode": "zero-shot"}
                acc = _acc(method, factor, length)
                for metric, v in (("accuracy", acc), ("macro_f1", acc - 0.1), ("chance", 0.4)):
                    add(
                        cell,
                        method,
                        factor,
                        options,
                        task="classification",
                        corpus="sotu",
                        task_options=topts,
                        length=length,
                        metric=metric,
                        value=v,
                        n=queries,
                    )
                hits = round(acc * queries)
                for q in range(queries if per_query else 0):
                    add(
                        cell,
                        method,
                        factor,
                        options,
                        task="classification",
                        corpus="sotu",
                        task_options=topts,
                        length=length,
                        doc=f"q{q}",
                        metric="accuracy",
                        value=float(q < hits),
                        n=1,
                    )
    for i in range(error_cells):
        method, factor, options = settings[-1]
        add(
            cell_id(run, "error", i),
            method,
            factor,
            options,
            task="passkey",
            corpus="filler",
            task_options={},
            length=65536 * (i + 1),
            metric=None,
            value=None,
            n=None,
            status="error",
            error="OutOfMemoryError: CUDA out of memory (synthetic)",
        )
    return rows


def _task_reach(method: str, factor: float) -> float:
    return TRAINED * (factor if method != "plain" else 1.0)


def synthetic_task_records(
    task: str = "needles",
    run: str = "synthetic",
    *,
    model: str = MODEL,
    lengths=LENGTHS,
    settings=SETTINGS,
    trials: int = 12,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Rows of a task the results layer has never heard of (no entry in ``results.stats.METRICS``), one row
    per prompt (``trial`` set) and metric, to check that summary, differences and reach are table-driven:

    - ``hit`` (0/1, generation): 1 within the method's reach (the trained context x factor; plain: the trained
      context), else 0;
    - ``rank1`` (0/1, the answer ranked first among candidates): 1 up to twice the reach, else 0;
    - ``logprob`` (the answer's mean log-probability): -0.5 - 0.1 log2(L / 1024), 2 lower beyond the reach,
      plus 0.05 (t - (trials - 1) / 2) for trial t (so its mean over the trials is the formula's).
    """
    rows: list[dict[str, Any]] = []
    for method, factor, options in settings:
        reach = _task_reach(method, factor)
        for length in lengths:
            cell = cell_id(run, model, method, factor, options, task, length)
            logprob = -0.5 - 0.1 * math.log2(length / 1024) - (2.0 if length > reach else 0.0)
            for t in range(trials):
                values = {
                    "hit": float(length <= reach),
                    "rank1": float(length <= 2 * reach),
                    "logprob": logprob + 0.05 * (t - (trials - 1) / 2),
                }
                for metric, value in values.items():
                    rows.append(
                        {
                            "run": run,
                            "cell": cell,
                            "model": model,
                            "method": method,
                            "factor": factor,
                            "options": options,
                            "task": task,
                            "corpus": "filler",
                            "task_options": {"variant": "multikey"},
                            "length": length,
                            "depth": 0.5,
                            "doc": None,
                            "trial": t,
                            "metric": metric,
                            "value": value,
                            "n": 1,
                            "seed": seed,
                            "seconds": 0.1,
                            "status": "ok",
                            "error": None,
                        }
                    )
    return rows


def synthetic_theory_records(
    run: str = "synthetic",
    *,
    model: str = MODEL,
    settings=SETTINGS,
    limit: int = 4 * LENGTHS[-1],
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The rows a sweep records with task "theory" (one setting each): ``men_reach`` = 3616 x factor (plain:
    3616, SmolLM2's base 1e5 and head_dim 64), capped at ``limit``; ``base_lower_bound`` 3.24e5 at the trained
    context; ``critical_dimension`` 40."""
    rows: list[dict[str, Any]] = []
    for method, factor, options in settings:
        cell = cell_id(run, model, method, factor, options, "theory")
        reach = min(int(3616 * (factor if method != "plain" else 1.0)), limit)
        for metric, value, length, topts in (
            ("men_reach", reach, None, {"limit": limit}),
            ("base_lower_bound", 3.24e5, TRAINED, {}),
            ("critical_dimension", 40.0, None, {}),
        ):
            rows.append(
                {
                    "run": run,
                    "cell": cell,
                    "model": model,
                    "method": method,
                    "factor": factor,
                    "options": options,
                    "task": "theory",
                    "corpus": None,
                    "task_options": topts,
                    "length": length,
                    "depth": None,
                    "doc": None,
                    "trial": None,
                    "metric": metric,
                    "value": float(value),
                    "n": 1,
                    "seed": seed,
                    "seconds": 0.0,
                    "status": "ok",
                    "error": None,
                }
            )
    return rows
