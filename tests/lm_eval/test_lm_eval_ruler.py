"""lm-eval's own RULER tasks through the `ropebench` model, as lm-eval's RULER instructions run them: a
tokenizer named in model_args (or found for an alias by the CLI shim), the `ruler` extra, and the generation
path giving the answers stock `hf` gives. Offline: niah_single_1's haystack is built in (no hub dataset, no
nltk punkt_tab)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(
    os.environ,
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    OMP_NUM_THREADS="1",
    TOKENIZERS_PARALLELISM="false",
    PYTHONPATH=str(ROOT),
)
RULER_EXTRA = "lm-eval's RULER tasks need the ruler extra (pip install -e '.[ruler]': wonderwords, nltk)"
NIAH_LENGTH, NIAH_SAMPLES = 1024, 3  # RULER generates its 500 samples at this length in each of the two runs


def run(module: str, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def word_tokenizer(words: list[str]):
    """A word-level tokenizer over `words` (id = position), built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    table.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=table, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


@pytest.fixture(scope="module")
def model_and_other_tokenizer(tmp_path_factory, tiny_llama_factory):
    """A saved tiny Llama with its own tokenizer, and a folder with another tokenizer (same words, reversed
    ids)."""
    words = ["<unk>", "<s>", "</s>", "yes", "no", "maybe"]
    model_dir, other_dir = tmp_path_factory.mktemp("model"), tmp_path_factory.mktemp("other_tokenizer")
    tiny_llama_factory(
        max_position_embeddings=64, vocab_size=len(words), bos_token_id=1, eos_token_id=2
    ).save_pretrained(model_dir)
    word_tokenizer(words).save_pretrained(model_dir)
    word_tokenizer(words[:3] + words[:2:-1]).save_pretrained(other_dir)
    return model_dir, other_dir


def test_ruler_extra_covers_lm_evals_own():
    """pyproject's `ruler` extra names every package lm-eval's own `ruler` extra does (read from the installed
    lm-eval's metadata), with nltk at least the version lm-eval's prepare_niah.py asserts."""
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    ours = {
        Requirement(r).name: Requirement(r)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
            "optional-dependencies"
        ]["ruler"]
    }
    theirs = [Requirement(r) for r in importlib.metadata.requires("lm_eval") or []]
    theirs = {r.name for r in theirs if r.marker is not None and r.marker.evaluate({"extra": "ruler"})}
    assert theirs and theirs <= set(ours), (theirs, ours)
    assert not ours["nltk"].specifier.contains(Version("3.9.0")) and ours["nltk"].specifier.contains(
        Version("3.9.1")
    )


# --- tokenizer= beside a named model (the wall: "only for an already loaded model") ------------------------


def test_tokenizer_folder_replaces_the_models_own_as_in_hf(model_and_other_tokenizer):
    """tokenizer=<folder> with pretrained=<name> is what lm-eval's hf does: HFLM loads that tokenizer."""
    from ropebench.integrations.lm_eval import RopebenchLM

    model_dir, other_dir = model_and_other_tokenizer
    own = RopebenchLM(pretrained=str(model_dir), device="cpu", dtype="float32")
    other = RopebenchLM(pretrained=str(model_dir), tokenizer=str(other_dir), device="cpu", dtype="float32")
    assert own.tok_encode("yes maybe") == [3, 5]  # the model folder's ids
    assert other.tok_encode("yes maybe") == [5, 3]  # the named folder's ids
    assert other.tokenizer.name_or_path == str(other_dir)
    own.close(), other.close()


@pytest.mark.parametrize(
    "value, message",
    [
        ("/nonexistent/tokenizer", "is not a tokenizer folder"),
        ("", "is not a tokenizer folder"),
        ("nobody/no-such-tokenizer", "neither a local folder nor in the Hugging Face cache"),
    ],
)
def test_bad_tokenizer_arg_is_one_error_before_loading(value, message):
    from ropebench.extend import ExtendError
    from ropebench.integrations.lm_eval import RopebenchLM, check_model_args

    with pytest.raises(ExtendError, match=message):
        check_model_args({"pretrained": "smollm2-135m", "tokenizer": value})
    with pytest.raises(ExtendError, match=message):  # the class checks before extend.load
        RopebenchLM(pretrained="smollm2-135m", tokenizer=value)


