"""Write the data of ropebench's lm-eval tasks:
`python -m ropebench.tasks.lm_eval_export [--out DIR] [--...-lengths ...]`.

The task folder `tasks/lm_eval_tasks/` is lm-eval's own layout (docs/lm-eval.md): hand-written templates
(`_passkey_template_yaml`, `_sotu_era_template_yaml`, `_retrieval_template_yaml`) and `utils.py` (the
`!function` hooks that build each prompt with the tasks' own prompt builders); written here, deterministic and
committed for the default lengths, one YAML per task and length (`include:` the template, the name,
`metadata.length`) and the docs `passkey.jsonl`, `sotu_era.jsonl` and `retrieval.jsonl`.

The lengths are parameters because the docs are sized for them, counted with the SmolLM2 tokenizer (other
tokenizers differ by a few percent); a retrieval prompt leaves room for the greedy answer (RULER's rule).
Pass keys, needles, depths and the query choice are the tasks' (seeded the same way). With `--out DIR` the
templates and utils.py are copied there too, so DIR works by itself with `--include_path`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import shutil
import sys
from pathlib import Path

import yaml

from . import classification, passkey, retrieval, scenes
from .common import encoder, special_prefix
from .errors import TaskError
from .kit import largest_fitting
from .lm_eval_tasks import utils

OUT_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"  # the folder itself, not an editable link
STATIC_FILES = ("_passkey_template_yaml", "_sotu_era_template_yaml", "_retrieval_template_yaml", "utils.py")
TEMPLATES = {  # lm-eval task family -> its template; the YAMLs write the family as metadata.suite (kept)
    "passkey": "_passkey_template_yaml",
    "sotu_era": "_sotu_era_template_yaml",
    "retrieval": "_retrieval_template_yaml",
}
PASSKEY_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
PASSKEY_TRIALS = 2
CLASSIFICATION_LENGTHS = (1024, 2048, 4096, 8192)  # sotu has too few speeches >= 16k tokens per era
CLASSIFICATION_DOCS = 24
RETRIEVAL_LENGTHS = (4096, 8192, 16384, 32768)  # RULER's from 4k on
RETRIEVAL_DEPTHS = (0.0, 0.5, 1.0)  # the retrieval task's defaults
RETRIEVAL_TRIALS = 2
RETRIEVAL_CANDIDATES = 9  # the retrieval task's default: it changes which distractor depths a scene draws
DEFAULT_NEW_TOKENS = 128  # tasks.retrieval's greedy budget for the variants not in its NEW_TOKENS (RULER's)
VERSION = 1.0
HEADER = "# Written by `python -m ropebench.tasks.lm_eval_export` — do not edit; export again instead.\n"


def length_name(length: int) -> str:
    return f"{length // 1024}k" if length % 1024 == 0 else str(length)


def default_tokenizer():
    """The SmolLM2 tokenizer, from extend.load's cached snapshot of the embedded GGUF."""
    from ropebench import extend
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(extend.loading.gguf_snapshot(extend.embedded_gguf()))


def passkey_docs(tokenizer, lengths, depths, trials, seed: int = 0) -> list[dict]:
    """One doc per (trial, length, depth) with the passkey task's own pass keys and haystack sizes."""
    docs = []
    for trial in range(trials):
        for length in lengths:
            sentences = passkey.haystack_sentences(None, None, words=2 * length)
            for di, depth in enumerate(depths):
                key = passkey.key_for(seed, length, di, trial)
                doc = {
                    "id": f"passkey-{length}-{di}-{trial}",
                    "length": length,
                    "depth": float(depth),
                    "trial": trial,
                    "key": str(key),
                    "haystack_words": passkey.fit_haystack_words(tokenizer, length, depth, key, sentences),
                }
                doc["prompt_tokens"] = len(tokenizer(utils.passkey_prompt(doc))["input_ids"])
                docs.append(doc)
    return docs


