"""Where and how the report is written (results/reporting.py decides what it says): tables (md, csv, tex)
and plots built in a staging folder inside the report directory, then moved in under the one write guard of
every writer (extend/owned_paths.py): never over a file ropebench did not write."""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
from ropebench.extend.owned_paths import OwnedDir, safe_name

from .store import ResultsError, check_path_text, legacy_owned_files
from .tables import (
    to_csv,
    to_latex,
    to_markdown,
)


def slug(*parts: Any) -> str:
    s = "_".join(str(p) for p in parts if p is not None and str(p) != "")
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", s).strip("-") or "x"


class Report:
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
        """md/tex from the display table (may hold "mean [lo, hi]" strings), csv from the numeric one."""
        name = safe_name(name)  # task entries and metrics are user text: the file stays in tables/
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
        name = safe_name(name)  # made from user text (task, model, corpus): the file stays in plots/
        path = self.plots / f"{name}.png"
        try:
            plot = fn(*args, path, **kwargs)
        except ResultsError as e:
            self.md += [f"_Plot {title} skipped: {e}_", ""]
            return
        self.written.append(plot.path)
        self.md += [f"![{title}](plots/{name}.png)", ""]


def check_report_dir(out: Path) -> OwnedDir:
    """The report goes into a new or empty directory, or one ropebench made (a valid marker, or a run or
    report directory from before the marker: extend/owned_paths.py): like the sweep's --out and --fresh, it
    never writes into a directory of the user's. Writes nothing."""
    check_path_text(out, "report directory")
    return OwnedDir.open(out, "report directory", error=ResultsError, adopt=legacy_owned_files)


class staging:
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


def commit(staging: Path, out: Path, owned: OwnedDir | None = None) -> None:
    """Move the staged files into ``out`` — after checking that none of them replaces a file ropebench did not
    write or one changed since (then nothing is moved). Each file is listed in the marker (with its hash) as
    it is moved; report.md goes last, so it never links to a file not yet there."""
    owned = owned if owned is not None else check_report_dir(out)
    staged = sorted(p.relative_to(staging) for p in staging.rglob("*") if p.is_file())
    owned.check(staged)
    for rel in sorted(staged, key=lambda r: r == Path("report.md")):
        owned.place(rel, staging / rel)
