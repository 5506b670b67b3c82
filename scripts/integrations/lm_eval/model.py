"""The lm-eval model `ropebench` (`RopebenchLM`, an HFLM on a RoPE-patched model) and its model_args."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import warnings
from pathlib import Path

import lm_eval.models  # noqa: F401  (lm-eval's lazy model table first: our registration must not hide 'hf')
import torch
import torch.nn.functional as F
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import Collator
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from ropebench import extend
from ropebench.extend import (
    prefix_cache,  # looked up at call time: tests swap prefix_cache.PrefixCache for a spy
)
from ropebench.extend.errors import ExtendError
from ropebench.extend.forward import body, logit_postprocess, with_cache
from ropebench.extend.registry import COMMON_OPTIONS, check_factor, check_options
from ropebench.extend.registry import get as get_method
from ropebench.extend.values import as_length, parse_text
from ropebench.results.lm_eval_import import OWN_ARGS, hflm_args

log = logging.getLogger(__name__)

MODEL_NAME = "ropebench"
DEFAULT_PRETRAINED = "smollm2-135m"
# Positions per LM-head call when scoring (x vocab x 4 B of float32 log-probs: 128 MB for a 128k vocabulary).
SCORE_BLOCK = 256
# lm-eval releases whose HFLM internals the overrides below follow (Collator/get_cache/_batch_scheduler in
# _loglikelihood_tokens, softmax_dtype, mixed_precision_dtype, _model_generate) and whose CLI main() drives
# (lm_eval._cli, new in 0.4.10); verified on 0.4.13. pyproject.toml pins the same range (a test compares
# them): widen both once tests/lm_eval/test_lm_eval.py passes on a newer release.
LM_EVAL_RANGE = SpecifierSet(">=0.4.10,<0.4.14")
LM_EVAL_VERSION = Version(importlib.metadata.version("lm_eval"))


def overrides_apply() -> bool:
    """Whether the installed lm-eval is one whose HFLM internals the scoring/generation overrides follow."""
    return LM_EVAL_VERSION in LM_EVAL_RANGE


def parse_value(value, key: str = "value"):
    """A model_args value by ropebench's rules (`extend.values.parse_text`: 16k, 1e5, true, none, [1, 2], ...,
    the same as the sweep's -o and config files); `a;b;c` is the list [a, b, c] (model_args strings are split
    at commas, so `;` separates a list's items there). A value that is not a string is kept as it is."""
    where = f"model_args {key}"
    if isinstance(value, str) and ";" in value and value.strip()[:1] not in ("[", "{", "'", '"'):
        return [parse_text(v, where) for v in value.split(";") if v.strip()]
    return parse_text(value, where)


def raw_model_args(argv: list[str], split) -> dict[str, str]:
    """The `--model_args`/`-a` of an lm-eval command line as written (key -> text), so that ropebench's rules
    type them rather than lm-eval's (which reads -1 as -1.0, 0x10 as 16 and nan as a number). `split`:
    lm-eval's own splitting of `k=v,k2=v2` at top-level commas. A JSON object keeps JSON's types."""
    texts, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token in ("--model_args", "-a"):
            while i + 1 < len(argv) and not argv[i + 1].startswith("-"):  # nargs="+"
                texts.append(argv[i + 1])
                i += 1
        elif token.startswith("--model_args="):
            texts.append(token.split("=", 1)[1])
        i += 1
    out = {}
    for text in texts:
        if text.strip().startswith("{"):
            continue
        for item in split(text):
            key, sep, value = item.partition("=")
            if sep:
                out[key] = value
    return out


def typed_model_args(argv: list[str], given: dict | None) -> dict:
    """lm-eval's parsed model_args with each value written as `k=v` on the command line typed again from its
    text by ropebench's rules (`raw_model_args`). Text stays as written: `parse_value` reads it once where it
    is used (`'16k'` is the text 16k, not 16384 read twice)."""
    from lm_eval._cli.utils import split_top_level

    written = raw_model_args(argv, split_top_level)
    out = {}
    for key, value in (given or {}).items():
        if key in written:
            typed = parse_value(written[key], key)
            value = written[key] if isinstance(typed, str) else typed
        out[key] = value
    return out


