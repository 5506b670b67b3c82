"""Reading the saved benchmark JSON (see report.py for its layout): medians over repeats and what the children
recorded about the run and the model. Pure functions, shared by the report modules."""

from __future__ import annotations

import statistics

MB, GB = 1024**2, 1024**3
# Runs saved before the children recorded their method all used yarn x2 (figures.METHOD / FACTOR at the time).
LEGACY_METHOD = {"method": "yarn", "factor": 2.0}


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def per_repeat(runs, f):
    """Median over repeats of f(repeat); a repeat that lacks what f reads counts as missing."""
    vals = []
    for rep in runs:
        try:
            vals.append(f(rep))
        except (KeyError, ZeroDivisionError, TypeError):
            vals.append(None)
    return median(vals)


def method_of(saved) -> tuple[str, float]:
    onepass = saved["runs"][0]["onepass"]
    return onepass.get("method", LEGACY_METHOD["method"]), onepass.get("factor", LEGACY_METHOD["factor"])


def model_facts(saved) -> dict:
    """What the onepass child read off the loaded model (figures.model_facts); {} for older runs."""
    return saved["runs"][0]["onepass"].get("model") or {}


def snapshot_stem(path) -> str:
    """The model file extend.load's snapshot was made from: `<file stem>-<size>-<mtime>` names its folder."""
    folder = str(path or "").rstrip("/").rsplit("/", 1)[-1]
    return folder.rsplit("-", 2)[0] if folder.count("-") >= 2 else "(model file not recorded)"


def model_name(saved) -> str:
    return model_facts(saved).get("name") or snapshot_stem(saved.get("args", {}).get("model_dir"))