def test_tokenizer_arg_that_is_a_file_or_an_empty_folder(tmp_path):
    from ropebench.extend import ExtendError
    from ropebench.integrations.lm_eval import check_model_args

    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ExtendError, match="is not a tokenizer folder"):
        check_model_args({"pretrained": "smollm2-135m", "tokenizer": str(tmp_path / "file.txt")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExtendError, match="a folder without tokenizer files"):
        check_model_args({"pretrained": "smollm2-135m", "tokenizer": str(tmp_path / "empty")})


def test_cli_bad_tokenizer_one_line_exit_2():
    out = run(
        "ropebench.integrations.lm_eval",
        "run",
        "--model",
        "ropebench",
        "--model_args",
        "pretrained=smollm2-135m,tokenizer=/nonexistent/tok",
        "--tasks",
        "niah_single_1",
    )
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "tokenizer" in lines[0], out.stderr[-2000:]


# --- a tokenizer folder for the alias / a GGUF ------------------------------------------------------------


@pytest.mark.real
def test_tokenizer_command_prints_the_folder_extend_load_reads(smollm2):
    """`python -m ropebench.integrations.lm_eval tokenizer` names a folder AutoTokenizer loads (what
    RULER's tasks do with it), encoding as the tokenizer extend.load gives the embedded model."""
    from transformers import AutoTokenizer

    out = run("ropebench.integrations.lm_eval", "tokenizer", "smollm2-135m", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    folder = out.stdout.strip().splitlines()[-1]
    text = "One of the special magic numbers for rapid-hat is: 1234567."
    assert AutoTokenizer.from_pretrained(folder)(text)["input_ids"] == smollm2[1](text)["input_ids"]


@pytest.mark.real
def test_cli_gives_tasks_a_tokenizer_for_an_alias():
    """lm-eval hands model_args to tasks as metadata, and RULER loads `tokenizer` (else `pretrained`) with
    AutoTokenizer, which cannot read `smollm2-135m`: the shim adds the snapshot's folder, and only then."""
    from ropebench.integrations.lm_eval.cli import with_task_tokenizer
    from ropebench.integrations.lm_eval.model import tokenizer_source

    folder = tokenizer_source("smollm2-135m")
    assert (Path(folder) / "tokenizer.json").is_file()
    assert with_task_tokenizer({"pretrained": "smollm2-135m"}, None) == {"tokenizer": folder}
    assert with_task_tokenizer({}, {"max_seq_lengths": [1024]}) == {
        "max_seq_lengths": [1024],
        "tokenizer": folder,
    }
    assert (
        with_task_tokenizer({"pretrained": "smollm2-135m", "tokenizer": "x/y"}, None) is None
    )  # the user's wins
    assert with_task_tokenizer({"pretrained": "smollm2-135m"}, {"tokenizer": "x/y"}) == {"tokenizer": "x/y"}
    assert (
        with_task_tokenizer({"pretrained": "owner/name"}, None) is None
    )  # AutoTokenizer reads hub ids itself


@pytest.mark.real
def test_cli_run_hands_the_tasks_that_tokenizer(monkeypatch):
    """The shim's `run` passes the added tokenizer on to lm-eval (whose run merges metadata into every
    task's)."""
    from lm_eval._cli import HarnessCLI
    from ropebench.integrations.lm_eval import main, tokenizer_source

    seen = {}
    monkeypatch.setattr(HarnessCLI, "execute", lambda self, args: seen.update(vars(args)))
    assert (
        main(
            [
                "run",
                "--model",
                "ropebench",
                "--model_args",
                "pretrained=smollm2-135m",
                "--tasks",
                "niah_single_1",
                "--metadata",
                '{"max_seq_lengths": [1024]}',
            ]
        )
        == 0
    )
    assert seen["metadata"] == {"max_seq_lengths": [1024], "tokenizer": tokenizer_source("smollm2-135m")}


# --- the generation path: ropebench plain gives stock hf's answers ----------------------------------------

# Both runs in one process (the test's cost is lm-eval's, twice: its module of RULER needles builds a list of
# 6.2M adjective-noun keys at import, ~16 s, and its task index parses every task YAML it ships, ~12 s).
# First lm-eval's own `hf` model through its Python API, with the arguments its CLI passes (metadata =
# model_args | --metadata, the default seeds) and its RULER folder alone as the task index, before anything
# of ropebench is imported; then the `ropebench` model through the shim's CLI, as a user runs it (lm-eval's
# whole index, tokenizer= in model_args).
BOTH_RUNS = """
import json, sys
from pathlib import Path

import lm_eval
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

folder, out, ours_argv = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
common = json.loads(sys.argv[4])
metadata = {"pretrained": folder, "dtype": "float32", **common["metadata"]}
ruler = Path(lm_eval.__file__).parent / "tasks" / "ruler"
stock = simple_evaluate(
    model="hf",
    model_args=f"pretrained={folder},dtype=float32",
    tasks=[common["task"]],
    task_manager=TaskManager(include_path=str(ruler), include_defaults=False, metadata=metadata),
    limit=common["limit"],
    device="cpu",
    batch_size=1,
    log_samples=True,
    metadata=metadata,
)
answers = {r["doc_id"]: [r["resps"][0][0], r["doc"]["outputs"]] for r in stock["samples"][common["task"]]}
(out / "stock.json").write_text(json.dumps(answers))

from ropebench.integrations.lm_eval import main

sys.exit(main(ours_argv))
"""


def _niah_samples(out_dir: Path) -> dict[int, tuple[str, list[str]]]:
    """doc_id -> (the generated answer, the needle's value) from lm-eval's --log_samples file."""
    (path,) = out_dir.rglob("samples_niah_single_1_*.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["doc_id"]: (r["resps"][0][0], r["doc"]["outputs"]) for r in rows}


@pytest.mark.real
@pytest.mark.slow
def test_ruler_niah_single_1_plain_answers_as_stock_hf(tmp_path, smollm2):
    """lm-eval 0.4.13's own niah_single_1 (RULER's string match), a few samples at 1024 tokens, run by the
    instructions of its README (tokenizer=<path> in model_args, max_seq_lengths in metadata): the ropebench
    model with method plain generates exactly what lm-eval's `hf` model generates on the same weights (the
    GGUF's snapshot), on the same samples."""
    pytest.importorskip("wonderwords", reason=RULER_EXTRA)
    pytest.importorskip("nltk", reason=RULER_EXTRA)
    from ropebench.integrations.lm_eval import tokenizer_source

    folder = tokenizer_source("smollm2-135m")
    metadata = {"max_seq_lengths": [NIAH_LENGTH]}
    ours_argv = [
        "run",
        "--model",
        "ropebench",
        "--model_args",
        f"pretrained=smollm2-135m,method=plain,tokenizer={folder},dtype=float32",
        "--tasks",
        "niah_single_1",
        "--metadata",
        json.dumps(metadata),
        "--limit",
        str(NIAH_SAMPLES),
        "--device",
        "cpu",
        "--batch_size",
        "1",
        "--log_samples",
        "--output_path",
        str(tmp_path / "ropebench"),
    ]
    common = {"task": "niah_single_1", "metadata": metadata, "limit": NIAH_SAMPLES}
    done = subprocess.run(
        [sys.executable, "-c", BOTH_RUNS, folder, str(tmp_path), json.dumps(ours_argv), json.dumps(common)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours = _niah_samples(tmp_path / "ropebench")
    stock = {int(i): tuple(row) for i, row in json.loads((tmp_path / "stock.json").read_text()).items()}
    assert len(ours) == NIAH_SAMPLES and ours.keys() == stock.keys()
    assert {i: answer for i, (answer, _) in ours.items()} == {i: answer for i, (answer, _) in stock.items()}
    assert {i: needle for i, (_, needle) in ours.items()} == {i: needle for i, (_, needle) in stock.items()}


# --- the retrieval task as lm-eval tasks (tasks/lm_eval_tasks/ropebench_retrieval_*) ---------------------

RULER_FILES = {
    "niah_multikey": "niah_multikey_1.yaml",
    "niah_multivalue": "niah_multivalue.yaml",
    "niah_multiquery": "niah_multiquery.yaml",
    "vt": "vt.yaml",
    "niah_single": "niah_single_1.yaml",
}  # RULER's task of each variant
SMALL_RETRIEVAL = {
    "passkey_lengths": [256],
    "classification_lengths": [256],
    "num_docs": 2,
    "retrieval_lengths": [1024],
    "retrieval_depths": (0.0, 1.0),
    "retrieval_trials": 2,
}


@pytest.fixture(scope="module")
def retrieval_tasks(tmp_path_factory, tok):
    from ropebench.tasks import lm_eval_export

    return lm_eval_export.export(tmp_path_factory.mktemp("retrieval_tasks"), tok, **SMALL_RETRIEVAL)


def test_retrieval_tasks_load_offline_with_ruler_s_generation_settings(retrieval_tasks):
    """Every variant is a task of its own that lm-eval loads from the folder offline, greedy until EOS with
    the budget of lm-eval's own RULER task of that variant."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml
    from ropebench.tasks import retrieval

    manager = TaskManager(include_path=str(retrieval_tasks), include_defaults=False)
    assert "ropebench_retrieval" in manager.all_tasks
    ruler = Path(lm_eval.__file__).parent / "tasks" / "ruler"
    for variant in retrieval.VARIANTS:
        name = f"ropebench_retrieval_{variant}_1k"
        task = manager.load(name)["tasks"][name]
        theirs = load_yaml(ruler / RULER_FILES[variant], resolve_func=False)["generation_kwargs"]
        ours = task.config.generation_kwargs
        assert (ours["max_gen_toks"], ours["until"], ours["do_sample"]) == (
            theirs["max_gen_toks"],
            theirs["until"],
            theirs["do_sample"],
        ), variant
        assert task.config.metadata["length"] == 1024 and task.config.metadata["variant"] == variant
        assert (
            len(task.test_docs())
            == len(SMALL_RETRIEVAL["retrieval_depths"]) * SMALL_RETRIEVAL["retrieval_trials"]
        )


def test_retrieval_task_prompts_are_the_suites_token_for_token(retrieval_tasks, tiny_model, tok, monkeypatch):
    """The prompts lm-eval builds from the exported docs are the ones retrieval.run builds with scoring
    "generate", haystack "filler" and length_rule "fill" (prompt + the variant's greedy budget <= L)."""
    from lm_eval.tasks import TaskManager
    from ropebench.tasks import retrieval
    from ropebench.tasks.common import special_prefix

    prompts_of = {v: [] for v in retrieval.VARIANTS}
    monkeypatch.setattr(
        retrieval,
        "score_prompt",
        lambda model, tokenizer, ids, scene, *rest: prompts_of[scene.variant].append(list(ids)) or {},
    )
    retrieval.run(
        tiny_model,
        tok,
        lengths=SMALL_RETRIEVAL["retrieval_lengths"],
        variants=retrieval.VARIANTS,
        scoring="generate",
        haystack="filler",  # what the export writes (tasks/lm_eval_tasks/utils.py): the filler, filled
        length_rule="fill",
        depths=SMALL_RETRIEVAL["retrieval_depths"],
        trials=SMALL_RETRIEVAL["retrieval_trials"],
        progress=False,
    )
    manager = TaskManager(include_path=str(retrieval_tasks), include_defaults=False)
    prefix = special_prefix(tok)
    for variant, mine in prompts_of.items():
        name = f"ropebench_retrieval_{variant}_1k"
        task = manager.load(name)["tasks"][name]
        task.build_all_requests()
        theirs = [
            prefix + tok(inst.arguments[0], add_special_tokens=False)["input_ids"] for inst in task.instances
        ]
        assert sorted(theirs) == sorted(mine), variant
        budget = 1024 - task.config.generation_kwargs["max_gen_toks"]
        assert all(0.98 * budget <= len(ids) <= budget for ids in theirs), variant


@pytest.mark.parametrize(
    "prediction", [" 1234567, 7654321.", "1234567", "NOPE", " 7654321\x07 and 1234567 ", "ABC-def 1234567"]
)
def test_retrieval_scores_as_lm_eval_s_ruler(prediction):
    """utils.process_retrieval gives lm-eval's own RULER score (common_utils.process_results) of the same
    answer, and all_found is 1 exactly when that score is."""
    from lm_eval.tasks.ruler import common_utils
    from ropebench.tasks.lm_eval_tasks import utils

    for answers in (["1234567"], ["1234567", "7654321"], ["abc-DEF"]):
        doc = {"answers": answers, "outputs": answers, "max_length": 4096}
        ours = utils.process_retrieval(doc, [prediction])
        theirs = common_utils.process_results(doc, [prediction])["4096"]
        assert ours == {"string_match_all": theirs, "all_found": float(theirs == 1.0)}
