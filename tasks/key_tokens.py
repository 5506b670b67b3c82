"""Key-token perplexity (LongPPL) and loss by position, both from the perplexity task's one pass.

LongPPL (Fang et al., ICLR 2025, arXiv:2410.23771; the `longppl` 0.3.0 package). An evaluator model scores
every token of a text twice: with the whole text before it (the long context), and with a short context that
starts at the last multiple of `sliding_window` at least `trunc_len` tokens back (windows of `trunc_len +
sliding_window` tokens, the last one cut at the end of the text). A token is *key* when the long context
lowers its loss by more than `alpha` and its long-context loss is below `-beta`. Key tokens are kept as
character spans of the text (spans of touching key tokens merged), so they transfer to any tokenizer: a token
of the evaluated model is key when one span contains all its characters. LongPPL = exp(mean loss of the
evaluated model over its key tokens).

The evaluator: "self" (default) is the evaluated model with no patch (`extend.patching.unpatched`); any
`extend.load` spec may be named. It sees at most its own trained context C: past C a token's long context is a
window of C tokens (windows start every C/2 tokens, each scoring its second half). Within C this is the
package's definition exactly (tests/tasks/test_key_tokens.py checks equality with `longppl.compute_longppl`).

Defaults: the package's trunc_len 4096 and sliding_window 1024 were chosen for 32K-token texts on models that
handle 32K; here they scale with the evaluated model's trained context T: trunc_len T/8, sliding_window T/32
(1024 and 256 for SmolLM2's 8192); alpha 2, beta -2 as the package.

Loss by position: the mean loss of the tokens in half-octave position bins (each bin starts at round(2^(k/2))
and ends where the next starts), from the pass at the largest length, and a fit a * p^-b + c over the bins
that end within the trained context.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .common import record
from .errors import TaskError
from .scoring import token_nll

REFERENCE_CONTEXT = 32768  # the text length the package's defaults were set for
PACKAGE_DEFAULTS = {"trunc_len": 4096, "sliding_window": 1024, "alpha": 2.0, "beta": -2.0}
KEYS = (*PACKAGE_DEFAULTS, "evaluator")
SELF = "self"


# ---------------------------------------------------------------------------------------------- settings
def option_problem(value) -> str | None:
    """Why `value` is not a valid `key_tokens` option (None when it is): null/false (off), true (every
    default) or a mapping of some of trunc_len, sliding_window, alpha, beta, evaluator."""
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, dict):
        return f"must be true or a mapping of {', '.join(KEYS)} — e.g. {{trunc_len: 1024, evaluator: self}}"
    unknown = sorted(set(value) - set(KEYS), key=str)
    if unknown:
        return f"has unknown key {unknown[0]!r} — use {', '.join(KEYS)}"
    for key in ("trunc_len", "sliding_window"):
        v = value.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            return f"{key}={v!r} must be a positive integer — e.g. 1024"
    for key in ("alpha", "beta"):
        v = value.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            return f"{key}={v!r} must be a number — the package uses alpha 2, beta -2"
    evaluator = value.get("evaluator")
    if evaluator is not None and (not isinstance(evaluator, str) or not evaluator.strip()):
        return f"evaluator={evaluator!r} must be 'self' or a model (hub id, local path, .gguf or alias)"
    return None


def requested(value) -> bool:
    return value is not None and value is not False


def given_trunc_len(value) -> int | None:
    return value.get("trunc_len") if isinstance(value, dict) else None


def evaluator_spec(value) -> str:
    return (value.get("evaluator") if isinstance(value, dict) else None) or SELF


@dataclass(frozen=True)
class Settings:
    trunc_len: int
    sliding_window: int
    alpha: float
    beta: float
    evaluator: str  # "self" or an extend.load spec


def resolve(value, trained_context: int) -> Settings:
    """The settings of option `value`, missing ones from the package's defaults scaled to
    `trained_context`."""
    problem = option_problem(value)
    if problem:
        raise TaskError(f"perplexity option key_tokens {problem}")
    given = value if isinstance(value, dict) else {}
    scale = trained_context / REFERENCE_CONTEXT
    return Settings(
        trunc_len=given.get("trunc_len") or max(1, round(PACKAGE_DEFAULTS["trunc_len"] * scale)),
        sliding_window=given.get("sliding_window")
        or max(1, round(PACKAGE_DEFAULTS["sliding_window"] * scale)),
        alpha=float(given.get("alpha", PACKAGE_DEFAULTS["alpha"])),
        beta=float(given.get("beta", PACKAGE_DEFAULTS["beta"])),
        evaluator=evaluator_spec(value),
    )


def offsets_problem(tokenizer) -> str | None:
    """Why `tokenizer` cannot map tokens to character spans (None when it can)."""
    if not getattr(tokenizer, "is_fast", False):
        return (
            f"its tokenizer ({type(tokenizer).__name__}) is not a fast tokenizer and gives no character "
            "offsets"
        )
    try:
        enc = tokenizer("The grass is green.", add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError) as e:
        return f"its tokenizer gives no character offsets ({type(e).__name__})"
    spans = enc.get("offset_mapping") or []
    if len(spans) != len(enc["input_ids"]) or not any(e > s for s, e in spans):
        return "its tokenizer's character offsets are empty"
    return None


# ---------------------------------------------------------------------------------------------- evaluator
@dataclass
class Evaluator:
    model: object
    tokenizer: object
    identity: str  # what the key-span cache is keyed by
    context: int  # the longest window it sees (its trained context)
    is_self: bool


_LOADED: dict = {}  # (spec, device, dtype) -> (model, tokenizer): one named evaluator kept per process


def evaluator_for(spec: str, model, tokenizer) -> Evaluator:
    import extend
    from extend.forward import device_of

    if spec == SELF:
        return Evaluator(model, tokenizer, f"self:{fingerprint(model)}", extend.trained_context(model), True)
    dtype = next(model.parameters()).dtype
    key = (spec, str(device_of(model)), str(dtype))
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = extend.load(spec, device=key[1], dtype=dtype)
    ev_model, ev_tok = _LOADED[key]
    problem = offsets_problem(ev_tok)
    if problem:
        raise TaskError(f"key_tokens evaluator {spec!r}: {problem} — name an evaluator with a fast tokenizer")
    identity = f"{spec}:{_mtime(spec)}:{fingerprint(ev_model)}"
    return Evaluator(ev_model, ev_tok, identity, extend.trained_context(ev_model), False)


def _mtime(spec: str) -> int:
    path = Path(spec).expanduser()
    return path.stat().st_mtime_ns if path.exists() else 0


def fingerprint(model) -> str:
    """A cheap hash of a model's weights (up to 1024 evenly spaced values of every parameter), dtype and RoPE
    config: patches change buffers and attention settings, never these."""
    h = hashlib.sha256()
    h.update(
        repr(
            (
                type(model).__name__,
                getattr(model.config, "rope_parameters", None),
                getattr(model.config, "max_position_embeddings", None),
            )
        ).encode()
    )
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 1024)].float().cpu()
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


def as_loaded(model) -> bool:
    """Is the model's forward the model as loaded? (no patch, or plain on the shipped RoPE: bit-identical)."""
    import extend

    active = extend.current(model)
    return active is None or (active.method == "plain" and active.options.get("start_from") == "shipped")


