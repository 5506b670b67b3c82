"""lm-eval results JSON (0.4.x ``results_<date>.json``) -> rows of the ropebench schema.

So lm-eval scores sit in the same tables as the sweep's own tasks. Layout read here:
``results: {task: {"metric,filter": value, "metric_stderr,filter": se, "alias": ...}}``,
``n-samples: {task: {"original": N, "effective": n}}``, ``n-shot``, ``configs``, ``config.model_args``, and
what the ``ropebench`` model records in ``config`` (``ropebench_method``, ``ropebench_factor``,
``ropebench_options``, ``ropebench_max_length``: scripts/integrations/lm_eval/,
``RopebenchLM.get_model_info``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from ropebench.extend.values import parse_text

from .store import ResultsError, canonical_json

# from_pretrained keyword arguments stock HFLM passes through (they place or quantize weights, not RoPE), and
# other names of the model; the rest of the non-options are read from the installed HFLM (`_loading_args`).
_FROM_PRETRAINED_KEYS = {"model", "spec", "device_map", "load_in_8bit", "load_in_4bit", "cache_dir"}
_SKIP_KEYS = {"alias", "name", "sample_len", "sample_count", " ", ""}
# model_args the lm-eval model `ropebench` consumes itself (ropebench.integrations.lm_eval; everything else
# is HFLM's own argument or a method option): part of what its runs record, so read here and used there.
OWN_ARGS = (
    "pretrained",
    "method",
    "factor",
    "max_length",
    "device",
    "dtype",
    "attn_implementation",
    "trust_remote_code",
    "tokenizer",
    "scored_logits_only",
    "share_prefix",
)


def parse_model_args(model_args: Any) -> dict[str, Any]:
    """``"pretrained=x,method=yarn,factor=2"`` (or a dict) -> dict with typed values, by the one text rule of
    every entry point (extend/values.py: `16k` is 16384, as the ropebench lm-eval model reads it)."""
    if isinstance(model_args, dict):
        return dict(model_args)
    if not model_args:
        return {}
    out: dict[str, Any] = {}
    for part in str(model_args).split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = parse_text(v, f"model_args {k.strip()}")
    return out


def hflm_args() -> set[str]:
    """The installed lm-eval's HFLM constructor arguments (imports lm-eval, which is slow: on first need)."""
    import inspect

    from lm_eval.models.huggingface import HFLM

    return {
        k
        for k, p in inspect.signature(HFLM.__init__).parameters.items()
        if k != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }


@functools.cache
def _loading_args() -> frozenset[str]:
    """model_args of a run without ropebench's record that are not RoPE options: HFLM's constructor arguments
    (of the installed lm-eval), the ropebench model's own, and from_pretrained's placement arguments."""
    return frozenset(set(OWN_ARGS) | hflm_args() | _FROM_PRETRAINED_KEYS)


def _what_ran(config: dict, args: dict, f: Path) -> tuple[str, float, dict[str, Any]]:
    """(method, factor, options) of a run. The ropebench model records what it patched (options as resolved by
    the patch, the same dict the sweep records); another model (stock ``hf``) ran what model_args say: a
    method/factor if given (else plain at 1) and, as options, every argument that is not a loading
    argument."""
    if config.get("ropebench_method"):
        options = config.get("ropebench_options") or {}
        try:
            options = json.loads(options) if isinstance(options, str) else dict(options)
        except (ValueError, TypeError) as e:
            raise ResultsError(
                f"{f}: config.ropebench_options is not a JSON object ({e}) — pass an unedited "
                f"lm-eval results file"
            ) from e
        return str(config["ropebench_method"]), _factor(config.get("ropebench_factor"), f), options
    loading = _loading_args()
    options = {k: v for k, v in args.items() if k not in loading}
    return args.get("method") or "plain", _factor(args.get("factor"), f), options


