"""``report``: one markdown report over run directories — tables inline, plots linked, failures listed.

Writes ``<out>/report.md``, ``<out>/tables/*.{md,csv,tex}`` and ``<out>/plots/*.png``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from .comparisons import compare, paired_differences
from .frame import load
from .overview import (
    PREDICTED,
    measured_tasks,
    quantities,
    reach_column,
    rules_caption,
    short_model,
    summary,
)
from .plots import plot_classification, plot_loss_by_position, plot_passkey, plot_perplexity
from .reach import (
    MIN_BAR,
    NOLIMA_FRACTION,
    THEORY_TASK,
    check_rules,
    effective_length,
    load_theory,
    predicted_claim,
    recorded_contexts,
    rules_for,
)
from .stats import MIN_T_UNITS
from .store import REPORT_INDEX, ResultsError, atomic_write_text, is_ropebench_dir
from .tables import fmt_interval, fmt_number, select, table, to_csv, to_latex, to_markdown


def _slug(*parts: Any) -> str:
    s = "_".join(str(p) for p in parts if p is not None and str(p) != "")
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", s).strip("-") or "x"


def _manifests(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        if not p.is_dir():
            continue
        for m in sorted(p.glob("manifest*.json")):
            try:
                out.append({"_path": str(m), **json.loads(m.read_text(encoding="utf-8"))})
            except (OSError, json.JSONDecodeError):
                continue
    return out


def _trained_context_for(
    model: str | None, given: int | None, manifests: list[dict], rows: pd.DataFrame
) -> int | None:
    """Argument first; else None when the model's rows record a trained context (the patch's resolved value:
    it follows ``-o original_max_position_embeddings``, per setting, so the rows decide); else the
    ``trained_context`` the sweep read from the model's config into a manifest (int, or dict by model)."""
    if given:
        return given
    if recorded_contexts(rows[rows["model"] == model]):
        return None
    for m in manifests:
        for section in (m.get("extra") or {}, m.get("config") or {}):
            tc = section.get("trained_context")
            if isinstance(tc, dict):
                tc = tc.get(model)
            if isinstance(tc, (int, float)) and tc > 0:
                return int(tc)
    return None


class _Report:
    def __init__(self, out: Path):
        self.out = out
        self.tables = out / "tables"
        self.plots = out / "plots"
        self.tables.mkdir(parents=True, exist_ok=True)
        self.plots.mkdir(parents=True, exist_ok=True)
        self.md: list[str] = []
        self.written: list[Path] = []

    def add_table(
        self, name: str, caption: str, shown: pd.DataFrame, numeric: pd.DataFrame | None = None
    ) -> None:
        """md/tex from the display table (may hold "mean ± ci" strings), csv from the numeric one."""
        stem = self.tables / name
        to_markdown(shown, stem.with_suffix(".md"), caption=caption)
        to_latex(shown, stem.with_suffix(".tex"), caption=caption, label=f"tab:{name}")
        to_csv(numeric if numeric is not None else shown, stem.with_suffix(".csv"))
        self.written += [stem.with_suffix(s) for s in (".md", ".csv", ".tex")]
        self.md += [
            to_markdown(shown, caption=caption),
            f"<sub>[csv](tables/{name}.csv) · [tex](tables/{name}.tex)</sub>",
            "",
        ]

    def add_plot(self, name: str, title: str, fn, *args, **kwargs) -> None:
        path = self.plots / f"{name}.png"
        try:
            plot = fn(*args, path, **kwargs)
        except ResultsError as e:
            self.md += [f"_Plot {title} skipped: {e}_", ""]
            return
        self.written.append(plot.path)
        self.md += [f"![{title}](plots/{name}.png)", ""]


def _groups(sub: pd.DataFrame) -> Iterable[tuple[Any, Any]]:
    keys = sub[["model", "corpus"]].drop_duplicates().itertuples(index=False)
    return [(m if not pd.isna(m) else None, c if not pd.isna(c) else None) for m, c in keys]