# ---------------------------------------------------------------------------------------------- key spans
def encode_with_offsets(tokenizer, text: str, prefix: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """`prefix` + the text's tokens, with each token's character span ((0, 0) for the prefix)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(prefix) + list(enc["input_ids"]), [(0, 0)] * len(prefix) + [
        tuple(o) for o in enc["offset_mapping"]
    ]


def short_losses(model, ids: list[int], trunc_len: int, sliding_window: int, chunk_size: int) -> torch.Tensor:
    """Loss of every position >= trunc_len given only its short window (NaN before trunc_len)."""
    out = torch.full((len(ids),), float("nan"))
    for start in range(0, len(ids) - trunc_len, sliding_window):
        end = min(start + trunc_len + sliding_window, len(ids))
        out[start + trunc_len : end] = token_nll(
            model, ids[start:end], start=trunc_len, chunk_size=chunk_size
        )
    return out


def long_losses(
    model, ids: list[int], first: int, context: int, chunk_size: int, shared=None
) -> torch.Tensor:
    """Loss of every position >= first given the whole text before it, at most `context` tokens of it (windows
    of `context` starting every context/2, each scoring its second half). `shared`: the losses of positions
    first.. of the first window, already computed by the same model on the same ids."""
    out = torch.full((len(ids),), float("nan"))
    head = min(len(ids), context)
    out[first:head] = (
        shared[: head - first]
        if shared is not None
        else token_nll(model, ids[:head], start=first, chunk_size=chunk_size)
    )
    half = context // 2
    start = half
    while start + context - half < len(ids):
        end = min(start + context, len(ids))
        out[start + context - half : end] = token_nll(
            model, ids[start:end], start=context - half, chunk_size=chunk_size
        )
        start += half
    return out


def merge_touching(spans: list[tuple[int, int]]) -> list[list[int]]:
    """Consecutive spans where one starts exactly where the previous ends become one span."""
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s == merged[-1][1]:
            merged[-1][1] = e
        else:
            merged.append([s, e])
    return merged


def find_key_spans(
    text: str, settings: Settings, ev: Evaluator, *, chunk_size: int = 1024, shared=None
) -> list[list[int]]:
    """The character spans of the text's key tokens under evaluator `ev` (see the module docstring).
    `shared` = (ids, nll, first): a pass of the evaluator's own model as loaded over ids, nll[j] the loss of
    position first + j — reused for the long context when the ids are the evaluator's."""
    from extend.patching import unpatched

    from .common import special_prefix

    ids, offsets = encode_with_offsets(ev.tokenizer, text, special_prefix(ev.tokenizer))
    trunc = settings.trunc_len
    if len(ids) <= trunc:
        return []
    if trunc >= ev.context:
        raise TaskError(
            f"key_tokens trunc_len {trunc} is not below the evaluator's trained context {ev.context} — "
            f"use a smaller trunc_len"
        )
    reuse = None
    if shared is not None and list(shared[0]) == ids and shared[2] <= trunc:
        reuse = shared[1][trunc - shared[2] :]
    with unpatched(ev.model) if ev.is_self and reuse is None else contextlib.nullcontext():
        long = long_losses(ev.model, ids, trunc, ev.context, chunk_size, reuse)
        short = short_losses(ev.model, ids, trunc, settings.sliding_window, chunk_size)
    key = ((short - long) > settings.alpha) & (long < -settings.beta)
    return merge_touching([offsets[i] for i in key.nonzero().flatten().tolist()])


_MEMORY: dict[str, list] = {}


def cache_dir() -> Path:
    root = Path(os.environ.get("ROPEBENCH_CACHE") or Path.home() / ".cache" / "ropebench")
    return root / "key_tokens"


def cache_key(identity: str, text: str, settings: Settings, context: int) -> str:
    what = json.dumps([identity, hashlib.sha256(text.encode()).hexdigest(), asdict(settings), context])
    return hashlib.sha256(what.encode()).hexdigest()[:32]


def key_spans(text: str, settings: Settings, ev: Evaluator, *, chunk_size: int = 1024, shared=None) -> list:
    """`find_key_spans`, cached per (evaluator, text, settings) in memory and as JSON under cache_dir()."""
    key = cache_key(ev.identity, text, settings, ev.context)
    if key in _MEMORY:
        return _MEMORY[key]
    path = cache_dir() / f"{key}.json"
    try:
        spans = json.loads(path.read_text())["spans"]
    except (OSError, ValueError, KeyError, TypeError):
        spans = find_key_spans(text, settings, ev, chunk_size=chunk_size, shared=shared)
        _write_atomic(
            path,
            {
                "spans": spans,
                "evaluator": ev.identity,
                "settings": asdict(settings),
                "evaluator_context": ev.context,
                "text_chars": len(text),
            },
        )
    _MEMORY[key] = spans
    return spans


def _write_atomic(path: Path, payload: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, path)
    except OSError:  # a read-only cache costs a recomputation next time, nothing else
        pass


def key_mask(spans: list, offsets: list[tuple[int, int]]) -> torch.Tensor:
    """True for each token (character span `offsets[i]`) that lies inside one of `spans`."""
    if not spans or not offsets:
        return torch.zeros(len(offsets), dtype=torch.bool)
    ordered = sorted(spans)
    starts = torch.tensor([s for s, _ in ordered])
    reach = torch.cummax(torch.tensor([e for _, e in ordered]), 0).values  # furthest end of the spans so far
    tok = torch.tensor(offsets)
    last = (
        torch.searchsorted(starts, tok[:, 0].contiguous(), right=True) - 1
    )  # the last span starting at or before the token
    return (last >= 0) & (reach[last.clamp(min=0)] >= tok[:, 1])


# ------------------------------------------------------------------------------------------- loss by position
def bin_starts(end: int) -> list[int]:
    """Half-octave bin starts 1, 2, 3, 4, 6, 8, 11, 16, ... (round(2^(k/2)), distinct) below `end`."""
    starts, k = [], 0
    while (s := round(2 ** (k / 2))) < end:
        if not starts or s != starts[-1]:
            starts.append(s)
        k += 1
    return starts


def position_bins(first: int, end: int) -> list[tuple[int, int]]:
    """(start, stop) of the bins holding the positions first..end-1, the first clipped to `first`."""
    starts = bin_starts(end)
    bounds = list(zip(starts, starts[1:] + [end], strict=True))
    return [(max(s, first), e) for s, e in bounds if e > first]


def power_law_fit(x, y) -> tuple[float, float, float] | None:
    """(a, b, c) of y = a * x^-b + c by least squares, 0 < b <= 10 (None for fewer than 4 points). For a given
    b the best a and c are a linear least-squares solve; b is searched on a grid, then by golden section."""
    import numpy as np

    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 4:
        return None

    def solve(b: float) -> tuple[float, float, float]:
        design = np.stack([x**-b, np.ones_like(x)], axis=1)
        (a, c), *_ = np.linalg.lstsq(design, y, rcond=None)
        return float(a), float(c), float(((design @ np.array([a, c]) - y) ** 2).sum())

    grid = np.linspace(0.0, 10.0, 1001)[1:]
    best = float(min(grid, key=lambda b: solve(b)[2]))
    lo, hi = max(best - 0.01, 1e-9), best + 0.01
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(80):  # golden section on the residual around the best grid point
        m1, m2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        lo, hi = (lo, m2) if solve(m1)[2] <= solve(m2)[2] else (m1, hi)
    b = (lo + hi) / 2
    a, c, _ = solve(b)
    return (a, b, c) if all(map(math.isfinite, (a, b, c))) else None


# -------------------------------------------------------------------------------------------- the task's hook
class PassExtras:
    """What perplexity.run adds to its truncate pass: `longppl` per length and `loss_bin` / `loss_fit_*` rows.

    start() -> None when neither is asked; options() -> what goes into every record's task_options;
    add(doc, ids, per_length) per document -> its rows; finish() -> the rows over all documents."""

    def __init__(
        self,
        model,
        tokenizer,
        key_tokens,
        loss_by_position: bool,
        *,
        lengths,
        prefix,
        first,
        corpus,
        chunk_size,
    ):
        import extend

        self.model, self.tokenizer, self.corpus, self.chunk_size = model, tokenizer, corpus, chunk_size
        self.lengths, self.prefix, self.first = lengths, list(prefix), first
        self.trained = extend.trained_context(model)
        self.settings = resolve(key_tokens, self.trained) if requested(key_tokens) else None
        self.by_position = loss_by_position
        self.evaluator: Evaluator | None = None
        self.key_totals = {L: [0.0, 0, 0.0] for L in lengths}  # sum nll over key tokens, count, seconds
        self.bins = position_bins(first, lengths[-1]) if loss_by_position else []
        self.bin_totals = [[0.0, 0] for _ in self.bins]
        if self.settings is not None:
            check_key_token_lengths(key_tokens, lengths)
            problem = offsets_problem(tokenizer)
            if problem:
                raise TaskError(
                    f"key_tokens needs the model's tokens as character spans, but {problem} — load the "
                    f"model with its fast tokenizer"
                )

    @classmethod
    def start(cls, model, tokenizer, key_tokens, loss_by_position, *, protocol, **kw) -> PassExtras | None:
        if not requested(key_tokens) and not loss_by_position:
            return None
        if protocol != "truncate":
            raise TaskError(
                "key_tokens and loss_by_position need protocol='truncate' (positions of one window) — "
                "drop them or use the truncate protocol"
            )
        return cls(model, tokenizer, key_tokens, bool(loss_by_position), **kw)

    def options(self) -> dict:
        out = {}
        if self.settings is not None:
            out["key_tokens"] = dict(asdict(self.settings), evaluator_context=self._evaluator().context)
        if self.by_position:
            out["loss_bins"] = "half-octave"
            out["loss_fit_within"] = self.trained
        return out

    def _evaluator(self) -> Evaluator:
        if self.evaluator is None:
            self.evaluator = evaluator_for(self.settings.evaluator, self.model, self.tokenizer)
        return self.evaluator

    def add(self, doc, ids: list[int], per_length: dict, options: dict) -> list[dict]:
        """Rows of one document; `ids` its text tokens of the largest window, per_length {L: (nll,
        seconds)}."""
        rows = []
        if self.settings is not None:
            rows += self._longppl(doc, ids, per_length, options)
        if self.by_position:
            rows += self._bins(doc, per_length[self.lengths[-1]], options)
        return rows

    def _longppl(self, doc, ids, per_length, options) -> list[dict]:
        t0 = time.perf_counter()
        text, offsets = self._text_of(doc, ids)
        longest = self.lengths[-1]
        shared = (
            (self.prefix + ids, per_length[longest][0], self.first)
            if (self.settings.evaluator == SELF and as_loaded(self.model))
            else None
        )
        spans = key_spans(text, self.settings, self._evaluator(), chunk_size=self.chunk_size, shared=shared)
        mask = key_mask(spans, offsets)
        mask[: max(0, self.first - len(self.prefix))] = False  # tokens before the first scored position
        key_seconds = time.perf_counter() - t0
        rows = []
        for L, (nll, secs) in per_length.items():
            text_tokens = L - len(self.prefix)
            index = torch.nonzero(mask[:text_tokens]).flatten() + len(self.prefix) - self.first
            if index.numel() == 0:
                continue
            losses = nll[index].double()
            total = self.key_totals[L]
            total[0] += losses.sum().item()
            total[1] += index.numel()
            total[2] += secs + key_seconds
            rows.append(
                record(
                    "perplexity",
                    self.corpus,
                    L,
                    "longppl",
                    math.exp(losses.mean().item()),
                    index.numel(),
                    secs + key_seconds,
                    options,
                    doc=doc.id,
                )
            )
        return rows

    def _text_of(self, doc, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
        """The document's text up to the end of its last token in the window, and every such token's span."""
        enc = self.tokenizer(doc.text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"][: len(ids)]) != list(ids):
            raise TaskError(
                f"document {doc.id}: the tokenizer's offsets encoding differs from its plain encoding — "
                f"key_tokens cannot map this tokenizer's tokens to characters"
            )
        offsets = [tuple(o) for o in enc["offset_mapping"][: len(ids)]]
        return doc.text[: offsets[-1][1]], offsets

    def _bins(self, doc, pass_, options) -> list[dict]:
        nll, secs = pass_
        rows = []
        for i, (start, stop) in enumerate(self.bins):
            part = nll[start - self.first : stop - self.first].double()
            self.bin_totals[i][0] += part.sum().item()
            self.bin_totals[i][1] += part.numel()
            rows.append(
                record(
                    "perplexity",
                    self.corpus,
                    self.lengths[-1],
                    "loss_bin",
                    part.mean().item(),
                    part.numel(),
                    secs,
                    options,
                    depth=float(start),
                    doc=doc.id,
                )
            )
        return rows

    def finish(self, options: dict) -> list[dict]:
        rows = []
        for L, (total, n, secs) in self.key_totals.items():
            if n:
                rows.append(
                    record("perplexity", self.corpus, L, "longppl", math.exp(total / n), n, secs, options)
                )
        if not self.by_position:
            return rows
        longest, means, centres = self.lengths[-1], [], []
        for (start, stop), (total, n) in zip(self.bins, self.bin_totals, strict=True):
            rows.append(
                record(
                    "perplexity",
                    self.corpus,
                    longest,
                    "loss_bin",
                    total / n,
                    n,
                    0.0,
                    options,
                    depth=float(start),
                )
            )
            if stop <= self.trained:
                means.append(total / n)
                centres.append((start + stop - 1) / 2)
        fit = power_law_fit(centres, means)
        if fit is not None:
            for name, value in zip(("loss_fit_a", "loss_fit_b", "loss_fit_c"), fit, strict=True):
                rows.append(record("perplexity", self.corpus, longest, name, value, len(means), 0.0, options))
        return rows


def check_key_token_lengths(value, lengths: list[int]) -> None:
    """A trunc_len at or above a length leaves that length without key tokens: refused when given; a default
    one only drops longppl at the lengths it reaches (no row there)."""
    trunc = given_trunc_len(value)
    if trunc is not None and trunc >= min(lengths):
        raise TaskError(
            f"perplexity key_tokens trunc_len {trunc} is at or above length {min(lengths)}: no token "
            f"there has more than trunc_len tokens before it — use trunc_len < {min(lengths)}"
        )


# ------------------------------------------------------------------------------------------- before the model
def sliding_problem(options: dict) -> str | None:
    """key_tokens and loss_by_position read positions of one window: the truncate protocol only."""
    if options.get("protocol", "truncate") == "sliding":
        asked = [k for k in ("key_tokens", "loss_by_position") if requested(options.get(k))]
        if asked:
            return (
                f"option {asked[0]} needs protocol truncate (positions of one window) — drop it or use "
                "truncate"
            )
    return None


def check_before_load(lengths: list[int], options: dict, tokenizer=None) -> None:
    """What refuses key_tokens before any weights load: a given trunc_len at or above a length, and a
    tokenizer (the evaluator's, or the model's own for evaluator self, when given) that cannot map tokens to
    characters."""
    value = options.get("key_tokens")
    if not requested(value):
        return
    check_key_token_lengths(value, lengths)
    spec = evaluator_spec(value)
    if spec == SELF:
        problem = offsets_problem(tokenizer) if tokenizer is not None else None
        where = "the model (evaluator self)"
    else:
        from extend.preflight import tokenizer_of

        problem, where = offsets_problem(tokenizer_of(spec)), f"evaluator {spec!r}"
    if problem:
        raise TaskError(
            f"perplexity key_tokens: {where} cannot map key tokens to character spans: {problem} — "
            f"name an evaluator with a fast tokenizer (key_tokens.evaluator)"
        )
