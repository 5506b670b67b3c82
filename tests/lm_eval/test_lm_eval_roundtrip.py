"""lm-eval writer -> reader: what the `ropebench` model records in a results file is what results.load reads
back; stock `hf` runs are guessed from model_args without loading arguments; the pinned lm-eval range, the
stock fallback outside it, ropebench's own task folder, and the layer edges these rely on. Tiny models,
offline."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from ropebench import results
from ropebench.results.store import canonical_json

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["<unk>", "<s>", "</s>", "Question", "yes", "no", "?", *map(str, range(10))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_llama_factory):
    """A saved tiny Llama (trained context 64) with a word-level tokenizer built in memory (no hub, no
    GGUF)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    path = tmp_path_factory.mktemp("tiny")
    tiny_llama_factory(
        max_position_embeddings=64, vocab_size=len(WORDS), bos_token_id=1, eos_token_id=2
    ).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def evaluate(model, model_args: str, out: Path) -> Path:
    """lm-eval's own path, as `lm-eval run` takes it: simple_evaluate on a two-document loglikelihood task,
    then EvaluationTracker writes results_<date>.json. Returns that file."""
    import ropebench.integrations.lm_eval  # noqa: F401  registers the model "ropebench" with lm-eval
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    docs = out / "docs.jsonl"
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text("\n".join(json.dumps({"q": f"Question {i} ?", "a": "yes"}) for i in range(2)))
    task = {
        "task": "roundtrip_tiny",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(docs)}},
        "test_split": "test",
        "output_type": "loglikelihood",
        "doc_to_text": "{{q}}",
        "doc_to_target": "{{a}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }
    blob = simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[task],
        limit=2,
        bootstrap_iters=0,
        device="cpu",
        task_manager=TaskManager(include_defaults=False),
    )
    EvaluationTracker(output_path=str(out)).save_results_aggregated(results=blob, samples=None)
    (path,) = out.rglob("results*.json")
    return path


def test_ropebench_run_reads_back_what_the_model_patched(model_dir, tmp_path):
    """method, factor and options (the patch's resolved options, as a sweep records them) come from the file;
    model_args the model consumes itself (scored_logits_only, share_prefix, batch_size) never become
    options."""
    from ropebench import extend

    args = (
        f"pretrained={model_dir},method=yarn,factor=2,beta_fast=16,scored_logits_only=true,"
        "share_prefix=false,batch_size=1,max_length=96"
    )
    path = evaluate("ropebench", args, tmp_path / "out")
    df = results.load(path)
    assert set(df["task"]) == {"roundtrip_tiny"} and set(df["metric"]) == {"acc"}
    row = df.iloc[0]
    assert (row.method, row.factor) == ("yarn", 2.0)
    model, _ = extend.load(str(model_dir))
    with extend.patched(model, "yarn", 2.0, beta_fast=16) as handle:  # what a sweep cell records as options
        expected = canonical_json(handle.options)
    assert row.options == expected and json.loads(row.options)["beta_fast"] == 16
    assert json.loads(row.task_options)["max_length"] == 96


def test_stock_hf_run_guesses_options_without_loading_args(model_dir, tmp_path):
    """A stock `hf` run records no ropebench_* keys: method/factor come from model_args (plain at 1 when
    absent), and HFLM's constructor arguments (read from the installed lm-eval) and ropebench's own are not
    options."""
    import inspect

    from lm_eval.models.huggingface import HFLM

    path = evaluate(
        "hf",
        f"pretrained={model_dir},max_length=96,batch_size=2,dtype=float32,logits_cache=false",
        tmp_path / "out",
    )
    row = results.load(path).iloc[0]
    assert (row.method, row.factor, row.options) == ("plain", 1.0, "{}")
    # every HFLM 0.4.13 argument and scored_logits_only: loading arguments, whatever model_args carry
    blob = json.loads(path.read_text())
    loading = [
        "scored_logits_only",
        "share_prefix",
        "max_cpu_memory",
        "offload_folder",
        "tp_plan",
        "autogptq",
        "gptqmodel",
        "chat_template_args",
        "mixed_precision_dtype",
        "max_memory_per_gpu",
    ]
    assert set(loading) - {"scored_logits_only", "share_prefix"} <= set(
        inspect.signature(HFLM.__init__).parameters
    )
    blob["config"]["model_args"] = dict(
        {k: 1 for k in loading}, pretrained=str(model_dir), method="yarn", factor=2, beta_fast=32
    )
    path.write_text(json.dumps(blob))
    row = results.load(path).iloc[0]
    assert (row.method, row.factor, row.options) == ("yarn", 2.0, '{"beta_fast":32}')


def test_damaged_ropebench_options_is_one_clear_error(tmp_path):
    blob = {
        "results": {"t": {"acc,none": 0.5}},
        "config": {
            "model": "ropebench",
            "ropebench_method": "yarn",
            "ropebench_factor": 2.0,
            "ropebench_options": "{oops",
        },
    }
    (tmp_path / "results_x.json").write_text(json.dumps(blob))
    with pytest.raises(results.ResultsError, match="ropebench_options is not a JSON object"):
        results.load(tmp_path / "results_x.json")


def test_pyproject_pins_the_range_the_overrides_follow():
    from packaging.requirements import Requirement
    from packaging.version import Version
    from ropebench.integrations.lm_eval import LM_EVAL_RANGE

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [Requirement(d) for d in deps if Requirement(d).name == "lm-eval"]
    assert pin.specifier == LM_EVAL_RANGE
    assert Version("0.4.13") in LM_EVAL_RANGE and Version("0.4.9") not in LM_EVAL_RANGE


def test_outside_the_range_the_model_keeps_stock_hflm_loops(model_dir, monkeypatch):
    """Another lm-eval version: one warning, then stock HFLM's loglikelihood (same numbers as `hf`), no prefix
    sharing; RoPE is still patched."""
    from lm_eval.models.huggingface import HFLM
    from packaging.version import Version
    from ropebench import extend
    from ropebench.integrations.lm_eval import model as ours

    monkeypatch.setattr(ours, "LM_EVAL_VERSION", Version("0.5.0"))
    monkeypatch.setattr(
        ours.RopebenchLM, "_scored", lambda *a, **k: pytest.fail("override ran outside the range")
    )
    with pytest.warns(UserWarning, match=r"lm-eval 0\.5\.0 is outside .* stock HFLM"):
        lm = ours.RopebenchLM(pretrained=str(model_dir), method="yarn", factor=2.0, batch_size=1)
    try:
        assert extend.current(lm.model) is not None and not lm._shares_prefix()
        reqs = [(("ctx", "cont"), [1, 3, 4, 5], [6, 7]), (("ctx", "c"), [1, 3], [8])]
        got = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
        stock = HFLM(pretrained=lm.model, tokenizer=lm.tokenizer, batch_size=1, max_length=lm.max_length)
        assert got == stock._loglikelihood_tokens(reqs, disable_tqdm=True)
    finally:
        lm.close()


def test_task_folder_is_ropebench_s_even_with_a_tasks_folder_in_the_working_directory(tmp_path):
    """`ropebench lm-eval tasks` from a directory holding the user's own `tasks/` package still prints
    ropebench's folder (the console script does not put the working directory on sys.path)."""
    own = tmp_path / "tasks" / "lm_eval_tasks"
    own.mkdir(parents=True)
    (tmp_path / "tasks" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [Path(sys.executable).parent / "ropebench", "lm-eval", "tasks"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.strip()) == ROOT / "tasks" / "lm_eval_tasks"
