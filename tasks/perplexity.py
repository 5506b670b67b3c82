"""Perplexity versus context length, two protocols.

- truncate: each document's first L tokens form one window (the YaRN eval.sh protocol).
- sliding: the first `span` text tokens of each document (default: those of the largest window,
  so every L scores the same text) are covered by windows of L tokens moved by `stride`; each window scores
  only the tokens no earlier window scored (Press et al.; used by PI). The last window is aligned to the end
  of the span so that every window has a full L tokens of context.

Metrics: `loss` and `ppl` over each whole window; with `truncate`, `ppl_tail` at each length but the
first: the perplexity of only the tokens between the previous length and L (aggregated over documents).

BOS: every window starts with the ids the tokenizer's own encoding puts before text (`special_prefix`:
BOS for Llama-style tokenizers, nothing for Qwen2.5 or SmolLM2); add_bos=True/False overrides. The prefix is
counted inside L and never scored; without one the first token of a window is context only. Every record's
options say what was used (add_bos, prefix_ids, bos_setting).
key_tokens={...} adds `longppl` (LongPPL, the paper's per-token rule; withheld below MIN_KEY_TOKENS key
tokens) and `longppl_key_tokens` (how many) per length — with the default evaluator "self" as
`longppl_token_losses` rows from which results.load derives them over the compared settings
(results/longppl.py) — and loss_by_position=True adds `loss_bin` rows and a weighted power-law fit with
an interval for its exponent, both from the same pass (truncate protocol; tasks/key_tokens.py).
Every length uses the same documents: those with at least max(lengths) tokens (shorter ones are
skipped and counted, never padded; join_docs=True concatenates consecutive documents instead).
"""

from __future__ import annotations

import functools
import itertools
import math
import time

from tqdm.auto import tqdm

from .common import (
    check_choice,
    check_lengths,
    check_positive,
    encoder,
    length_dependent,
    prefix_options,
    record,
    special_prefix,
)
from .data import iter_corpus, seeded_order, take_long
from .errors import TaskError
from .key_tokens import check_before_load, option_problem, requested, sliding_problem
from .kit import Metric, choice, declare, flag, optional_flag
from .pass_extras import PassExtras
from .scoring import token_nll
from .sizes import CHUNK_COST, DOC_COST, MAX_CHUNK, MAX_DOCS, MAX_TOKENS, TOKEN_COST, at_most, at_most_or_none


def _sliding_only(options: dict) -> str | None:
    if options.get("protocol", "truncate") == "truncate":
        extra = [k for k in ("stride", "span") if options.get(k) is not None]
        if extra:
            return f"option {extra[0]} only applies to protocol sliding — drop it or set protocol: sliding"
    return sliding_problem(options)


def fits(lengths: list[int], options: dict, corpus: str, tokenizer) -> None:
    """Lengths too short to score a token, a sliding stride wider than the window, longer than every document
    of the corpus (a byte bound: see tasks.data.document_bytes)."""
    from .data import document_bytes

    bos = 0 if tokenizer is None else len(special_prefix(tokenizer, options.get("add_bos")))
    if lengths[0] < bos + 2:
        raise TaskError(
            f"perplexity length {lengths[0]} is too short to score a token (a window needs the "
            f"special prefix ({bos} token(s)), one context token and one scored token) — use lengths "
            f">= {bos + 2}, e.g. 1024"
        )
    stride = options.get("stride")
    if options.get("protocol") == "sliding" and stride is not None and stride > lengths[0] - 1:
        raise TaskError(
            f"perplexity stride {stride} is larger than the window (length {lengths[0]}): the "
            f"first tokens of every window would go unscored — use stride <= {lengths[0] - 1} "
            f"(e.g. half the shortest length)"
        )
    check_before_load(lengths, options, tokenizer)  # key_tokens: trunc_len, tokenizers with character offsets
    sizes = document_bytes(corpus)
    if not sizes:
        return
    span = options.get("span") if options.get("protocol") == "sliding" else None
    need = (span or lengths[-1]) - bos  # text tokens per document
    most = sum(sizes) + len(sizes) if options.get("join_docs") else max(sizes)
    if most + 1 < need:  # a document of n bytes has at most n + 1 tokens
        what = "all its documents joined" if options.get("join_docs") else "its longest document"
        raise TaskError(
            f"perplexity length {span or lengths[-1]} is longer than corpus {corpus!r} can fill: "
            f"{what} has {most} bytes, so at most {most + 1} tokens — use lengths <= {most + 1}, "
            f"join_docs: true, or a corpus with longer documents"
        )