def _max_length(value):
    """model_args max_length: unset, or a positive whole number of tokens (16384, 16k, 1e5)."""
    value = parse_value(value, "max_length")
    return None if value is None else as_length(value, "model_args max_length", "max_length=16384")


def split_model_args(method: str, args: dict) -> tuple[dict, dict]:
    """(method options, HFLM keyword arguments) from the remaining model_args, text typed by `parse_value`;
    unknown keys -> ExtendError."""
    spec = get_method(method)
    option_names = set(spec.options) | set(COMMON_OPTIONS)
    hflm = hflm_args()
    unknown = [key for key in args if key not in option_names and key not in hflm]
    if unknown:  # before parsing values: `short_factor=[1,1.2]` split at its comma is an unknown key `1.2]`
        odd = [k for k in unknown if not k.isidentifier()]
        hint = (
            " — a list value was split at its commas: write it as a;b;c (or pass model_args as a dict/JSON)"
            if odd
            else ""
        )
        valid = ", ".join(sorted(option_names)) or "none"
        raise ExtendError(
            f"unknown model_args {', '.join(map(repr, sorted(unknown)))} for method {method!r}"
            f"{hint} — method options: {valid}; loading: {', '.join(OWN_ARGS)}; or any HFLM "
            f"argument (batch_size, add_bos_token, ...)"
        )
    options = {k: parse_value(v, k) for k, v in args.items() if k in option_names}
    passthrough = {k: parse_value(v, k) for k, v in args.items() if k not in option_names}
    return options, passthrough


def check_model_args(args: dict) -> tuple[str, float, dict, dict]:
    """Validate ropebench model_args without loading a model: (method, factor, options, HFLM kwargs)."""
    rest = {k: v for k, v in args.items() if k not in OWN_ARGS}
    method = parse_value(args.get("method", "plain"), "method")
    if not isinstance(method, str) or not method:
        raise ExtendError(
            f"method must be a method name, got {method!r} — choose one of {', '.join(extend.methods())}"
        )
    spec = get_method(method)
    factor = check_factor(spec, parse_value(args.get("factor", 1.0), "factor"))
    options, passthrough = split_model_args(method, rest)
    check_options(spec, dict(options))
    _max_length(args.get("max_length"))
    _check_device_arg(args.get("device"))
    _check_batch_size(passthrough)
    pretrained = args.get("pretrained", DEFAULT_PRETRAINED)
    if isinstance(pretrained, (str, os.PathLike)):
        check_tokenizer_arg(args.get("tokenizer"))
        from ropebench.extend import preflight  # the model's config, not its weights: the sweep's checks

        trust = bool(parse_value(args.get("trust_remote_code", False)))
        preflight.check_on_config(preflight.config_of(str(pretrained), trust), method, factor, options)
    return method, factor, options, passthrough