def _where(model, corpus) -> dict:
    return {k: v for k, v in (("model", model), ("corpus", corpus)) if v is not None}


def _with_chance_row(t: pd.DataFrame, chance: pd.Series) -> pd.DataFrame:
    names = list(t.index.names)
    key = tuple("chance (majority)" if n == "method" else "" for n in names)
    row = pd.DataFrame(
        [[fmt_number(chance.get(c)) if c in chance.index else "–" for c in t.columns]],
        columns=t.columns,
        index=pd.MultiIndex.from_tuples([key], names=names)
        if len(names) > 1
        else pd.Index([key[0]], name=names[0]),
    )
    return pd.concat([t, row])


def _perplexity(r: _Report, ok: pd.DataFrame, tc: dict, manifests: list[dict], seed: int) -> None:
    metrics = set(ok.loc[ok["task"] == "perplexity", "metric"])
    metric = "ppl" if "ppl" in metrics else min(metrics)
    r.md += ["## Perplexity", ""]
    r.add_table(
        f"perplexity_{metric}",
        f"Perplexity ({metric}) by method and length — lower is better; "
        f"[95% interval]: t over documents on the log scale (token-weighted; none below "
        f"{MIN_T_UNITS} documents), n = documents",
        table(ok, "perplexity", metric, with_ci=True, seed=seed),
        table(ok, "perplexity", metric),
    )
    if "ppl_tail" in metrics:
        r.add_table(
            "perplexity_ppl_tail",
            "Perplexity of only the tokens between the previous length and this "
            "one — lower is better; shows where a method breaks (n = documents when per-document rows "
            "exist, else scored tokens: then no interval)",
            table(ok, "perplexity", "ppl_tail", with_ci=True, seed=seed),
            table(ok, "perplexity", "ppl_tail"),
        )
    for model, corpus in _groups(select(ok, "perplexity", metric)):
        r.add_plot(
            _slug("perplexity", short_model(model), corpus),
            f"perplexity vs length, {short_model(model)}, {corpus}",
            plot_perplexity,
            ok,
            metric=metric,
            trained_context=tc.get(model),
            seed=seed,
            **_where(model, corpus),
        )
    if "longppl" in metrics:
        r.add_table(
            "perplexity_longppl",
            "Key-token perplexity (LongPPL: the tokens whose loss the long context "
            "lowers; docs/tasks.md) — lower is better; n = documents when per-document rows exist",
            table(ok, "perplexity", "longppl", with_ci=True, seed=seed),
            table(ok, "perplexity", "longppl"),
        )
    for model, corpus in _groups(select(ok, "perplexity", "loss_bin")) if "loss_bin" in metrics else []:
        r.add_plot(
            _slug("loss_by_position", short_model(model), corpus),
            f"loss by position, {short_model(model)}, {corpus}",
            plot_loss_by_position,
            ok,
            trained_context=tc.get(model),
            **_where(model, corpus),
        )


def _passkey(r: _Report, ok: pd.DataFrame, seed: int) -> None:
    r.md += ["## Passkey retrieval", ""]
    r.add_table(
        "passkey_accuracy",
        "Passkey accuracy by method and length (over depths and trials) [95% Wilson interval], n = prompts",
        table(ok, "passkey", "correct", with_ci=True, seed=seed),
        table(ok, "passkey", "correct"),
    )
    for model, corpus in _groups(select(ok, "passkey", "correct")):
        r.add_plot(
            _slug("passkey", short_model(model), corpus),
            f"passkey heatmap, {short_model(model)}, {corpus}",
            plot_passkey,
            ok,
            **_where(model, corpus),
        )


