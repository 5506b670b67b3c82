"""tasks.classification: grouped splits, label scoring, prompt packing, metrics."""

import json

import pytest
import torch
from ropebench.tasks import TaskError, classification
from ropebench.tasks.classification import LABEL_TASKS, grouped_split, macro_f1, pack_demos
from ropebench.tasks.data import load_corpus
from ropebench.tasks.scoring import continuation_logprobs


@pytest.mark.parametrize("label", ["era", "party"])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_no_president_on_both_sides_of_the_split(label, seed):
    task = LABEL_TASKS[label]
    labelled = [(d, task.label(d)) for d in load_corpus("sotu")]
    labelled = [(d, y) for d, y in labelled if y is not None]
    demos, queries = grouped_split(labelled, 0.5, seed)
    assert demos and queries and len(demos) + len(queries) == len(labelled)
    assert not {d.meta["president"] for d, _ in demos} & {d.meta["president"] for d, _ in queries}
    if label == "party":
        assert {y for _, y in labelled} == {"Democratic", "Republican"}
        assert min(d.meta["year"] for d, _ in labelled) >= 1861
    else:
        assert {y for _, y in labelled} == {"1790-1860", "1861-1913", "1914-1960", "1961-present"}


def test_label_log_likelihood_matches_full_forward(tiny_model):
    prefix = torch.randint(0, tiny_model.config.vocab_size, (40,)).tolist()
    conts = [[5], [7, 9, 11], [13, 2]]
    got = continuation_logprobs(tiny_model, prefix, conts)
    for cont, lp in zip(conts, got):
        ids = torch.tensor([prefix + cont])
        with torch.no_grad():
            logp = torch.log_softmax(tiny_model(ids).logits[0].float(), -1)
        want = torch.stack([logp[len(prefix) - 1 + i, t] for i, t in enumerate(cont)])
        assert torch.allclose(lp, want, atol=1e-5)


def test_decision_by_sum_and_by_mean(tiny_model, tok, monkeypatch, tmp_path):
    rows = [{"text": "word " * 300, "label": y, "group": f"g{i}"} for i, y in enumerate(["aa", "b"] * 4)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # a toy scorer: label "aa" has two tokens of -1 (sum -2, mean -1); "b" one token of -1.5
    fake = {("aa",): [-1.0, -1.0], ("b",): [-1.5]}
    monkeypatch.setattr(
        classification,
        "continuation_logprobs",
        lambda m, p, conts, **kw: [torch.tensor(fake[(tok.decode(c).strip(),)][: len(c)] * 1) for c in conts],
    )
    assert [
        len(tok.encode(" aa", add_special_tokens=False)),
        len(tok.encode(" b", add_special_tokens=False)),
    ] == [2, 1]
    recs = classification.run(
        tiny_model, tok, lengths=[128], corpus=str(tmp_path / "d.jsonl"), num_docs=4, progress=False
    )
    got = {r["metric"]: r["value"] for r in recs if r["doc"] is None}
    per_query = [r for r in recs if r["doc"] is not None]
    # one 0/1 accuracy row per query, summing to the aggregate
    assert len(per_query) == 4 and {r["metric"] for r in per_query} == {"accuracy"}
    assert sum(r["value"] for r in per_query) / 4 == got["accuracy"]
    # by sum "b" (-1.5 > -2) always wins; by mean "aa" (-1 > -1.5) always wins: the two accuracies are the
    # shares of "b" and "aa" among the queries
    assert got["accuracy"] + got["accuracy_norm"] == 1.0
    assert got["chance"] == max(got["accuracy"], got["accuracy_norm"])
    assert {r["n"] for r in recs if r["doc"] is None} == {4}  # half of the 8 groups are demonstrations


def test_zero_shot_prompts_are_exactly_L_and_short_documents_skipped(tiny_model, tok, monkeypatch):
    lengths = []
    monkeypatch.setattr(
        classification,
        "continuation_logprobs",
        lambda m, p, conts, **kw: lengths.append(len(p)) or [torch.zeros(len(c)) for c in conts],
    )
    recs = classification.run(tiny_model, tok, lengths=[512, 4096], num_docs=30, progress=False)
    assert set(lengths) == {512, 4096}
    skipped = {r["length"]: r["task_options"]["skipped_short"] for r in recs}
    n = {r["length"]: r["n"] for r in recs if r["doc"] is None}
    assert skipped[512] == 0 and n[512] == 30
    assert skipped[4096] > 0
    assert {r["metric"] for r in recs} == {"accuracy", "macro_f1", "accuracy_norm", "macro_f1_norm", "chance"}


def test_many_shot_packs_demonstrations_to_exactly_L(tiny_model, tok, monkeypatch):
    prompts = []
    monkeypatch.setattr(
        classification,
        "continuation_logprobs",
        lambda m, p, conts, **kw: prompts.append(p) or [torch.zeros(len(c)) for c in conts],
    )
    recs = classification.run(
        tiny_model, tok, lengths=[1024, 3000], mode="many-shot", label="party", num_docs=3, progress=False
    )
    assert sorted({len(p) for p in prompts}) == [1024, 3000]
    text = tok.decode(prompts[-1])
    assert text.count("\nParty: Democratic\n") >= 2 and text.count("\nParty: Republican\n") >= 2
    assert text.endswith("\nParty:")
    # demos_per_prompt is the mean number of labelled demonstrations in that length's prompts
    labelled = {}
    for p in prompts:
        prompt = tok.decode(p)
        demos = prompt.count("\nParty: Democratic\n") + prompt.count("\nParty: Republican\n")
        labelled.setdefault(len(p), []).append(demos)
    recorded = {r["length"]: r["task_options"]["demos_per_prompt"] for r in recs}
    assert recorded == {L: round(sum(c) / len(c), 1) for L, c in labelled.items()} == {1024: 3.0, 3000: 11.0}
    assert {r["task_options"]["mode"] for r in recs} == {"many-shot"}


def test_pack_demos_keeps_labels():
    pool = [([1] * 10, "x"), ([2] * 10, "y"), ([3] * 10, "x")]

    def enc(s):
        return [9] * len(s)

    ctx, n = pack_demos(pool, [0], "L", enc, 30)
    assert len(ctx) == 30 and n == 2 and ctx[-1] == 9 and ctx[0] == 1 and 0 in ctx  # 2 x 18 tokens, first cut


def test_macro_f1():
    assert macro_f1(["a", "a", "b", "b"], ["a", "a", "b", "b"]) == 1.0
    assert macro_f1(["a", "a", "b", "b"], ["a", "a", "a", "a"]) == pytest.approx(
        (2 * 2 / (2 * 2 + 2) + 0) / 2
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"lengths": [512], "label": "color"}, "must be one of era, party, label"),
        ({"lengths": [512], "mode": "few"}, "mode"),
        ({"lengths": [0]}, "positive"),
        ({"lengths": [20]}, "no room"),
        ({"lengths": [512], "corpus": "nope"}, "unknown corpus"),
        ({"lengths": [4096], "corpus": "short"}, "no query document"),
    ],
)
def test_bad_parameters(tiny_model, tok, kw, match, tmp_path):
    rows = [{"text": "a short text", "label": y, "group": str(i)} for i, y in enumerate("xyxy")]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if kw.get("corpus") == "short":
        kw = {**kw, "corpus": str(tmp_path / "s.jsonl"), "label": "label"}
    with pytest.raises(TaskError, match=match):
        classification.run(tiny_model, tok, progress=False, **kw)