def era_docs(tokenizer, lengths, num_docs: int, seed: int = 0) -> list[dict]:
    """Per length, the classification task's zero-shot queries (its default split) with their excerpts filling
    the length."""
    task = utils.ERA
    labelled = classification.labelled_documents("sotu", task)
    classes = sorted({y for _, y in labelled})
    _, queries = classification.grouped_split(labelled, 0.5, seed)
    encode = functools.lru_cache(maxsize=None)(encoder(tokenizer))
    frame = (
        len(special_prefix(tokenizer))
        + len(encode(task.header))
        + len(encode(task.zero_shot_suffix(classes)))
    )
    docs = []
    for length in lengths:
        room = length - frame
        chosen, _ = classification.pick_queries(queries, encode, room, num_docs, seed)
        if not chosen:
            raise TaskError(f"no sotu speech has {room} tokens for length {length} — use shorter lengths")
        for i, (speech, label, _) in enumerate(chosen):
            enc = tokenizer(speech.text, add_special_tokens=False, return_offsets_mapping=True)
            chars = enc["offset_mapping"][room - 1][1]  # the end of the excerpt's last token
            doc = {
                "id": f"sotu-era-{length}-{i}",
                "length": length,
                "fileid": speech.id,
                "chars": chars,
                "sha1": hashlib.sha1(speech.text[:chars].encode()).hexdigest()[:16],
                "label": label,
                "gold": classes.index(label),
                "choices": classes,
            }
            doc["prompt_tokens"] = len(tokenizer(utils.era_prompt(speech.text, doc))["input_ids"])
            docs.append(doc)
    return docs


def retrieval_docs(
    tokenizer, lengths, depths, trials, variants=retrieval.VARIANTS, seed: int = 0
) -> list[dict]:
    """One doc per (variant, trial, length, depth): the retrieval task's scene, its haystack cut to fill the
    length less the variant's greedy answer (what `retrieval.run` fits with scoring "generate", haystack
    "filler" and length_rule "fill")."""
    encode = encoder(tokenizer)
    prefix = special_prefix(tokenizer)
    docs = []
    for variant in variants:
        for trial in range(trials):
            scene = utils.retrieval_scene(variant, trial, seed, RETRIEVAL_CANDIDATES)
            new_tokens = retrieval_new_tokens(variant)
            for length in lengths:
                for di, depth in enumerate(depths):
                    doc = {
                        "id": f"retrieval-{variant}-{length}-{di}-{trial}",
                        "variant": variant,
                        "length": length,
                        "depth": float(depth),
                        "trial": trial,
                        "seed": seed,
                        "candidates": RETRIEVAL_CANDIDATES,
                        "answers": list(scene.answers),
                        "max_gen_toks": new_tokens,
                    }

                    def n_tokens(words: int, doc=doc) -> int:
                        return len(prefix) + len(
                            encode(utils.retrieval_prompt(dict(doc, haystack_words=words)))
                        )

                    doc["haystack_words"] = largest_fitting(n_tokens, 2 * length, length - new_tokens)
                    if doc["haystack_words"] < 0:
                        raise TaskError(
                            f"retrieval length {length} is too short for the {variant} prompt — "
                            "export longer lengths"
                        )
                    doc["prompt_tokens"] = n_tokens(doc["haystack_words"])
                    docs.append(doc)
    return docs


def retrieval_new_tokens(variant: str) -> int:
    """The greedy answer's budget of a variant (the retrieval task's default max_new_tokens: RULER's
    tokens_to_generate)."""
    return scenes.NEW_TOKENS.get(variant, DEFAULT_NEW_TOKENS)


def retrieval_task_name(variant: str, length: int) -> str:
    return f"ropebench_retrieval_{variant}_{length_name(length)}"


def retrieval_task_yaml(variant: str, length: int) -> str:
    """The YAML of one lm-eval retrieval task: the template, its name, the variant's generation budget
    and metadata."""
    config = {
        "include": TEMPLATES["retrieval"],
        "task": retrieval_task_name(variant, length),
        "generation_kwargs": {"until": [], "max_gen_toks": retrieval_new_tokens(variant), "do_sample": False},
        "metadata": {"version": VERSION, "suite": "retrieval", "variant": variant, "length": length},
    }
    return HEADER + yaml.safe_dump(config, sort_keys=False)