def _classification(r: _Report, ok: pd.DataFrame, seed: int) -> None:
    r.md += ["## Long-document classification", ""]
    metrics = set(ok.loc[ok["task"] == "classification", "metric"])
    if "accuracy" in metrics:
        shown = table(ok, "classification", "accuracy", with_ci=True, seed=seed)
        caption = "Classification accuracy by method and length [95% Wilson interval], n = queries"
        if "chance" in metrics:
            chance = select(ok, "classification", "chance").groupby("length")["value"].mean()
            shown = _with_chance_row(shown, chance)
            caption += " (last row: majority-class chance)"
        r.add_table("classification_accuracy", caption, shown, table(ok, "classification", "accuracy"))
    for metric in sorted(metrics & {"macro_f1", "accuracy_norm", "macro_f1_norm"}):
        # written to tables/ only: without per-query predictions these have no interval to print
        t = table(ok, "classification", metric)
        stem = r.tables / f"classification_{metric}"
        to_markdown(t.map(fmt_number), stem.with_suffix(".md"))
        to_csv(t, stem.with_suffix(".csv"))
        r.written += [stem.with_suffix(".md"), stem.with_suffix(".csv")]
    extra = sorted(metrics & {"macro_f1", "accuracy_norm", "macro_f1_norm"})
    if extra:
        r.md += [
            "Also in tables/ (no interval: the task records them only aggregated): "
            + ", ".join(f"[{m}](tables/classification_{m}.csv)" for m in extra),
            "",
        ]
    if "accuracy" in metrics:
        for model, corpus in _groups(select(ok, "classification", "accuracy")):
            r.add_plot(
                _slug("classification", short_model(model), corpus),
                f"classification accuracy, {short_model(model)}, {corpus}",
                plot_classification,
                ok,
                **_where(model, corpus),
            )


def _summary(r: _Report, ok: pd.DataFrame, tc: dict, seed: int, threshold: float, tolerance: float) -> None:
    r.md += ["## Summary", ""]
    try:
        shown = summary(ok, trained_context=tc, threshold=threshold, tolerance=tolerance, seed=seed)
        numeric = summary(
            ok, trained_context=tc, threshold=threshold, tolerance=tolerance, seed=seed, with_ci=False
        )
    except ResultsError as e:
        r.md += [f"_No summary: {e}_", ""]
        return
    r.add_table(
        "summary",
        "One row per setting: value [95% interval] n. Perplexity: t over documents on the "
        f"log scale (no interval below {MIN_T_UNITS} documents, or when recorded only aggregated: n = "
        "scored tokens); 0/1 rates: Wilson; other means: t over units. "
        + rules_caption(threshold, tolerance)
        + ". * = paired difference to plain at that length "
        "significant (interval excludes no-difference, ≥ 6 differing pairs, exact McNemar p < 0.05 for 0/1 "
        "outcomes) — see the next sections",
        shown,
        numeric,
    )


def _differences(r: _Report, ok: pd.DataFrame, seed: int) -> None:
    r.md += ["## Differences to plain (paired, same documents / prompts)", ""]
    for q in quantities(ok).values:
        task, metric = q.task, q.metric
        caption = (
            f"{task}/{metric}: ratio to plain on the same documents — below 1 is better"
            if q.kind == "log"
            else f"{task}/{metric} minus plain on the same documents / prompts"
        )
        try:
            if "plain" not in set(select(ok, task, metric)["method"]):
                continue
            shown = compare(ok, task, metric, "plain", with_ci=True, seed=seed)
            numeric = compare(ok, task, metric, "plain", seed=seed)
        except ResultsError:
            continue
        kinds = set(paired_differences(ok, task, metric, "plain", seed=seed)["interval"]) - {"baseline"}
        contrast = "log ratios" if q.kind == "log" else "differences"
        how = {
            "paired t": (
                f"paired t over the shared units' {contrast} (from {MIN_T_UNITS}), n = pairs; "
                "* = excludes no-difference with ≥ 6 differing pairs"
            ),
            "paired score + McNemar": (
                "Newcombe's paired score interval, n = pairs; * = excludes 0 and the "
                "exact McNemar test gives p < 0.05"
            ),
            "newcombe (unpaired)": (
                "Newcombe, unpaired: no per-query rows recorded, n = queries; * = excludes 0"
            ),
            "none": "none: a single unit",
        }
        r.add_table(
            f"{task}_{metric}_vs_plain",
            f"{caption}: estimate [95% interval: " + "; ".join(how.get(k, k) for k in sorted(kinds)) + "]",
            shown,
            numeric,
        )


