"""Key-token perplexity (LongPPL) and loss by position, both from the perplexity task's one pass.

LongPPL (Fang et al., ICLR 2025, arXiv:2410.23771; the `longppl` 0.3.0 package): a token is *key* when an
evaluator's loss on it with the long context is lower than with a short one by more than `alpha` and below
`-beta`; key tokens are kept as character spans, so they transfer to any tokenizer; LongPPL = exp(mean loss
of the evaluated model over its key tokens). Within the evaluator's trained context this is the package's
definition exactly (tests/tasks/test_key_tokens.py checks equality with `longppl.compute_longppl`).

The evaluator: "self" (default) is the evaluated model with no patch; with it no cell selects (the
unpatched model's own losses would favour plain): each cell writes `longppl_token_losses` rows
(tasks/key_losses.py) and results/longppl.py selects from the compared settings' mean loss when results
load. A named evaluator (any `extend.load` spec) selects once per document, shared by every setting (the cache
below), and the cell writes `longppl` itself. The perplexity task's hook that writes these rows is
tasks/pass_extras.py (`PassExtras`).

Loss by position: mean loss in half-octave position bins and a weighted fit a * p^-b + c (`power_law_fit`).
Windows, defaults (SHORT_FRACTION), the evaluator past its trained context and the minimum of key tokens:
docs/tasks.md, "Key-token perplexity (LongPPL)" and "Loss by position".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .errors import TaskError
from .loss_fit import (  # noqa: F401  (re-exported: tasks.key_tokens.power_law_fit and the rest stay valid)
    B_RANGE,
    CHI2_1,
    FIT_LEVEL,
    MIN_FIT_BINS,
    MIN_FIT_DOCS,
    PowerLawFit,
    bin_starts,
    position_bins,
    power_law_fit,
)
from .scoring import token_nll

PACKAGE_DEFAULTS = {"trunc_len": 4096, "sliding_window": 1024, "alpha": 2.0, "beta": -2.0}
KEYS = (*PACKAGE_DEFAULTS, "evaluator")
SELF = "self"
SELECTION = (
    "the paper's per-token rule on the evaluator's losses: short-context loss - long-context loss > alpha "
    "and long-context loss < -beta; one set of key tokens per document, the same for every setting"
)

# The default rule (docs/tasks.md, "Key-token perplexity"): the short context is 1/32 of the trained context
# T in force, so a text of T/4 tokens has the package's 1:8 of short to long context (4096 of 32K); a short
# window is shared by T/64 tokens (the package's 1/4 of trunc_len would cost 5 passes per token, this 3).
# alpha follows the evaluator's size: the package's 2 for 7B parameters and more (what the paper used), 0.5
# for 1B and less (a 135M model's long context rarely lowers a token's loss by 2 nats: 0-1 key tokens per
# 4096-token speech), linear in log parameters between. beta stays the package's -2 (long loss below 2 nats).
SHORT_FRACTION = 32
WINDOW_FRACTION = 64
ALPHA_SMALL, ALPHA_LARGE = 0.5, 2.0
SMALL_PARAMS, LARGE_PARAMS = 1e9, 7e9
# Below this many key tokens over a length's documents the `longppl` value is withheld (the
# `longppl_key_tokens` row still says how many there were): fewer is a perplexity of a handful of tokens.
MIN_KEY_TOKENS = 30


# ---------------------------------------------------------------------------------------------- settings
def option_problem(value) -> str | None:
    """Why `value` is not a valid `key_tokens` option (None when it is): null/false (off), true (every
    default) or a mapping of some of trunc_len, sliding_window, alpha, beta, evaluator."""
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, dict):
        return f"must be true or a mapping of {', '.join(KEYS)} — e.g. {{trunc_len: 1024, evaluator: self}}"
    if "split" in value:  # the option of the removed split-sample selection
        return "split is no longer an option: longppl always uses the paper's per-token rule (docs/tasks.md)"
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
    alpha = value.get("alpha")
    if alpha is not None and alpha < 0:
        return (
            f"alpha={alpha!r} must be >= 0: a key token is one the long context makes more likely (the "
            "package uses 2)"
        )
    beta = value.get("beta")
    if beta is not None and beta >= 0:  # a loss is never negative: no token could qualify
        return (
            f"beta={beta!r} must be below 0: a key token's long-context loss must be below -beta = "
            f"{-beta + 0.0:g}, and a loss is never below 0 — the package uses beta -2"
        )
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


def default_alpha(parameters: int | None) -> float:
    """alpha by the evaluator's parameter count (see the rule above); None: the package's."""
    if not parameters:
        return ALPHA_LARGE
    t = (math.log(parameters) - math.log(SMALL_PARAMS)) / (math.log(LARGE_PARAMS) - math.log(SMALL_PARAMS))
    return round(ALPHA_SMALL + (ALPHA_LARGE - ALPHA_SMALL) * min(1.0, max(0.0, t)), 3)


def resolve(value, trained_context: int, parameters: int | None = None) -> Settings:
    """The settings of option `value`, missing ones from the default rule: trunc_len T/32, sliding_window
    T/64 (T = `trained_context`, the one in force), alpha by the evaluator's `parameters`, beta -2."""
    problem = option_problem(value)
    if problem:
        raise TaskError(f"perplexity option key_tokens {problem}")
    given = value if isinstance(value, dict) else {}
    return Settings(
        trunc_len=given.get("trunc_len") or max(1, trained_context // SHORT_FRACTION),
        sliding_window=given.get("sliding_window") or max(1, trained_context // WINDOW_FRACTION),
        alpha=float(given.get("alpha", default_alpha(parameters))),
        beta=float(given.get("beta", PACKAGE_DEFAULTS["beta"])),
        evaluator=evaluator_spec(value),
    )


def in_force(model) -> int:
    """The trained context in force: the active patch's resolved one (it follows a forced
    original_max_position_embeddings and start_from; what the rows record), else the config's."""
    from ropebench import extend

    active = extend.current(model)
    if active is not None and active.options.get("trained_context"):
        return int(active.options["trained_context"])
    return extend.trained_context(model)


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


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
    """The evaluator `spec` names. "self" sees the trained context in force (a forced
    original_max_position_embeddings included): the one the rows record."""
    from ropebench import extend
    from ropebench.extend.forward import device_of

    if spec == SELF:
        return Evaluator(model, tokenizer, f"self:{fingerprint(model)}", in_force(model), True)
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
    rope, longest = (getattr(model.config, k, None) for k in ("rope_parameters", "max_position_embeddings"))
    h = hashlib.sha256(repr((type(model).__name__, rope, longest)).encode())
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 1024)].float().cpu()
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- key spans
def encode_with_offsets(tokenizer, text: str, prefix: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """`prefix` + the text's tokens, with each token's character span ((0, 0) for the prefix)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [(0, 0)] * len(prefix) + [tuple(o) for o in enc["offset_mapping"]]
    return list(prefix) + list(enc["input_ids"]), offsets


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
    start = half = context // 2
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
    from ropebench.extend.patching import unpatched

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
    key = paper_rule(short, long, settings.alpha, settings.beta)
    return merge_touching([offsets[i] for i in key.nonzero().flatten().tolist()])


def paper_rule(short: torch.Tensor, long: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """The paper's per-token rule (`longppl.find_key_token`): the long context lowers the loss by more than
    alpha (LSD) and the long-context loss is below -beta (LCL). NaN losses (no short window) are never key."""
    return ((short - long) > alpha) & (long < -beta)


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
    from ropebench.extend.errors import RopebenchError
    from ropebench.extend.owned_paths import owned_cache

    try:
        owned = owned_cache()  # never into a folder of the user's (ROPEBENCH_CACHE)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, path)
        if path.parent.parent == owned.root:
            owned.record([path.relative_to(owned.root)], appended=True)
    except (OSError, RopebenchError):  # a read-only cache, a folder of the user's: recomputed next time
        pass


def key_mask(spans: list, offsets: list[tuple[int, int]]) -> torch.Tensor:
    """True for each token (character span `offsets[i]`) that lies inside one of `spans`."""
    if not spans or not offsets:
        return torch.zeros(len(offsets), dtype=torch.bool)
    ordered = sorted(spans)
    starts = torch.tensor([s for s, _ in ordered])
    reach = torch.cummax(torch.tensor([e for _, e in ordered]), 0).values  # furthest end of the spans so far
    tok = torch.tensor(offsets)
    # the last span starting at or before the token
    last = torch.searchsorted(starts, tok[:, 0].contiguous(), right=True) - 1
    return (last >= 0) & (reach[last.clamp(min=0)] >= tok[:, 1])


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
    """What refuses key_tokens before any weights load: a given trunc_len at or above a length or at or above
    the evaluator's trained context (a named evaluator's from its config; for self, the config of the model
    the tokenizer came from, when it is a local directory — a forced original_max_position_embeddings is
    checked when the task runs), a tokenizer (the evaluator's, or the model's own for evaluator self, when
    given) that cannot map tokens to characters, and a named evaluator directory without weights."""
    value = options.get("key_tokens")
    if not requested(value):
        return
    problem = option_problem(value)  # alpha < 0 and the rest: also here for callers that skip check_task
    if problem:
        raise TaskError(f"perplexity option key_tokens {problem}")
    check_key_token_lengths(value, lengths)
    spec = evaluator_spec(value)
    if spec == SELF:
        problem = offsets_problem(tokenizer) if tokenizer is not None else None
        where = "the model (evaluator self)"
        config_spec = getattr(tokenizer, "name_or_path", None) if tokenizer is not None else None
        if not (config_spec and (Path(config_spec) / "config.json").is_file()):
            config_spec = None
    else:
        from ropebench.extend.preflight import tokenizer_of

        problem, where, config_spec = offsets_problem(tokenizer_of(spec)), f"evaluator {spec!r}", spec
    if problem:
        raise TaskError(
            f"perplexity key_tokens: {where} cannot map key tokens to character spans: {problem} — "
            f"name an evaluator with a fast tokenizer (key_tokens.evaluator)"
        )
    if spec != SELF:
        missing = missing_weights(spec)
        if missing:
            raise TaskError(f"perplexity key_tokens: evaluator {spec!r} {missing} — name a complete model")
    trunc = given_trunc_len(value)
    if trunc is not None and config_spec:
        from ropebench.extend.loading import trained_context_of

        context = trained_context_of(config_spec)
        if trunc >= context:
            raise TaskError(
                f"perplexity key_tokens trunc_len {trunc} is not below {where}'s trained context {context}: "
                f"no token would have a long context longer than its short one — use trunc_len < {context}"
            )


WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.safetensors.index.json")


def missing_weights(spec: str) -> str | None:
    """Why a local model directory `spec` cannot load (None when it has weight files, or is not a local
    directory: aliases and .gguf files are checked by extend.loading, hub ids when they load)."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        return None
    if any(next(path.glob(pattern), None) is not None for pattern in WEIGHT_PATTERNS):
        return None
    return f"has no weights (no {', '.join(WEIGHT_PATTERNS[:3])} file in {spec})"