def _check_device_arg(device) -> None:
    """model_args device: unset/auto, cpu, cuda, cuda:N or mps
    (a GPU that is absent falls back to cpu, as HFLM)."""
    text = "" if device is None else str(device).strip()
    if text in ("", "auto", "cpu", "cuda", "mps") or (text.startswith("cuda:") and text[5:].isdigit()):
        return
    raise ExtendError(
        f"model_args device={text!r} is not a device — use cpu, cuda, cuda:N or mps (or leave it out)"
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_tokenizer_arg(tokenizer) -> None:
    """model_args tokenizer= beside a pretrained name: a tokenizer folder or hub id (what lm-eval's hf takes,
    and what lm-eval's RULER tasks size their prompts with), or a tokenizer object. Checked without
    loading it."""
    if tokenizer is None or not isinstance(tokenizer, (str, os.PathLike)):
        return  # None: the tokenizer of pretrained; an object: HFLM checks its type
    text = str(tokenizer).strip()
    hint = f"e.g. tokenizer=$(ropebench lm-eval tokenizer {DEFAULT_PRETRAINED})"
    path = Path(text).expanduser()
    if text and path.is_dir():
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ExtendError(
                f"model_args tokenizer={text!r} is a folder without tokenizer files "
                f"({', '.join(TOKENIZER_FILES)}) — pass a folder saved with save_pretrained, {hint}"
            )
        return
    if path.exists() or not text or text.startswith((".", "/", "~")):
        raise ExtendError(
            f"model_args tokenizer={text!r} is not a tokenizer folder — pass a folder with tokenizer "
            f"files or a hub id owner/name ({hint})"
        )
    _check_tokenizer_cached_offline(text)


def _check_tokenizer_cached_offline(repo_id: str) -> None:
    """With HF_HUB_OFFLINE set a hub tokenizer must be in the local cache
    (online, the hub answers at load)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        return
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in TOKENIZER_FILES)
    except Exception:  # noqa: BLE001 - a malformed id: reported as not cached
        cached = False
    if not cached:
        raise ExtendError(
            f"model_args tokenizer={repo_id!r} is neither a local folder nor in the Hugging Face cache "
            f"and HF_HUB_OFFLINE is set — pass a tokenizer folder (e.g. tokenizer=$(ropebench "
            f"lm-eval tokenizer {DEFAULT_PRETRAINED})) or unset HF_HUB_OFFLINE"
        )


def tokenizer_source(pretrained=DEFAULT_PRETRAINED) -> str:
    """The tokenizer of `pretrained` as lm-eval names one (model_args/metadata `tokenizer=`, which lm-eval's
    RULER tasks size their prompts with): a hub id or folder as given; for an alias or a .gguf file, the
    folder of the snapshot `extend.load` caches (written on first use)."""
    from ropebench.extend.loading import check_model_spec, gguf_snapshot

    spec = check_model_spec(pretrained)
    if spec in extend.ALIASES or spec.endswith(".gguf"):
        return str(
            gguf_snapshot(extend.embedded_gguf(spec) if spec in extend.ALIASES else Path(spec).expanduser())
        )
    return spec


def _check_batch_size(passthrough: dict) -> None:
    """HFLM's batch_size: a positive integer, auto or auto:N."""
    if "batch_size" not in passthrough:
        return
    value = parse_value(passthrough["batch_size"])
    ok = (isinstance(value, int) and not isinstance(value, bool) and value > 0) or (
        isinstance(value, str) and (value == "auto" or (value.startswith("auto:") and value[5:].isdigit()))
    )
    if not ok:
        raise ExtendError(
            f"model_args batch_size={value!r} is not a batch size — use a positive integer, auto or "
            f"auto:N (e.g. batch_size=1)"
        )


@register_model(MODEL_NAME)
class RopebenchLM(HFLM):
    """lm-eval model ``ropebench``: HFLM on a model loaded by `extend.load` and patched by `extend.patch`.

    model_args: ``pretrained`` (hub id | directory | .gguf | alias, default smollm2-135m; or an already
    loaded model together with ``tokenizer=``), ``tokenizer`` (default: the one `extend.load` picks; a folder
    or hub id replaces it, as for lm-eval's ``hf``), ``method`` (default plain), ``factor`` (default 1), any
    method option (e.g. ``beta_fast=32``, ``short_factor=[...]``), ``max_length`` (default factor x trained
    context), ``device``/``dtype``/``attn_implementation``/``trust_remote_code`` (as `extend.load`),
    ``scored_logits_only`` (default True), ``share_prefix`` (default True: with batch_size 1 and a
    length-independent method, requests reuse the KV cache of the prefix they share with the previous request,
    `extend.prefix_cache`), and any HFLM argument (batch_size, add_bos_token, ...).
    The active patch is ``self.patch`` (``.undo()`` / ``close()`` restore the model)."""

    def __init__(
        self,
        pretrained=DEFAULT_PRETRAINED,
        method="plain",
        factor=1.0,
        max_length=None,
        device=None,
        dtype=None,
        attn_implementation=None,
        trust_remote_code=False,
        tokenizer=None,
        scored_logits_only=True,
        share_prefix=True,
        **kwargs,
    ):
        args = dict(
            kwargs,
            pretrained=pretrained,
            method=method,
            factor=factor,
            max_length=max_length,
            trust_remote_code=trust_remote_code,
            tokenizer=tokenizer,
        )
        method, factor, options, passthrough = check_model_args(args)
        if not overrides_apply():
            warnings.warn(
                f"lm-eval {LM_EVAL_VERSION} is outside {LM_EVAL_RANGE}, the range ropebench's scoring "
                f"follows: using stock HFLM loglikelihood and generation (whole-window logits, no prefix "
                f"sharing) — install 'lm-eval{LM_EVAL_RANGE}' for bounded-memory scoring",
                stacklevel=2,
            )
        max_length = _max_length(max_length)
        if isinstance(pretrained, (str, os.PathLike)):
            spec = str(pretrained)
            device = None if device in (None, "", "auto") else str(device)
            if device and device.startswith("cuda") and not torch.cuda.is_available():
                log.warning("device %r requested but no CUDA GPU is available: using cpu", device)  # as HFLM
                device = "cpu"
            model, tok = extend.load(
                spec,
                device=device,
                dtype=None if dtype in (None, "auto") else dtype,
                attn_implementation=attn_implementation,
                trust_remote_code=bool(parse_value(trust_remote_code)),
            )
            tok = tok if tokenizer is None else tokenizer  # as lm-eval's hf: HFLM loads a folder or hub id
        else:  # an already loaded model (e.g. one shared by several evaluations in one process)
            if tokenizer is None or isinstance(tokenizer, str):
                raise ExtendError("pass tokenizer=<tokenizer object> together with an already loaded model")
            model, tok = pretrained, tokenizer
            spec = getattr(pretrained, "name_or_path", type(pretrained).__name__)
        self.patch = extend.patch(model, method, factor, **options)
        self.trained_context = self.patch.options["trained_context"]  # the L of the patch's start_from policy
        if max_length is None:
            max_length = max(1, round(factor * self.trained_context))
        try:
            super().__init__(
                pretrained=model,
                tokenizer=tok,
                max_length=int(max_length),
                trust_remote_code=bool(parse_value(trust_remote_code)),
                **passthrough,
            )
        except Exception as e:
            self.patch.undo()
            # the only file HFLM reads here
            if isinstance(e, OSError) and isinstance(tok, (str, os.PathLike)):
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ExtendError(
                    f"could not load model_args tokenizer={str(tok)!r}: {first[:200]} — pass a folder "
                    f"with tokenizer files or a hub id (with network access)"
                ) from e
            raise
        self.pretrained = spec  # a string again: lm-eval's logs and results name the model by it
        self.method, self.factor, self.method_options = method, factor, options
        self.scored_logits_only = bool(parse_value(scored_logits_only))
        self.share_prefix = bool(parse_value(share_prefix))
        self._generation_cache = None

    def close(self) -> None:
        """Undo the RoPE patch (the model is restored exactly)."""
        self.patch.undo()

    def get_model_info(self) -> dict:
        info = {
            "model_num_parameters": sum(p.numel() for p in self._model.parameters()),
            "model_dtype": str(next(self._model.parameters()).dtype),
            "model_revision": self.revision,
            "model_sha": "",
        }
        if not (
            self.pretrained in extend.ALIASES
            or Path(self.pretrained).expanduser().exists()
            or self.pretrained.endswith(".gguf")
        ):
            info = super().get_model_info()  # a hub id: lm-eval looks its sha up (skipped when offline)
        info.update(
            {
                "ropebench_method": self.method,
                "ropebench_factor": self.factor,
                "ropebench_options": json.dumps(self.patch.options, sort_keys=True),  # + start_from, L, theta
                "ropebench_max_length": self.max_length,
                "ropebench_trained_context": self.trained_context,
            }
        )
        return info

    # --- loglikelihood: logits only for the scored positions, a block at a time -----------------------------

    def _shares_prefix(self) -> bool:
        """Requests reuse a cached prefix: one row per forward (batch_size 1), and one set of frequencies for
        every length (a dynamic method's cached keys would be rotated for another length)."""
        return (
            self.share_prefix
            and overrides_apply()
            and str(self.batch_size) == "1"
            and not extend.length_dependent(self.model)
        )

    def _scored(self, rows: list[list[int]], spans: list[tuple[int, int]], cache=None):
        """Per row of a right-padded batch (one row at a time when the method's frequencies depend on the
        sequence length): the log-probs of the continuation tokens but the last, whether greedy decoding
        predicts all of those, and the whole log-softmax row at the last scored position [a, b) (the one a
        cached one-token continuation needs). The decoder body runs once; the LM head and log-softmax see
        at most SCORE_BLOCK positions at once, so a 32k-token rolling window never holds 32k x vocab logits.
        With a `PrefixCache` (one row), the body runs only from what the row shares with the previous one."""
        model = self.model
        if extend.length_dependent(model) and len(rows) > 1:  # padding would change the frequencies
            return [self._scored([r], [s])[0] for r, s in zip(rows, spans)]
        width = max(map(len, rows))
        batch = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for i, r in enumerate(rows):
            batch[i, : len(r)] = torch.tensor(r, dtype=torch.long, device=self.device)
        head, postprocess = model.get_output_embeddings(), logit_postprocess(model)
        out = []
        with (
            torch.no_grad(),
            torch.autocast(
                device_type=self.device.type,
                dtype=self.mixed_precision_dtype,
                enabled=self.mixed_precision_dtype is not None,
            ),
        ):
            if cache is not None and len(rows) == 1:  # hidden states from the first scored position on
                part, offset = cache.prefill(rows[0], keep_at_most=spans[0][0])
                hidden = torch.zeros(1, width, part.shape[-1], dtype=part.dtype, device=part.device)
                hidden[0, offset:] = part
            else:
                hidden = body(model)(input_ids=batch, use_cache=False).last_hidden_state
            for i, (a, b) in enumerate(spans):
                picked, greedy, last = [], True, None
                for s in range(a, b, SCORE_BLOCK):
                    e = min(s + SCORE_BLOCK, b)
                    # the family's logits (post-processed in the model's dtype, as its forward does)
                    logp = F.log_softmax(postprocess(head(hidden[i, s:e])), dim=-1, dtype=self.softmax_dtype)
                    inner = min(e, b - 1) - s  # positions whose next token is in the row (all but the last)
                    if inner > 0:
                        target = batch[i, s + 1 : s + 1 + inner]
                        picked.append(logp[:inner].gather(1, target[:, None])[:, 0])
                        greedy = greedy and bool((logp[:inner].argmax(dim=-1) == target).all())
                    if e == b:
                        last = logp[-1]
                prefix = torch.cat(picked) if picked else last.new_empty(0)
                out.append((prefix, greedy, last))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        """Stock HFLM's loop (same ordering, left truncation to max_length, one-token-continuation cache,
        greedy flags, cache hook), but the model computes logits only where continuations are scored."""
        if self.backend != "causal" or not self.scored_logits_only or not overrides_apply():
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        from tqdm import tqdm

        share = self._shares_prefix()
        cache = prefix_cache.PrefixCache(self.model) if share else None

        def _collate(req):
            toks = req[1] + req[2]
            # sharing: token order, so requests with a common prefix (e.g. one context, several choices) are
            # neighbours; else stock's longest first
            return tuple(toks) if share else (-len(toks), tuple(toks))

        def _lookup_one_token_cont(req):
            return req[-2] + req[-1][:-1]

        re_ord = Collator(
            requests,
            sort_fn=_collate,
            group_by="contexts" if self.logits_cache else None,
            group_fn=_lookup_one_token_cont,
        )
        n = len(re_ord)
        batch_size = (
            self.batch_size if self.batch_size != "auto" else (override_bs if override_bs is not None else 0)
        )
        batch_fn = self._batch_scheduler if self.batch_size == "auto" and n > 0 and not override_bs else None
        if batch_fn is not None:
            self.batch_sizes = {}
        res = []
        pbar = tqdm(
            total=len(requests),
            disable=(disable_tqdm or (self.rank != 0)),
            desc="Running loglikelihood requests",
        )
        for chunk in re_ord.get_batched(n=batch_size, batch_fn=batch_fn):
            rows, spans = [], []
            for _, context_enc, continuation_enc in chunk:
                assert len(context_enc) > 0 and len(continuation_enc) > 0
                assert len(continuation_enc) <= self.max_length
                total = len(context_enc) + len(continuation_enc)
                if total > self.max_length + 1:
                    log.warning(
                        "Combined length of context (%d) and continuation (%d) exceeds max_length (%d). "
                        "Truncating %d tokens from the left.",
                        len(context_enc),
                        len(continuation_enc),
                        self.max_length,
                        total - self.max_length + 1,
                    )
                inp = (context_enc + continuation_enc)[-(self.max_length + 1) :][:-1]
                rows.append(inp)
                spans.append((len(inp) - len(continuation_enc), len(inp)))
            scored = self._scored(rows, spans, cache)
            for (request_str, ctx_tokens, cont_toks), (prefix, greedy, last) in zip(chunk, scored):
                # A cache group shares context + continuation[:-1]: only the last token differs between
                # members, so the last position's whole row ([1, 1, vocab]) is what get_cache hands around.
                for request_str, cont_toks, logits in re_ord.get_cache(  # noqa: B020  (as stock HFLM)
                    req_str=request_str, cxt_toks=ctx_tokens, cont_toks=cont_toks, logits=last.view(1, 1, -1)
                ):
                    row, token = logits[0, -1], cont_toks[-1]
                    # summed at once, in stock's dtype and order
                    logp = torch.cat([prefix, row[token : token + 1]])
                    answer = (float(logp.sum()), greedy and int(row.argmax()) == token)
                    res.append(answer)
                    if request_str is not None:
                        self.cache_hook.add_partial("loglikelihood", request_str, answer)
                    pbar.update(1)
        pbar.close()
        return re_ord.get_original(res)

    # --- generation: greedy continuations after a shared prefix ------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False):
        """Stock HFLM's generate_until; with prefix sharing, each prompt prefills only what it does not share
        with the previous one (stock orders prompts by length, then text)."""
        self._generation_cache = prefix_cache.PrefixCache(self.model) if self._shares_prefix() else None
        try:
            return super().generate_until(requests, disable_tqdm=disable_tqdm)
        finally:
            self._generation_cache = None

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        """Stock generation; a length-dependent (dynamic) method runs the whole call under
        `extend.fixed_length(model, max_length)` (prompt + new tokens, as the tasks do), so the cached steps
        keep the frequencies the prompt's keys were rotated with. With prefix sharing (never for those
        methods), the prompt prefills only what it does not share with the previous one."""
        if extend.length_dependent(self.model):
            with extend.fixed_length(self.model, int(max_length)):
                return super()._model_generate(context, max_length, stop, **generation_kwargs)
        cache, mask = self._generation_cache, generation_kwargs.get("attention_mask")
        if cache is None or context.shape[0] != 1 or (mask is not None and not bool(mask.all())):
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        past = cache.prime(context[0].tolist())
        with prefix_cache.native_gqa(self.model):
            out = super()._model_generate(
                context, max_length, stop, **with_cache(self.model, past), **generation_kwargs
            )
        cache.settle()  # back to the prompt: the next one may share it
        return out