def _reach(r: _Report, ok: pd.DataFrame, tc: dict, seed: int, threshold: float, tolerance: float) -> None:
    r.md += ["## Effective context length", ""]
    for q in quantities(ok).reaches:  # every metric with a pass/fail bar, under every rule that applies
        for rule in rules_for(q.kind):
            _reach_table(r, ok, q, rule, tc, seed, threshold, tolerance)


def _reach_table(
    r: _Report, ok: pd.DataFrame, q, rule: str, tc: dict, seed: int, threshold: float, tolerance: float
) -> None:
    caption = f"{reach_column(q, rule)} ({q.task}/{q.metric}) — " + _rule_caption(
        q.kind, rule, threshold, tolerance
    )
    try:
        e = effective_length(
            ok,
            q.task,
            q.metric,
            threshold=threshold,
            tolerance=tolerance,
            trained_context=tc,
            rule=rule,
            seed=seed,
        )
    except ResultsError as err:
        r.md += [f"_{caption}: not computed ({err})_", ""]
        return
    shown = pd.DataFrame(
        {
            "model": e["model"].map(short_model),
            "method": e["method"],
            "factor": e["factor"],
            "reach": e["claim"],
            "at reach": [
                fmt_interval(v, lo, hi, n if not pd.isna(n) else None) if not pd.isna(v) else "–"
                for v, lo, hi, n in zip(e["at_value"], e["at_lo"], e["at_hi"], e["at_n"])
            ],
            "stopped at": [
                f"{int(x)} ({why})" if not pd.isna(x) else "–"
                for x, why in zip(e["stopped_at"], e["stopped"])
            ],
            "there": [
                fmt_interval(v, lo, hi, n if not pd.isna(n) else None) if not pd.isna(v) else "–"
                for v, lo, hi, n in zip(e["fail_value"], e["fail_lo"], e["fail_hi"], e["fail_n"])
            ],
            "first failure": [str(int(x)) if not pd.isna(x) else "–" for x in e["first_failure"]],
            "rule": e["rule"],
        }
    )
    if e["predicted_reach"].notna().any():  # theory beside measurement
        shown[PREDICTED] = [
            predicted_claim(v, lim) for v, lim in zip(e["predicted_reach"], e["predicted_limit"])
        ]
    if shown["model"].nunique() == 1:
        shown = shown.drop(columns="model")
    shown = shown.set_index([c for c in ("model", "method", "factor") if c in shown.columns])
    r.add_table(f"reach_{q.task}_{q.metric}_{rule}", caption, shown, e)


def _rule_caption(kind: str, rule: str, threshold: float, tolerance: float) -> str:
    """The bar of one reach table, in words; the statistic shown at the reach and where the walk stopped."""
    if kind == "log":
        whose = "its own" if rule == "threshold" else "plain's"
        return (
            f"bar: the upper bound of the paired ratio to {whose} value at the trained context ≤ "
            f"{1 + tolerance:g}; ratio [95% paired t interval] at the reach / where it stopped"
        )
    return {
        "threshold": f"bar (absolute, as RULER): Wilson lower bound ≥ {threshold:g}",
        "short": (
            f"bar (NoLiMa): Wilson lower bound ≥ {NOLIMA_FRACTION:g} × the setting's own rate at its "
            f"shortest tested length, when that rate's lower bound is ≥ {MIN_BAR:g} (else no reach)"
        ),
        "trained": (
            f"bar: plain's own Wilson lower bound at the trained context, when that is ≥ {MIN_BAR:g} "
            "(else no bar, no reach)"
        ),
    }[rule] + "; rate [95% Wilson interval]"


