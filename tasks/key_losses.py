"""LongPPL's per-token losses for a selection made when results load (the default evaluator "self").

LongPPL (Fang et al., ICLR 2025, arXiv:2410.23771) picks key tokens by the paper's per-token rule on a
short-context and a long-context loss. With the evaluated model as its own evaluator the selection would
favour the setting whose losses chose the tokens (docs/measured.md, "LongPPL's evaluator bias"). So with
evaluator "self" a cell chooses nothing: per document and length it writes one `longppl_token_losses` row
carrying the short-context losses (the unpatched model's short windows: the same for every setting, cached
per text) and this setting's own long-context losses (its pass at that length). results/longppl.py selects
the key tokens from the mean long-context loss of every setting compared and derives `longppl` from them, so
the selection is symmetric in the settings by construction.

Losses travel as base64 of little-endian float32 bytes (`encode` / `decode`): compact, exact, and readable
without pickle.
"""

from __future__ import annotations

import base64
import hashlib
import json

import numpy as np
import torch

ENCODING = "base64 float32 little-endian"
METRIC = "longppl_token_losses"
SELECTION = (
    "made when results load (results/longppl.py): the paper's per-token rule on the unpatched model's "
    "short-context losses and the mean long-context loss of the compared settings"
)


def encode(losses: torch.Tensor) -> str:
    """Float32 little-endian bytes of `losses`, as base64 text (NaN kept: positions with no short window)."""
    return base64.b64encode(losses.detach().float().cpu().numpy().astype("<f4").tobytes()).decode("ascii")


def decode(text: str) -> np.ndarray:
    """The float32 array `encode` wrote."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def short_key(identity: str, ids: list[int], trunc_len: int, sliding_window: int) -> str:
    """What a text's short-context losses depend on: the evaluator, the tokens and the window rule — never
    the setting scored (every setting of a sweep shares them)."""
    tokens = hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()
    what = json.dumps(["short-losses", identity, tokens, trunc_len, sliding_window])
    return hashlib.sha256(what.encode()).hexdigest()[:32]


def cached_short_losses(compute, key: str, folder, memory: dict, write) -> torch.Tensor:
    """`compute()` once per `key`: kept in `memory` and as JSON under `folder` (written by `write`, the
    key-span cache's atomic writer), so a later setting of the same text reads them instead of recomputing."""
    if key in memory:
        return memory[key]
    path = folder / f"{key}.json"
    try:
        payload = json.loads(path.read_text())
        losses = torch.from_numpy(decode(payload["short"]).copy())
    except (OSError, ValueError, KeyError, TypeError):
        losses = compute()
        write(path, {"short": encode(losses), "encoding": ENCODING, "tokens": int(losses.numel())})
    memory[key] = losses
    return losses


def payload(short: torch.Tensor, long: torch.Tensor, first: int, identity: str) -> dict:
    """The task_options entry of one `longppl_token_losses` row: position first + j's short and long losses
    at index j (short NaN where the position has no short window)."""
    return {
        "first": first,
        "tokens": int(long.numel()),
        "short": encode(short),
        "long": encode(long),
        "short_context": identity,
        "encoding": ENCODING,
    }