def _factor(value: Any, f: Path) -> float:
    """A recorded factor: absent is 1 (no extension); anything else must be a finite number > 0 (a 0 is no
    default: it is a factor no patch accepts)."""
    if value is None:
        return 1.0
    try:
        factor = float(value)
    except (TypeError, ValueError):
        factor = math.nan
    if isinstance(value, bool) or not math.isfinite(factor) or factor <= 0:
        raise ResultsError(
            f"{f}: the run's factor {value!r} is not a finite number > 0 — pass an unedited lm-eval results "
            f"file, or give the factor (from_lm_eval(..., factor=2))"
        )
    return factor


def _result_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.rglob("results*.json"))
    if not files:
        raise ResultsError(
            f"no lm-eval results in {path} — expected results_<date>.json (lm-eval --output_path)"
        )
    return files


def lm_eval_rows(
    path: str | os.PathLike,
    *,
    run: str | None = None,
    method: str | None = None,
    factor: float | None = None,
    length: int | None = None,
) -> list[dict[str, Any]]:
    """Rows (plain dicts) from one lm-eval results file or a directory of them."""
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"lm-eval results not found: {path} — check the path")
    rows: list[dict[str, Any]] = []
    for f in _result_files(path):
        try:
            blob = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ResultsError(
                f"{f} is not a readable JSON file ({e}) — pass an lm-eval results_*.json"
            ) from e
        if not isinstance(blob, dict) or not isinstance(blob.get("results"), dict):
            raise ResultsError(f"{f} has no 'results' section — is it an lm-eval results file?")
        rows.extend(_rows_of_blob(blob, f, run=run, method=method, factor=factor, length=length))
    return rows


def _rows_of_blob(blob: dict, f: Path, *, run, method, factor, length) -> list[dict[str, Any]]:
    config = blob.get("config") or {}
    args = parse_model_args(config.get("model_args"))
    model = (
        args.get("pretrained")
        or args.get("model")
        or args.get("spec")
        or config.get("model")
        or blob.get("model_name")
    )
    ran_method, ran_factor, options = _what_ran(config, args, f)
    meth = method or ran_method
    fac = factor if factor is not None else ran_factor
    max_length = config.get("ropebench_max_length", args.get("max_length"))
    run_id = run or f"lm-eval:{f.stem}"
    seed = config.get("random_seed")
    written = int(float(blob.get("date") or 0) * 1e9) or None
    rows = []
    for task, metrics in blob["results"].items():
        if not isinstance(metrics, dict):
            continue
        n = ((blob.get("n-samples") or {}).get(task) or {}).get("effective") or metrics.get("sample_len")
        tcfg = (blob.get("configs") or {}).get(task) or {}
        meta = tcfg.get("metadata") if isinstance(tcfg.get("metadata"), dict) else {}
        task_len = length if length is not None else meta.get("length")
        for key, value in metrics.items():
            if key in _SKIP_KEYS or "_stderr" in key.split(",")[0]:
                continue
            name, _, filt = key.partition(",")
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            stderr = metrics.get(f"{name}_stderr,{filt}" if filt else f"{name}_stderr")
            metric = name if filt in ("", "none") else f"{name},{filt}"
            task_options = {
                "source": "lm-eval",
                "num_fewshot": (blob.get("n-shot") or {}).get(task),
                "filter": filt or None,
                "max_length": max_length,
                "limit": config.get("limit"),
            }
            cell_src = json.dumps([run_id, model, meth, fac, canonical_json(options), task, task_len, metric])
            rows.append(
                {
                    "run": run_id,
                    "cell": hashlib.sha1(cell_src.encode()).hexdigest()[:16],
                    "model": model,
                    "method": meth,
                    "factor": fac,
                    "options": canonical_json(options),
                    "task": task,
                    "corpus": None,
                    "task_options": canonical_json(task_options),
                    "length": task_len,
                    "depth": None,
                    "doc": None,
                    "trial": None,
                    "metric": metric,
                    "value": float(value),
                    "n": n,
                    "seed": seed,
                    "seconds": None,
                    "status": "ok",
                    "error": None,
                    "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
                    "written": written,
                }
            )
    return rows