def _theory(r: _Report, ok: pd.DataFrame) -> None:
    """The sweep's theory rows, one line per setting: Men et al.'s predicted reach of the patched frequencies
    and the smallest base for the trained context, Liu et al.'s critical dimension — beside the measured
    reaches above."""
    rows = ok[ok["task"] == THEORY_TASK]
    if rows.empty:
        return
    keys = ["model", "method", "factor", "options"]
    latest = rows.drop_duplicates([*keys, "metric"], keep="last").set_index(keys)
    shown = pd.DataFrame(index=latest.index.unique())
    reach = latest[latest["metric"] == "men_reach"]
    if len(reach):
        limits = reach["task_options"].map(
            lambda o: json.loads(o).get("limit") if isinstance(o, str) else None
        )
        shown[PREDICTED] = pd.Series(
            [predicted_claim(v, lim) for v, lim in zip(reach["value"], limits)], index=reach.index
        )
    bases = [
        json.loads(o).get("base_theta", "–") if isinstance(o, str) else "–"
        for o in shown.index.get_level_values("options")
    ]
    if any(b != "–" for b in bases):
        shown["RoPE base"] = bases
    bound = latest[latest["metric"] == "base_lower_bound"]
    for L in sorted(bound["length"].dropna().unique()):
        at = bound[bound["length"] == L]["value"]
        shown[f"smallest base for {int(L)} (Men et al.)"] = at.map(lambda v: f"{v:.3g}")
    crit = latest[latest["metric"] == "critical_dimension"]["value"]
    if len(crit):
        shown["critical dimension (Liu et al.)"] = crit.map(lambda v: str(int(v)))
    shown = shown.fillna("–").reset_index()
    shown["model"] = shown["model"].map(short_model)
    shown["options"] = shown["options"].map(_method_options)
    drop = [c for c in ("model", "options") if shown[c].nunique() == 1]
    shown = shown.drop(columns=drop).set_index([k for k in keys if k not in drop])
    r.md += ["## Theory beside measurement", ""]
    r.add_table(
        "theory",
        "What RoPE theory predicts from each setting's frequencies as patched (dynamic methods at "
        "factor × the trained context): "
        + PREDICTED
        + " = the first relative distance m with Σ_i cos(m θ_i) "
        "< 0 (Men et al. 2024, arXiv:2405.14591; ≥: held up to the distance checked, 4 × the longest tested "
        "length), the smallest base for which the criterion holds up to the trained context, and the "
        "critical dimension of Liu et al. 2024 (arXiv:2310.05209) — compare with the measured reaches above",
        shown,
    )


def _method_options(text: str) -> str:
    """The method's own options (not what the patch resolved: trained context, base, ...)."""
    resolved = {"start_from", "trained_context", "base_theta", "shipped_rope", "temperature", "layer_types"}
    try:
        opts = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return str(text)
    return ", ".join(f"{k}={v}" for k, v in sorted(opts.items()) if k not in resolved)


def _other(r: _Report, ok: pd.DataFrame, task: str) -> None:
    r.md += [f"## {task}", ""]
    for metric in sorted(ok.loc[ok["task"] == task, "metric"].dropna().unique()):
        sub = select(ok, task, metric)
        cols = "length" if sub["length"].notna().any() else None
        shown = table(ok, task, metric, cols=cols, with_ci=True)
        r.add_table(_slug(task, metric), f"{task}: {metric}", shown, table(ok, task, metric, cols=cols))


def _failures(df: pd.DataFrame) -> list[str]:
    bad = df[df["status"] == "error"]
    if bad.empty:
        return ["## Failed cells", "", "None.", ""]
    cols = ["run", "cell", "model", "method", "factor", "task", "length", "error"]
    cells = bad.drop_duplicates(subset=["run", "cell"])[cols].copy()
    cells["factor"] = cells["factor"].map(lambda f: "" if pd.isna(f) else f"{f:g}")
    cells["error"] = cells["error"].fillna("").map(lambda s: s.splitlines()[0][:160] if s else "")
    t = cells.set_index(["run", "cell"])
    return [f"## Failed cells ({len(cells)})", "", to_markdown(t), ""]