@declare(
    "perplexity",
    options={
        "protocol": choice("truncate", "sliding"),
        "num_docs": at_most(MAX_DOCS, DOC_COST),
        "chunk_size": at_most(MAX_CHUNK, CHUNK_COST),
        "stride": at_most_or_none(MAX_TOKENS, TOKEN_COST),
        "span": at_most_or_none(MAX_TOKENS, TOKEN_COST),
        "add_bos": optional_flag,
        "join_docs": flag,
        "key_tokens": option_problem,
        "loss_by_position": flag,
    },
    metrics={
        "loss": Metric("mean", "lower", "nats/token", "mean NLL per token", role="detail", lo=0.0),
        "ppl": Metric("perplexity", "lower", "perplexity", "perplexity", lo=1.0),
        "ppl_tail": Metric(
            "perplexity",
            "lower",
            "perplexity",
            "perplexity of the tokens between the previous length and this one",
            reach=("threshold", "trained"),
            lo=1.0,
        ),
        "longppl": Metric(
            "perplexity", "lower", "perplexity", "LongPPL: perplexity of the paper's key tokens", lo=1.0
        ),
        "longppl_key_tokens": Metric(
            "mean", None, "key tokens", "key tokens behind the length's LongPPL", role="detail", lo=0.0
        ),
        "longppl_token_losses": Metric(
            "mean",
            None,
            "tokens",
            "per-token losses LongPPL's key tokens are selected from when results load",
            role="detail",
            lo=0.0,
        ),
        "loss_bin": Metric(
            "mean", "lower", "nats/token", "mean NLL of a position bin", role="detail", by_position=True
        ),
        "loss_fit_a": Metric("mean", None, "nats/token", "a of a*p^-b+c", role="detail"),
        "loss_fit_b": Metric("mean", None, "", "b of a*p^-b+c", role="detail"),
        "loss_fit_c": Metric("mean", None, "nats/token", "c of a*p^-b+c", role="detail"),
    },
    tables=(
        ("ppl", "perplexity (lower is better)"),
        ("ppl_tail", "perplexity of the tokens since the previous length (lower is better)"),
    ),
    together=_sliding_only,
    fits=fits,
    needs_tokenizer=lambda lengths, options: lengths[0] < 16 or requested(options.get("key_tokens")),
)
def run(
    model,
    tokenizer,
    *,
    lengths,
    corpus="sotu",
    protocol="truncate",
    stride=None,
    span=None,
    num_docs=4,
    add_bos=None,
    chunk_size=1024,
    join_docs=False,
    key_tokens=None,
    loss_by_position=False,
    seed=0,
    progress=True,
) -> list[dict]:
    lengths = check_lengths(lengths)
    check_choice("protocol", protocol, {"truncate", "sliding"})
    check_positive("num_docs", num_docs)
    check_positive("chunk_size", chunk_size)
    bos = special_prefix(tokenizer, add_bos)
    if lengths[0] < len(bos) + 2:
        raise TaskError(f"length {lengths[0]} is too short to score a token — use lengths >= {len(bos) + 2}")
    if protocol == "truncate" and (stride is not None or span is not None):
        raise TaskError("stride/span only apply to protocol='sliding' — drop them or set protocol='sliding'")
    if protocol == "sliding":
        if stride is not None:
            check_positive("stride", stride)
            # Each window's first text token needs context: a BOS before it, or an overlap of one token.
            if stride > lengths[0] - 1:
                raise TaskError(
                    f"stride {stride} would leave the first token of each window of {lengths[0]} "
                    f"unscored — use stride <= {lengths[0] - 1}"
                )
        span = check_positive("span", span) if span is not None else lengths[-1] - len(bos)
        if span < lengths[-1] - len(bos):
            raise TaskError(
                f"span {span} text tokens is shorter than the largest window {lengths[-1]} "
                f"(minus BOS) — use span >= {lengths[-1] - len(bos)}"
            )
    need = span if protocol == "sliding" else lengths[-1] - len(bos)  # text tokens per document
    first = max(1, len(bos))  # first scored position: the prefix is context only
    # LongPPL and loss by position ride on the same pass (tasks/key_tokens.py)
    extras = PassExtras.start(
        model,
        tokenizer,
        key_tokens,
        loss_by_position,
        protocol=protocol,
        lengths=lengths,
        prefix=bos,
        first=first,
        corpus=corpus,
        chunk_size=chunk_size,
    )

    encode = encoder(tokenizer)
    docs, skipped = take_long(
        seeded_order(list(iter_corpus(corpus)), seed), encode, need, num_docs, join=join_docs
    )
    if not docs:
        raise TaskError(
            f"no document in corpus {corpus!r} has {need} tokens ({skipped} shorter skipped) — "
            "use shorter lengths, another corpus, or join_docs=True to concatenate documents"
        )
    options = {
        "protocol": protocol,
        **prefix_options(tokenizer, bos, add_bos),
        "num_docs": num_docs,
        "docs_used": len(docs),
        "skipped_short": skipped,
        "join_docs": join_docs,
        "chunk_size": chunk_size,
    }
    if protocol == "sliding":
        options.update(stride=stride, span=span)
    if extras:
        options.update(extras.options())

    one_pass = protocol == "truncate" and not length_dependent(model)
    steps = len(docs) * (1 if one_pass else len(lengths))
    bar = tqdm(total=steps, desc=f"perplexity {protocol}", disable=not progress)
    row = functools.partial(record, "perplexity", corpus)
    records, totals = [], {L: [0.0, 0, 0.0] for L in lengths}  # sum nll, tokens, seconds
    tails = {L: [0.0, 0] for L in lengths[1:]}  # truncate: tokens between the previous length and L
    for doc, ids in docs:
        if one_pass:  # causal attention: the prefix of the longest window is every shorter window
            t0 = time.perf_counter()
            nll = token_nll(model, bos + ids[: lengths[-1] - len(bos)], start=first, chunk_size=chunk_size)
            per_length = {L: (nll[: L - first], (time.perf_counter() - t0)) for L in lengths}
            bar.update()
        else:
            per_length = {}
            for L in lengths:
                t0 = time.perf_counter()
                if protocol == "truncate":
                    nll = token_nll(model, bos + ids[: L - len(bos)], start=first, chunk_size=chunk_size)
                else:
                    nll = _sliding(
                        model, bos, ids[:span], L, stride or max(1, (L - len(bos)) // 2), chunk_size
                    )
                per_length[L] = (nll, time.perf_counter() - t0)
                bar.update()
        for previous, L in itertools.pairwise(lengths):
            if protocol == "truncate":  # nll[j] is the token at position first + j: these are previous..L-1
                tail = per_length[L][0][previous - first :]
                tail_sum, tail_n = tail.double().sum().item(), tail.numel()
                tails[L][0] += tail_sum
                tails[L][1] += tail_n
                if tail_n:  # per document too: the document bootstrap of results needs the unit's value
                    value = math.exp(tail_sum / tail_n)
                    records.append(row(L, "ppl_tail", value, tail_n, per_length[L][1], options, doc=doc.id))
        for L, (nll, secs) in per_length.items():
            loss, n = nll.double().mean().item(), nll.numel()
            totals[L][0] += nll.double().sum().item()
            totals[L][1] += n
            totals[L][2] += secs
            for metric, value in (("loss", loss), ("ppl", math.exp(loss))):
                records.append(row(L, metric, value, n, secs, options, doc=doc.id))
        if extras:
            records += extras.add(doc, ids[: lengths[-1] - len(bos)], per_length, options)
    bar.close()
    if extras:
        records += extras.finish(options)
    for L, (total, n, secs) in totals.items():
        loss = total / n  # token-weighted over documents
        for metric, value in (("loss", loss), ("ppl", math.exp(loss))):
            records.append(row(L, metric, value, n, secs, options))
        if L in tails and tails[L][1]:
            # Only the tokens past the previous length: what the longer context costs or gains, undiluted by
            # the window's start (plain RoPE breaks here once L passes the trained context).
            tail_loss = tails[L][0] / tails[L][1]
            records.append(row(L, "ppl_tail", math.exp(tail_loss), tails[L][1], secs, options))
    return records


def _sliding(model, bos, ids, length, stride, chunk_size):
    """NLL of every token of `ids` (the first one only when a BOS precedes it), windows of `length`."""
    import torch

    width = length - len(bos)  # text tokens per window
    starts = list(range(0, max(len(ids) - width, 0), stride)) + [max(len(ids) - width, 0)]
    parts, scored_to = [], 0 if bos else 1  # text index of the first token not yet scored
    for s in starts:
        window = bos + ids[s : s + width]
        # position p of the window holds text token s + p - len(bos); score text tokens >= scored_to
        first = max(scored_to - s + len(bos), 1)
        if first >= len(window):
            continue
        parts.append(token_nll(model, window, start=first, chunk_size=chunk_size))
        scored_to = s + width
    return torch.cat(parts)