def task_yaml(template: str, length: int) -> str:
    """The YAML of one lm-eval task: its template (a key of TEMPLATES), its name and its length."""
    config = {
        "include": TEMPLATES[template],
        "task": f"ropebench_{template}_{length_name(length)}",
        "metadata": {"version": VERSION, "suite": template, "length": length},
    }
    return HEADER + yaml.safe_dump(config, sort_keys=False)


def _jsonl(rows) -> str:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)


def render(
    tokenizer=None,
    *,
    passkey_lengths=PASSKEY_LENGTHS,
    depths=PASSKEY_DEPTHS,
    trials=PASSKEY_TRIALS,
    classification_lengths=CLASSIFICATION_LENGTHS,
    num_docs=CLASSIFICATION_DOCS,
    retrieval_lengths=RETRIEVAL_LENGTHS,
    retrieval_depths=RETRIEVAL_DEPTHS,
    retrieval_trials=RETRIEVAL_TRIALS,
    retrieval_variants=retrieval.VARIANTS,
    seed=0,
) -> dict[str, str]:
    """File name -> content of the written (not hand-written) files of the task folder."""
    tokenizer = tokenizer or default_tokenizer()
    passkey_lengths = sorted(set(passkey_lengths))
    classification_lengths = sorted(set(classification_lengths))
    retrieval_lengths = sorted(set(retrieval_lengths))
    files = {
        "passkey.jsonl": _jsonl(passkey_docs(tokenizer, passkey_lengths, depths, trials, seed)),
        "sotu_era.jsonl": _jsonl(era_docs(tokenizer, classification_lengths, num_docs, seed)),
        "retrieval.jsonl": _jsonl(
            retrieval_docs(
                tokenizer, retrieval_lengths, retrieval_depths, retrieval_trials, retrieval_variants, seed
            )
        ),
    }
    for template, lengths in (("passkey", passkey_lengths), ("sotu_era", classification_lengths)):
        files.update({f"ropebench_{template}_{length_name(n)}.yaml": task_yaml(template, n) for n in lengths})
    for v in retrieval_variants:
        files.update(
            {f"{retrieval_task_name(v, n)}.yaml": retrieval_task_yaml(v, n) for n in retrieval_lengths}
        )
    return files


def export(out_dir=OUT_DIR, tokenizer=None, **options) -> Path:
    """Write the task folder (the tasks of other lengths ropebench wrote in it are removed); returns its path.

    Another folder than the package's own goes through the guard of every writer (extend/owned_paths.py): a
    new or empty folder or one an earlier export made, never over or removing a file of the user's."""
    from ropebench.extend.owned_paths import OwnedDir

    out = Path(out_dir)
    package = out.resolve() == OUT_DIR.resolve()
    owned = None if package else OwnedDir.open(out, "lm-eval task folder", error=TaskError)
    files = render(tokenizer, **options)
    if owned is not None:
        with owned.staged() as stage:
            for name, text in files.items():
                (stage / name).write_text(text, encoding="utf-8")
            for name in STATIC_FILES:
                shutil.copyfile(OUT_DIR / name, stage / name)
        stale = [rel for rel in owned.files if rel.startswith("ropebench_") and rel.endswith(".yaml")]
        owned.remove_listed(only=[rel for rel in stale if rel not in files])
        return out
    out.mkdir(parents=True, exist_ok=True)  # the package's own task folder (shipped with ropebench)
    for old in out.glob("ropebench_*.yaml"):
        if old.name not in files:
            old.unlink()
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ropebench.tasks.lm_eval_export", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default=str(OUT_DIR), help="output folder (default: %(default)s)")
    p.add_argument("--passkey-lengths", type=int, nargs="+", default=list(PASSKEY_LENGTHS))
    p.add_argument("--classification-lengths", type=int, nargs="+", default=list(CLASSIFICATION_LENGTHS))
    p.add_argument("--num-docs", type=int, default=CLASSIFICATION_DOCS)
    p.add_argument("--retrieval-lengths", type=int, nargs="+", default=list(RETRIEVAL_LENGTHS))
    args = p.parse_args(argv)
    try:
        out = export(
            args.out,
            passkey_lengths=args.passkey_lengths,
            classification_lengths=args.classification_lengths,
            num_docs=args.num_docs,
            retrieval_lengths=args.retrieval_lengths,
        )
    except TaskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