def report(
    run_dirs: str | os.PathLike | Iterable[str | os.PathLike],
    out: str | os.PathLike | None = None,
    *,
    trained_context: int | None = None,
    threshold: float = 0.8,
    tolerance: float = 0.10,
    seed: int = 0,
) -> Path:
    """Write ``report.md`` + ``tables/`` + ``plots/`` for the runs; returns the path of report.md.

    ``out`` defaults to the first run directory. ``trained_context`` (the model's original context) draws
    the dashed line in perplexity plots and is the reference of the summary and the effective lengths;
    without it each setting's rows decide (the patch's resolved ``trained_context``, which follows
    ``original_max_position_embeddings``), and only for rows that record none the manifest's (the model
    config's). The report opens with :func:`results.summary`, then the paired differences to plain, the
    effective lengths, and per-task tables with n and 95% intervals (closed-form: ``seed`` changes nothing).
    """
    check_rules(threshold, tolerance)
    paths = [Path(run_dirs)] if isinstance(run_dirs, (str, os.PathLike)) else [Path(p) for p in run_dirs]
    if not paths:
        raise ResultsError("no run directory given — pass a run directory or a list of them")
    df = load(paths)  # bad records are named first; then where the report may go
    theory = load_theory(paths)  # the sweep's predicted reach, kept beside the records
    if len(theory):
        df = pd.concat([df, theory], ignore_index=True)
    out = Path(out) if out is not None else (paths[0] if paths[0].is_dir() else paths[0].parent)
    check_report_dir(out)
    with _staging(out) as staging:
        _write_report(_Report(staging), df, paths, trained_context, threshold, tolerance, seed)
        _commit(staging, out)
    return out / "report.md"


def _write_report(
    r: _Report,
    df: pd.DataFrame,
    paths: list[Path],
    trained_context: int | None,
    threshold: float,
    tolerance: float,
    seed: int,
) -> None:
    manifests = _manifests(paths)
    ok = df[df["status"].isna() | (df["status"] == "ok")]
    r.md += [
        "# ropebench report",
        "",
        f"Runs: {', '.join(sorted(map(str, df['run'].dropna().unique())))}  ",
        f"Models: {', '.join(sorted(map(str, df['model'].dropna().unique())))}  ",
        f"Rows: {len(df)} ({int((df['status'] == 'error').sum())} error rows)  ",
    ]
    for m in manifests:
        v = m.get("versions") or {}
        git = (m.get("git") or {}).get("commit")
        r.md.append(
            f"Manifest `{Path(m['_path']).parent.name}/{Path(m['_path']).name}`: "
            f"start {m.get('start_time')}, end {m.get('end_time')}, device {m.get('device')}, "
            f"seed {m.get('seed')}, torch {v.get('torch')}, transformers {v.get('transformers')}"
            + (f", commit {git[:10]}" if git else "")
            + "  "
        )
    r.md.append("")
    tc = {m: _trained_context_for(m, trained_context, manifests, ok) for m in ok["model"].dropna().unique()}
    tc = {m: v for m, v in tc.items() if v}
    if measured_tasks(ok):  # table-driven: any task's metrics (see results.stats.METRICS) appear in all three
        _summary(r, ok, tc, seed, threshold, tolerance)
        _differences(r, ok, seed)
        _reach(r, ok, tc, seed, threshold, tolerance)
        _theory(r, ok)
    for task in measured_tasks(ok):
        if task == "perplexity":
            _perplexity(r, ok, tc, manifests, seed)
        elif task == "passkey" and "correct" in set(ok.loc[ok["task"] == task, "metric"]):
            _passkey(r, ok, seed)
        elif task == "classification":
            _classification(r, ok, seed)
        else:
            _other(r, ok, task)
    r.md += _failures(df)
    atomic_write_text(r.out / "report.md", "\n".join(r.md))