def _scores(monkeypatch):
    """Record every prompt's label scores."""
    seen = {}
    real = classification.continuation_logprobs

    def spy(m, p, conts, **kw):
        seen[tuple(p)] = out = real(m, p, conts, **kw)
        return out

    monkeypatch.setattr(classification, "continuation_logprobs", spy)
    return seen


def _same(a: dict, b: dict) -> float:
    """The largest score difference between two runs over the same prompts."""
    assert a.keys() == b.keys()
    return max(abs(x - y).max().item() for p in a for x, y in zip(a[p], b[p]))


@pytest.mark.parametrize("mode", ["many-shot", "zero-shot"])
def test_shared_prefix_same_predictions_and_scores(tiny_model, tok, monkeypatch, mode):
    kw = {"lengths": [600, 1000], "mode": mode, "num_docs": 5, "progress": False}
    seen = _scores(monkeypatch)
    shared = classification.run(tiny_model, tok, **kw)
    first = dict(seen)
    seen.clear()
    unshared = classification.run(tiny_model, tok, share_prefix=False, **kw)
    assert _same(first, seen) <= 1e-4

    def strip(rs):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rs]

    assert strip(shared) == strip(unshared)


def test_shared_prefix_under_a_dynamic_method(tok, monkeypatch, tiny_llama_factory):
    """dynamic-ntk past the trained context: every forward of a cell uses the cell's frequencies
    (extend.fixed_length), so prompts continuing a cached prefix score as the unshared path does."""
    from ropebench import extend

    model = tiny_llama_factory(max_position_embeddings=256, vocab_size=len(tok))
    kw = {"lengths": [600], "mode": "many-shot", "num_docs": 4, "excerpt_tokens": 64, "progress": False}
    seen = _scores(monkeypatch)
    with extend.patched(model, "dynamic-ntk", factor=4):
        assert extend.length_dependent(model)
        classification.run(model, tok, **kw)
        first = dict(seen)
        seen.clear()
        classification.run(model, tok, share_prefix=False, **kw)
    assert _same(first, seen) <= 1e-4


@pytest.mark.real
def test_many_shot_shared_prefix_on_smollm2(smollm2, monkeypatch):
    """Real model, float32: many-shot scores with the demonstrations computed once equal the unshared ones
    (within 1e-4), so the predictions are the same; the queries after the first run only their own tokens."""
    from ropebench.extend import prefix_cache
    from ropebench.tasks import kit  # run_cells makes every task's caches

    model, tok = smollm2
    caches = []
    real_cache = prefix_cache.PrefixCache
    monkeypatch.setattr(kit, "PrefixCache", lambda *a, **k: caches.append(real_cache(*a, **k)) or caches[-1])
    seen = _scores(monkeypatch)
    kw = {"lengths": [384], "mode": "many-shot", "num_docs": 3, "excerpt_tokens": 48, "progress": False}
    shared = classification.run(model, tok, **kw)
    first = dict(seen)
    seen.clear()
    unshared = classification.run(model, tok, share_prefix=False, **kw)
    assert _same(first, seen) <= 1e-4
    assert [r["value"] for r in shared] == [r["value"] for r in unshared]
    sharing, plain = caches
    assert plain.reused == 0 and sharing.computed < 0.5 * plain.computed
