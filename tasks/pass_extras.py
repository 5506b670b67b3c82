"""What the perplexity task's truncate pass adds besides perplexity: LongPPL (Fang et al., ICLR 2025,
arXiv:2410.23771) and loss by position, both from the task's one pass (docs/tasks.md).

LongPPL: with the default evaluator "self" the cell writes `longppl_token_losses` rows (tasks/key_losses.py)
and the key tokens are chosen when results load, from the compared settings' mean loss; with a named
evaluator the cell scores the evaluator's key tokens (tasks/key_tokens.py) and writes `longppl` and
`longppl_key_tokens` itself. Loss by position: half-octave bins and the fit of tasks/loss_fit.py.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict

import torch

from . import key_losses
from . import key_tokens as kt  # read when called: tests and the cost benchmark swap its cache and minimum
from .common import record
from .errors import TaskError
from .key_tokens import (
    Evaluator,
    check_key_token_lengths,
    evaluator_for,
    evaluator_spec,
    in_force,
    key_mask,
    offsets_problem,
    parameter_count,
    requested,
    resolve,
)
from .loss_fit import FIT_LEVEL, MIN_FIT_DOCS, position_bins, power_law_fit


class PassExtras:
    """What perplexity.run adds to its truncate pass: `longppl_token_losses` per document and length
    (evaluator "self": `longppl` is derived when results load) or `longppl` and `longppl_key_tokens` per
    length (a named evaluator), and `loss_bin` / `loss_fit_*` rows.

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
        self.model, self.tokenizer, self.corpus, self.chunk_size = model, tokenizer, corpus, chunk_size
        self.row = functools.partial(record, "perplexity", corpus)  # a record of this task and corpus
        self.lengths, self.prefix, self.first = lengths, list(prefix), first
        self.trained = in_force(model)  # what the rows record (a forced original_max_position_embeddings too)
        self.settings = None
        self.by_position = loss_by_position
        self.evaluator: Evaluator | None = None
        self.deferred = False
        # sum nll over key tokens, count, seconds, docs
        self.key_totals = {L: [0.0, 0, 0.0, 0] for L in lengths}
        self.key_rows: dict[int, list[dict]] = {L: [] for L in lengths}  # per document, written at finish
        self.docs = 0
        self.bins = position_bins(first, lengths[-1]) if loss_by_position else []
        self.bin_totals = [[0.0, 0, 0.0] for _ in self.bins]  # sum, tokens, sum of squares
        if requested(key_tokens):
            check_key_token_lengths(key_tokens, lengths)
            problem = offsets_problem(tokenizer)
            if problem:
                raise TaskError(
                    f"key_tokens needs the model's tokens as character spans, but {problem} — load the "
                    f"model with its fast tokenizer"
                )
            self.evaluator = evaluator_for(evaluator_spec(key_tokens), model, tokenizer)
            self.settings = resolve(key_tokens, self.trained, parameter_count(self.evaluator.model))
            # "self": the cell writes token losses and the selection waits for the compared settings
            self.deferred = self.evaluator.is_self
            if self.settings.trunc_len >= self.evaluator.context:
                raise TaskError(
                    f"key_tokens trunc_len {self.settings.trunc_len} is not below the evaluator's trained "
                    f"context {self.evaluator.context} — use a smaller trunc_len"
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
            out["key_tokens"] = dict(
                asdict(self.settings),
                evaluator_context=self.evaluator.context,
                trained_context=self.trained,
                min_key_tokens=kt.MIN_KEY_TOKENS,
                selection=key_losses.SELECTION if self.deferred else kt.SELECTION,
            )
        if self.by_position:
            out["loss_bins"] = "half-octave"
            out["loss_fit_within"] = self.trained
        return out

    def add(self, doc, ids: list[int], per_length: dict, options: dict) -> list[dict]:
        """Rows of one document; `ids` its text tokens of the largest window, per_length {L: (nll,
        seconds)}. LongPPL's per-document rows wait for finish (written only where the length's total of key
        tokens reaches MIN_KEY_TOKENS)."""
        self.docs += 1
        rows = []
        if self.settings is not None and self.deferred:
            rows += self._token_losses(doc, ids, per_length, options)
        elif self.settings is not None:
            self._longppl(doc, ids, per_length, options)
        return rows + (self._bins(doc, per_length[self.lengths[-1]], options) if self.by_position else [])

    def _token_losses(self, doc, ids, per_length, options) -> list[dict]:
        """One `longppl_token_losses` row per length: the unpatched model's short-context losses (shared by
        every setting: cached per text) and this setting's own losses at that length, position by position."""
        from ropebench.extend.patching import unpatched

        t0 = time.perf_counter()
        window, s = self.prefix + list(ids), self.settings

        def compute():
            with unpatched(self.model):
                return kt.short_losses(self.model, window, s.trunc_len, s.sliding_window, self.chunk_size)

        key = key_losses.short_key(self.evaluator.identity, window, s.trunc_len, s.sliding_window)
        short = key_losses.cached_short_losses(compute, key, kt.cache_dir(), kt._MEMORY, kt._write_atomic)
        short_seconds = time.perf_counter() - t0
        rows = []
        for L, (nll, secs) in per_length.items():
            losses = key_losses.payload(short[self.first : L], nll, self.first, self.evaluator.identity)
            opts, n = dict(options, token_losses=losses), nll.numel()
            rows.append(self.row(L, key_losses.METRIC, n, n, secs + short_seconds, opts, doc=doc.id))
        return rows

    def _row_options(self, options: dict, length: int) -> dict:
        """Past the evaluator's context C a key token's evidence can only lie within C tokens before it."""
        if length > self.evaluator.context:
            return dict(options, key_evidence_within=self.evaluator.context)
        return options

    def _longppl(self, doc, ids, per_length, options) -> None:
        """A named evaluator's key tokens, scored here (the same for every setting: symmetric already)."""
        t0 = time.perf_counter()
        text, offsets = self._text_of(doc, ids)
        # the package's selection on the longest text: causal, so its part within a window is the selection on
        # that window's text (`_masks`)
        spans = kt.key_spans(text, self.settings, self.evaluator, chunk_size=self.chunk_size)
        masks = self._masks(text, offsets, spans, per_length)
        key_seconds = time.perf_counter() - t0
        for L, (nll, secs) in per_length.items():
            index = torch.nonzero(masks[L]).flatten() + len(self.prefix) - self.first
            total, n, secs = self.key_totals[L], index.numel(), secs + key_seconds
            total[2] += secs
            total[3] += 1
            if n == 0:
                continue
            losses = nll[index].double()
            total[0] += losses.sum().item()
            total[1] += n
            value, opts = math.exp(losses.mean().item()), self._row_options(options, L)
            self.key_rows[L].append(self.row(L, "longppl", value, n, secs, opts, doc=doc.id))

    def _masks(self, text: str, offsets, spans: list, per_length: dict) -> dict[int, torch.Tensor]:
        """{L: which of the window's text tokens are key}: the package's spans inside the window."""
        masks = {}
        for L in per_length:
            text_tokens = min(L - len(self.prefix), len(offsets))
            mask = key_mask(spans, offsets[:text_tokens])
            mask[: max(0, self.first - len(self.prefix))] = False  # tokens before the first scored position
            masks[L] = mask
        return masks

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
            self.bin_totals[i][2] += (part * part).sum().item()
            where = {"depth": float(start), "doc": doc.id}
            mean, n = part.mean().item(), part.numel()
            rows.append(self.row(self.lengths[-1], "loss_bin", mean, n, secs, options, **where))
        return rows

    def finish(self, options: dict) -> list[dict]:
        rows = []
        if self.settings is not None and not self.deferred:
            for L, (total, n, secs, docs) in self.key_totals.items():
                opts = self._row_options(options, L)
                # every length says how many key tokens its LongPPL rests on (0: none could be found)
                rows.append(self.row(L, "longppl_key_tokens", n, docs, secs, opts))
                if n >= kt.MIN_KEY_TOKENS:
                    rows += self.key_rows[L]
                    rows.append(self.row(L, "longppl", math.exp(total / n), n, secs, opts))
        return rows + (self._fit_rows(options) if self.by_position else [])

    def _fit_rows(self, options: dict) -> list[dict]:
        """The aggregate `loss_bin` rows and the fit over the bins within the trained context, weighted by
        inverse variance (tokens per bin over the pooled variance of a token's loss). The fit's outcome (its
        weights, the exponent's interval, or why there is none) is in every aggregate row's
        task_options.loss_fit."""
        longest, means, ranges, tokens, sums, squares = self.lengths[-1], [], [], [], 0.0, 0.0
        for (start, stop), (total, n, sq) in zip(self.bins, self.bin_totals, strict=True):
            if stop <= self.trained:
                means.append(total / n)
                ranges.append((start, stop))
                tokens.append(n)
                sums, squares = sums + total, squares + sq
        count = sum(tokens)
        variance = (squares - sums * sums / count) / (count - 1) if count > 1 else math.nan
        fit, problem = None, None
        if self.docs < MIN_FIT_DOCS:
            problem = (
                f"{self.docs} document: the fit needs at least {MIN_FIT_DOCS} (one text's losses drift "
                f"together, so its own spread understates the bins' error)"
            )
        elif not (variance > 0):
            problem = "the token losses have no spread to weight the bins by"
        else:
            fit = power_law_fit(ranges, means, [n / variance for n in tokens])
            problem = "fewer than 4 bins within the trained context" if fit is None else fit.problem
        outcome = {"weights": "tokens / pooled token variance", "bins": len(means), "within": self.trained}
        if problem is not None:
            outcome["status"] = f"no fit: {problem}"
        else:
            outcome.update(
                status="fitted",
                level=FIT_LEVEL,
                b_interval=[round(v, 6) for v in fit.b_interval],
                chi2_per_dof=round(fit.chi2_per_dof, 6),
            )
        fit_options = dict(options, loss_fit=outcome)
        rows = [
            self.row(longest, "loss_bin", total / n, n, 0.0, fit_options, depth=float(start))
            for (start, _), (total, n, _) in zip(self.bins, self.bin_totals, strict=True)
        ]
        if problem is None:
            for name, value in zip(
                ("loss_fit_a", "loss_fit_b", "loss_fit_c"), (fit.a, fit.b, fit.c), strict=True
            ):
                rows.append(self.row(longest, name, value, len(means), 0.0, fit_options))
        return rows