# -- where the report is written: never over a file ropebench did not write ----------------------------------
REPORT_LINK = re.compile(r"\((tables|plots)/([^()/\s]+)\.(md|csv|tex|png)\)")


def check_report_dir(out: Path) -> None:
    """The report goes into a new or empty directory, or one ropebench made (a run directory, an earlier
    report's): like the sweep's --out and --fresh, it never writes into a directory of the user's."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ResultsError(f"report directory {out} is not a directory — pass a new directory (--out DIR)")
    if out.is_dir() and any(out.iterdir()) and not is_ropebench_dir(out):
        raise ResultsError(
            f"report directory {out} is a non-empty directory ropebench did not make — pass a new or "
            f"empty directory (--out DIR); ropebench never writes into other directories"
        )


def report_files(out: Path) -> set[Path]:
    """Files in ``out`` an earlier report wrote: those its index lists, or (a report from before the index)
    its ``report.md`` and the tables and plots that report links to."""
    index = out / REPORT_INDEX
    try:
        listed = json.loads(index.read_text(encoding="utf-8")).get("files", [])
        return {
            out / f
            for f in listed
            if isinstance(f, str) and not Path(f).is_absolute() and ".." not in Path(f).parts
        }
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    report_md = out / "report.md"
    try:
        text = report_md.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    if not text.startswith("# ropebench report"):
        return set()
    linked = {report_md}
    for folder, stem, _ in REPORT_LINK.findall(text):
        suffixes = (".md", ".csv", ".tex") if folder == "tables" else (".png",)
        linked.update(out / folder / f"{stem}{s}" for s in suffixes)
    return linked


class _staging:
    """A scratch directory inside ``out`` the report is built in; removed on exit. A directory this creates
    for ``out`` (and its missing parents) is removed again when the report fails, so a refusal leaves
    nothing behind."""

    def __init__(self, out: Path):
        self.out = out
        self.created = next((p for p in [*reversed(out.parents), out] if not p.exists()), None)

    def __enter__(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / f".report.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        self.path.mkdir()
        return self.path

    def __exit__(self, exc_type, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if exc_type is not None and self.created is not None:
            for d in [self.out, *self.out.parents]:  # only the directories made here, and only when empty
                try:
                    d.rmdir()
                except OSError:
                    break
                if d == self.created:
                    break


def _commit(staging: Path, out: Path) -> None:
    """Move the staged files into ``out`` — after checking that none of them replaces a file ropebench did not
    write (then nothing is moved). report.md goes last, so it never links to a file not yet there."""
    staged = sorted(p.relative_to(staging) for p in staging.rglob("*") if p.is_file())
    ours = report_files(out)
    for rel in staged:
        dest = out / rel
        for folder in list(reversed(rel.parents))[1:]:
            if (out / folder).is_symlink() or ((out / folder).exists() and not (out / folder).is_dir()):
                raise ResultsError(
                    f"{out / folder} is not a directory ropebench made — move it away, or pass another --out"
                )
        if (dest.exists() or dest.is_symlink()) and dest not in ours:
            raise ResultsError(
                f"{dest} exists and ropebench did not write it — move it away, or pass another "
                f"--out (ropebench never replaces a file it did not write)"
            )
    kept = sorted(str(p.relative_to(out)) for p in ours if p.is_file() and p.name != REPORT_INDEX)
    files = sorted(set(kept) | {str(rel) for rel in staged})
    # the index first: a kill while moving leaves files it already names (ours to replace next time)
    atomic_write_text(out / REPORT_INDEX, json.dumps({"files": files}, indent=1) + "\n")
    for rel in sorted(staged, key=lambda r: r == Path("report.md")):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, out / rel)
