"""lm-eval results JSON (0.4.x ``results_<date>.json``) -> rows of the ropebench schema.

So lm-eval scores sit in the same tables as the sweep's own suites. Layout read here:
``results: {task: {"metric,filter": value, "metric_stderr,filter": se, "alias": ...}}``,
``n-samples: {task: {"original": N, "effective": n}}``, ``n-shot``, ``configs``, ``config.model_args``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from .store import ResultsError, canonical_json

# model_args keys that configure loading/batching, not the RoPE method: they are not method options.
_LOAD_KEYS = {"pretrained", "model", "spec", "method", "factor", "dtype", "device", "device_map", "batch_size",
              "max_batch_size", "trust_remote_code", "revision", "parallelize", "attn_implementation",
              "max_length", "tokenizer", "use_fast_tokenizer", "add_bos_token", "backend", "peft", "delta",
              "load_in_8bit", "load_in_4bit", "gguf_file", "cache_dir", "subfolder", "logits_cache",
              "prefix_token_id", "softmax_dtype", "truncation", "think_end_token", "enable_thinking"}
_SKIP_KEYS = {"alias", "name", "sample_len", "sample_count", " ", ""}


def _parse_scalar(v: str) -> Any:
    low = v.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def parse_model_args(model_args: Any) -> dict[str, Any]:
    """``"pretrained=x,method=yarn,factor=2"`` (or a dict) -> dict with typed values."""
    if isinstance(model_args, dict):
        return dict(model_args)
    if not model_args:
        return {}
    out: dict[str, Any] = {}
    for part in str(model_args).split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = _parse_scalar(v)
    return out


def _result_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.rglob("results*.json"))
    if not files:
        raise ResultsError(f"no lm-eval results in {path} — expected results_<date>.json (lm-eval --output_path)")
    return files


def lm_eval_rows(path: str | os.PathLike, *, run: str | None = None, method: str | None = None,
                 factor: float | None = None, length: int | None = None) -> list[dict[str, Any]]:
    """Rows (plain dicts) from one lm-eval results file or a directory of them."""
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"lm-eval results not found: {path} — check the path")
    rows: list[dict[str, Any]] = []
    for f in _result_files(path):
        try:
            blob = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ResultsError(f"{f} is not a readable JSON file ({e}) — pass an lm-eval results_*.json") from e
        if not isinstance(blob, dict) or not isinstance(blob.get("results"), dict):
            raise ResultsError(f"{f} has no 'results' section — is it an lm-eval results file?")
        rows.extend(_rows_of_blob(blob, f, run=run, method=method, factor=factor, length=length))
    return rows


def _rows_of_blob(blob: dict, f: Path, *, run, method, factor, length) -> list[dict[str, Any]]:
    config = blob.get("config") or {}
    args = parse_model_args(config.get("model_args"))
    model = args.get("pretrained") or args.get("model") or args.get("spec") or config.get("model") \
        or blob.get("model_name")
    meth = method or args.get("method") or "plain"  # no method in model_args: the model ran unmodified
    fac = factor if factor is not None else float(args.get("factor", 1.0) or 1.0)
    options = {k: v for k, v in args.items() if k not in _LOAD_KEYS}
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
            task_options = {"source": "lm-eval", "num_fewshot": (blob.get("n-shot") or {}).get(task),
                            "filter": filt or None, "max_length": args.get("max_length"),
                            "limit": config.get("limit")}
            cell_src = json.dumps([run_id, model, meth, fac, canonical_json(options), task, task_len, metric])
            rows.append({
                "run": run_id, "cell": hashlib.sha1(cell_src.encode()).hexdigest()[:16], "model": model,
                "method": meth, "factor": fac, "options": canonical_json(options), "task": task, "corpus": None,
                "task_options": canonical_json(task_options), "length": task_len, "depth": None, "doc": None,
                "trial": None, "metric": metric, "value": float(value), "n": n, "seed": seed, "seconds": None,
                "status": "ok", "error": None,
                "stderr": float(stderr) if isinstance(stderr, (int, float)) else None, "written": written,
            })
    return rows


def from_lm_eval(path: str | os.PathLike, *, run: str | None = None, method: str | None = None,
                 factor: float | None = None, length: int | None = None) -> pd.DataFrame:
    """An lm-eval results JSON (or a directory of them) as a DataFrame with the ropebench schema.

    model/method/factor come from ``config.model_args`` ("pretrained=...,method=yarn,factor=2"; no method
    means "plain" at factor 1) unless given; other non-loading model_args become the method ``options``.
    ``metric`` is lm-eval's metric name (with ",filter" appended unless the filter is "none"), ``n`` the
    effective sample count, and the standard error goes to an extra ``stderr`` column. ``length`` comes
    from the task config's ``metadata.length`` when present, else the argument.
    """
    from .frame import normalize

    rows = lm_eval_rows(path, run=run, method=method, factor=factor, length=length)
    if not rows:
        raise ResultsError(f"no metric values in {path} — the lm-eval results section is empty")
    return normalize(pd.DataFrame.from_records(rows)).reset_index(drop=True)
