"""lm-eval integration: the `ropebench` model, scored-positions-only logits, the task export and the CLI shim.
All offline; the real-model tests share the session's SmolLM2 and one small generated task folder."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(
    os.environ,
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    OMP_NUM_THREADS="1",
    TOKENIZERS_PARALLELISM="false",
    PYTHONPATH=str(ROOT),
)
SMALL = {
    "passkey_lengths": [256, 512],
    "depths": (0.0, 0.5, 1.0),
    "trials": 1,
    "classification_lengths": [256, 512],
    "num_docs": 4,
    "retrieval_lengths": [512],
    "retrieval_depths": (0.0,),
    "retrieval_trials": 1,
}


def shim(*args, timeout=600):
    """`ropebench lm-eval ARGS` in a subprocess (the command that hands integrations.lm_eval ropebench's
    tasks)."""
    return subprocess.run(
        [sys.executable, "-m", "ropebench.cli", "lm-eval", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- no model -------------------------------------------------------------------------------------------


def test_importing_extend_does_not_import_lm_eval():
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from ropebench import extend; print('lm_eval' in sys.modules)"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.stdout.strip() == "False", out.stderr


def test_model_args_parsing():
    from ropebench.integrations.lm_eval.model import check_model_args, parse_value

    assert parse_value("2") == 2 and parse_value("2.5") == 2.5 and parse_value("true") is True
    assert parse_value("[1, 1.5]") == [1, 1.5] and parse_value("1;1.5;2") == [1, 1.5, 2.0]
    assert parse_value("none") is None and parse_value("abc") == "abc"
    method, factor, options, rest = check_model_args(
        {"pretrained": "smollm2-135m", "method": "yarn", "factor": "4", "beta_fast": "16", "batch_size": 2}
    )
    assert (method, factor, options, rest) == ("yarn", 4.0, {"beta_fast": 16}, {"batch_size": 2})


@pytest.mark.parametrize(
    "args, message",
    [
        ({"method": "nope"}, "unknown RoPE method"),
        ({"method": "yarn", "factor": "abc"}, "factor must be a number"),
        ({"method": "yarn", "factor": 0.5}, "factor must be >= 1"),
        ({"method": "yarn", "bogus": 1}, "unknown model_args 'bogus'"),
        ({"method": "longrope", "factor": 2, "short_factor": "[1", "1.2]": ""}, "a list value was split"),
        ({"method": "plain", "max_length": -3}, "model_args max_length: -3 is not positive"),
    ],
)
def test_bad_model_args(args, message):
    from ropebench.extend import ExtendError
    from ropebench.integrations.lm_eval import RopebenchLM, check_model_args

    with pytest.raises(ExtendError, match=message):
        check_model_args(args)
    with pytest.raises(ExtendError, match=message):  # the class checks before loading anything
        RopebenchLM(pretrained="/nonexistent", **args)


def test_cli_bad_model_args_one_line_exit_2():
    for model_args in (
        "pretrained=smollm2-135m,method=nope",
        "pretrained=smollm2-135m,method=yarn,factor=abc",
    ):
        out = shim(
            "run", "--model", "ropebench", "--model_args", model_args, "--tasks", "ropebench_passkey_1k"
        )
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert out.returncode == 2, out.stderr[-2000:]
        assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]


def test_tasks_path_command(capsys):
    """`ropebench lm-eval tasks` prints the folder the command hands the core; the core alone
    (`python -m ropebench.integrations.lm_eval`) knows none: it never looks above itself for one."""
    from ropebench.cli import main
    from ropebench.integrations.lm_eval import main as core_main

    assert main(["lm-eval", "tasks"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == ROOT / "tasks" / "lm_eval_tasks"
    assert (path / "ropebench_passkey_16k.yaml").is_file() and (path / "ropebench_sotu_era_4k.yaml").is_file()
    assert core_main(["tasks"]) == 2
    assert "ropebench lm-eval tasks" in capsys.readouterr().err


def test_an_unknown_flag_is_one_line_and_exit_2(capsys):
    """lm-eval's own usage block (argparse) becomes the project's one line."""
    from ropebench.integrations.lm_eval import main

    assert main(["--bogus-flag"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unrecognized arguments: --bogus-flag — "), lines
    assert captured.out == ""


# --- data out of reach offline ----------------------------------------------------------------------------

RULER = Path(importlib.util.find_spec("lm_eval").origin).parent / "tasks" / "ruler"  # lm-eval's own RULER


def test_what_a_task_fetches_is_read_from_its_config():
    """A hub `dataset_path`, lm-eval's RULER generators that load the essay haystack or download a QA set;
    not a local builder, a folder, or a generator that makes its haystack up (niah_single_1's repeats)."""
    from ropebench.integrations.lm_eval.data import ESSAY_DATASET, data_needed

    essay = f"the hub dataset {ESSAY_DATASET!r}"
    assert data_needed({"dataset_path": "", "custom_dataset": f"{RULER}/niah_utils.niah_multikey_1"}) == [
        essay
    ]
    assert data_needed({"dataset_path": "", "custom_dataset": f"{RULER}/niah_utils.niah_single_1"}) == []
    assert data_needed({"custom_dataset": f"{RULER}/qa_utils.get_squad"}) == [
        "a download from the web (its QA set)"
    ]
    assert data_needed({"dataset_path": "Rowan/hellaswag"}) == ["the hub dataset 'Rowan/hellaswag'"]
    assert data_needed({"dataset_path": "json", "dataset_kwargs": {"data_files": "x.jsonl"}}) == []
    assert data_needed({"dataset_path": str(ROOT)}) == []


def test_a_cached_dataset_counts_only_in_its_cache(tmp_path, monkeypatch):
    from ropebench.integrations.lm_eval.data import dataset_cached

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert not dataset_cached("baber/paul_graham_essays")
    hub = tmp_path / "hub" / "datasets--baber--paul_graham_essays"
    own = tmp_path / "datasets" / "baber___paul_graham_essays"
    # issue 41: an empty cache folder (an interrupted or refused download) is no data; nor are locks and
    # partial files
    (hub / "snapshots" / "abc").mkdir(parents=True)
    (hub / "blobs").mkdir()
    (hub / "blobs" / "x.incomplete").write_text("part")
    (own / "default").mkdir(parents=True)
    (own / "default.lock").write_text("")
    assert not dataset_cached("baber/paul_graham_essays")
    (own / "default" / "data.arrow").write_bytes(b"arrow")
    assert dataset_cached("baber/paul_graham_essays")
    (own / "default" / "data.arrow").unlink()
    (hub / "snapshots" / "abc" / "data.parquet").write_bytes(b"parquet")
    assert dataset_cached("baber/paul_graham_essays")


def test_offline_tasks_whose_data_is_not_cached_are_refused_before_the_model_loads(
    tmp_path, monkeypatch, capsys
):
    """Issue 32 item 3: lm-eval's niah_multikey_1 (essay haystack) used to load the model, build samples and
    die 37 s later with an 84-line traceback. Now one line names it (not niah_single_1, which needs nothing),
    and nothing loads."""
    from ropebench import extend
    from ropebench.cli import main

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(extend.loading, "load", lambda *a, **k: pytest.fail("the model loaded"))
    argv = ["run", "--model", "ropebench", "--tasks", "niah_single_1", "niah_multikey_1"]
    assert main(["lm-eval", *argv, "--metadata", '{"tokenizer": "gpt2"}']) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "niah_multikey_1 needs the hub dataset 'baber/paul_graham_essays'" in lines[0], lines[0]
    assert "niah_single_1" not in lines[0] and lines[0].startswith("error: offline")


def test_committed_tasks_are_templates_plus_lengths():
    """lm-eval indexes the committed folder: each task is its task's template with a name and a length, and
    the tags select the tasks."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml
    from ropebench.tasks import lm_eval_export as ex

    folder = ROOT / "tasks" / "lm_eval_tasks"
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    passkey_tasks = {f"ropebench_passkey_{ex.length_name(n)}": n for n in ex.PASSKEY_LENGTHS}
    era_tasks = {f"ropebench_sotu_era_{ex.length_name(n)}": n for n in ex.CLASSIFICATION_LENGTHS}
    retrieval_tasks = {
        ex.retrieval_task_name(v, n): n for v in ex.retrieval.VARIANTS for n in ex.RETRIEVAL_LENGTHS
    }
    assert set(manager.all_tasks) == {
        *passkey_tasks,
        *era_tasks,
        *retrieval_tasks,
        "ropebench",
        "ropebench_passkey",
        "ropebench_sotu_era",
        "ropebench_retrieval",
    }
    for name, length in retrieval_tasks.items():
        config = load_yaml(folder / f"{name}.yaml", resolve_func=False)
        assert (folder / f"{name}.yaml").read_text(encoding="utf-8") == ex.retrieval_task_yaml(
            config["metadata"]["variant"], length
        )
        assert config["metadata"]["length"] == length
    for name, length in {**passkey_tasks, **era_tasks}.items():
        task = "passkey" if name in passkey_tasks else "sotu_era"
        assert (folder / f"{name}.yaml").read_text(encoding="utf-8") == ex.task_yaml(task, length)
        config = load_yaml(folder / f"{name}.yaml", resolve_func=False)
        assert config["metadata"]["length"] == length  # results.from_lm_eval reads the length from here
        assert config["custom_dataset"].endswith(f"utils.load_{task}")


# --- real model -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_tasks(tmp_path_factory, smollm2):
    from ropebench.tasks import lm_eval_export

    return lm_eval_export.export(tmp_path_factory.mktemp("lm_eval_tasks"), smollm2[1], **SMALL)


@pytest.fixture(scope="module")
def task_manager(small_tasks):
    """lm-eval's task manager of the small folder alone (the tests load only its tasks; indexing lm-eval's own
    thousands of task YAMLs besides takes ~12 s)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(small_tasks), include_defaults=False)


@pytest.mark.real
def test_export_is_deterministic_and_self_contained(smollm2, small_tasks):
    from ropebench.tasks import lm_eval_export as ex

    files = ex.render(smollm2[1], **SMALL)
    assert {n: (small_tasks / n).read_text(encoding="utf-8") for n in files} == files
    for name in ex.STATIC_FILES:  # the hand-written files travel with the data: the folder works alone
        assert (small_tasks / name).read_bytes() == (ex.OUT_DIR / name).read_bytes()
    from ropebench.extend.owned_paths import MARKER  # the folder's write marker (extend/owned_paths.py)

    assert {p.name for p in small_tasks.iterdir() if p.is_file()} == {*files, *ex.STATIC_FILES, MARKER}


def _lm_eval_prompts(lm, task_manager, task_name) -> list[list[int]]:
    """The token ids of the prompts lm-eval builds for a task (one per doc), encoded as the model encodes
    them."""
    task = task_manager.load(task_name)["tasks"][task_name]
    task.build_all_requests()
    contexts = {inst.doc_id: inst.arguments[0] for inst in task.instances}  # multiple choice: 4 per doc
    return sorted(lm.tok_encode(c) for c in contexts.values())


@pytest.mark.real
def test_task_prompts_are_the_suites_token_for_token(smollm2, small_tasks, task_manager, monkeypatch):
    """The prompts the lm-eval tasks feed the model are the ones passkey.run and classification.run build."""
    from ropebench.integrations.lm_eval import RopebenchLM
    from ropebench.tasks import classification, passkey

    model, tok = smollm2
    prompts_of = {"passkey": [], "sotu_era": []}
    monkeypatch.setattr(passkey, "_generate", lambda m, t, ids, n, c: prompts_of["passkey"].append(ids) or "")
    monkeypatch.setattr(
        classification,
        "continuation_logprobs",
        lambda m, ids, answers, prefix_cache: (
            prompts_of["sotu_era"].append(ids) or [torch.zeros(len(a)) for a in answers]
        ),
    )
    lengths = SMALL["passkey_lengths"]
    assert lengths == SMALL["classification_lengths"]
    passkey.run(model, tok, lengths=lengths, depths=SMALL["depths"], trials=SMALL["trials"], progress=False)
    classification.run(model, tok, lengths=lengths, num_docs=SMALL["num_docs"], progress=False)
    lm = RopebenchLM(pretrained=model, tokenizer=tok, method="plain")
    try:
        for name, prompts in prompts_of.items():
            per_length = len(SMALL["depths"]) * SMALL["trials"] if name == "passkey" else SMALL["num_docs"]
            for i, length in enumerate(lengths):
                mine = sorted(prompts[i * per_length : (i + 1) * per_length])
                assert max(map(len, mine)) <= length and min(map(len, mine)) >= 0.99 * length
                assert _lm_eval_prompts(lm, task_manager, f"ropebench_{name}_{length}") == mine, (
                    name,
                    length,
                )
    finally:
        lm.close()


@pytest.mark.real
def test_committed_task_folder_is_up_to_date(smollm2):
    """Exporting again gives the committed docs (checked on the short lengths; the full export is
    `python -m ropebench.tasks.lm_eval_export`)."""
    from ropebench.tasks import lm_eval_export as ex

    tok = smollm2[1]
    folder = ROOT / "tasks" / "lm_eval_tasks"
    rows = [json.loads(x) for x in (folder / "passkey.jsonl").read_text().splitlines()]
    fresh = ex.passkey_docs(tok, [1024], ex.PASSKEY_DEPTHS, ex.PASSKEY_TRIALS)  # each length alike
    assert sorted(fresh, key=lambda r: r["id"]) == sorted(
        (r for r in rows if r["length"] == 1024), key=lambda r: r["id"]
    )
    rows = [json.loads(x) for x in (folder / "sotu_era.jsonl").read_text().splitlines()]
    assert ex.era_docs(tok, [1024], ex.CLASSIFICATION_DOCS) == [r for r in rows if r["length"] == 1024]
    names = {f"ropebench_passkey_{ex.length_name(n)}.yaml" for n in ex.PASSKEY_LENGTHS}
    names |= {f"ropebench_sotu_era_{ex.length_name(n)}.yaml" for n in ex.CLASSIFICATION_LENGTHS}
    rows = [json.loads(x) for x in (folder / "retrieval.jsonl").read_text().splitlines()]
    fresh = ex.retrieval_docs(tok, [4096], ex.RETRIEVAL_DEPTHS, ex.RETRIEVAL_TRIALS)
    assert fresh == [r for r in rows if r["length"] == 4096]
    names |= {
        f"{ex.retrieval_task_name(v, n)}.yaml" for v in ex.retrieval.VARIANTS for n in ex.RETRIEVAL_LENGTHS
    }
    assert names | set(ex.STATIC_FILES) | {"passkey.jsonl", "sotu_era.jsonl", "retrieval.jsonl"} == {
        p.name for p in folder.iterdir() if p.is_file()
    }


def _requests(tok):
    text = (
        "The history of the state of the union address goes back to the constitution, which asks the "
        "president to give Congress information on the state of the union from time to time. "
    ) * 3
    ids = tok(text, add_special_tokens=False)["input_ids"]
    reqs = []
    for n_ctx, n_cont in ((5, 1), (40, 7), (61, 3), (90, 12), (17, 1), (30, 2)):
        reqs.append(((f"c{n_ctx}", f"x{n_cont}"), ids[:n_ctx], ids[n_ctx : n_ctx + n_cont]))
    reqs.append((("shared", "a"), ids[:30], [ids[40]]))  # one-token continuations after one context: cached
    reqs.append((("shared", "b"), ids[:30], [ids[41]]))
    return reqs


@pytest.mark.real
@pytest.mark.parametrize("batch_size, max_length", [(1, None), (3, None), (2, 48)])
def test_scored_positions_only_equals_stock_hflm(smollm2, batch_size, max_length):
    from lm_eval.models.huggingface import HFLM
    from ropebench.integrations.lm_eval import RopebenchLM

    model, tok = smollm2
    reqs = _requests(tok)
    stock = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, max_length=max_length or 8192)
    expected = stock._loglikelihood_tokens(reqs, disable_tqdm=True)
    lm = RopebenchLM(
        pretrained=model, tokenizer=tok, method="plain", batch_size=batch_size, max_length=max_length
    )
    try:
        assert lm.max_length == (max_length or 8192)
        got = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    finally:
        lm.close()
    diff = max(abs(a[0] - b[0]) for a, b in zip(got, expected))
    assert diff < 1e-4, diff
    assert [g for _, g in got] == [g for _, g in expected]


@pytest.mark.real
def test_rolling_loglikelihood_equals_stock_hflm_in_bounded_blocks(smollm2, monkeypatch):
    """Rolling perplexity (several windows of max_length) gives stock HFLM's numbers, while the LM head never
    sees more than SCORE_BLOCK positions at once (stock: the whole window)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from ropebench.integrations.lm_eval import model as ours

    model, tok = smollm2
    text = " ".join(
        f"Section {i}: the union is strong, and the budget for year {1990 + i} is balanced."
        for i in range(20)
    )
    request = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)]
    expected = HFLM(pretrained=model, tokenizer=tok, max_length=96, batch_size=2).loglikelihood_rolling(
        request, disable_tqdm=True
    )
    monkeypatch.setattr(ours, "SCORE_BLOCK", 40)
    rows = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, a, out: rows.append(a[0].shape[-2]))
    lm = ours.RopebenchLM(pretrained=model, tokenizer=tok, method="plain", max_length=96, batch_size=2)
    try:
        got = lm.loglikelihood_rolling(request, disable_tqdm=True)
    finally:
        lm.close()
        hook.remove()
    assert len(tok(text)["input_ids"]) > 2 * 96  # several windows
    assert abs(got[0] - expected[0]) < 1e-3, (got, expected)  # a sum over ~450 tokens
    assert rows and max(rows) <= 40


@pytest.mark.real
def test_simple_evaluate_plain_and_yarn(smollm2, task_manager):
    from lm_eval import simple_evaluate
    from ropebench.integrations.lm_eval import RopebenchLM

    model, tok = smollm2
    per_sample = {}
    for method in ("plain", "yarn"):
        lm = RopebenchLM(pretrained=model, tokenizer=tok, method=method, factor=1)
        try:
            assert lm.patch.method == method and lm.max_length == 8192
            out = simple_evaluate(
                model=lm,
                tasks=["ropebench_passkey_256", "ropebench_sotu_era_256"],
                limit=2,
                task_manager=task_manager,
                log_samples=True,
                bootstrap_iters=0,
            )
        finally:
            lm.close()
        res = out["results"]
        assert 0.0 <= res["ropebench_passkey_256"]["exact_match,first_integer"] <= 1.0
        assert {"acc,none", "acc_norm,none"} <= set(res["ropebench_sotu_era_256"])
        assert out["config"]["ropebench_method"] == method
        per_sample[method] = [[r[0] for r in s["resps"]] for s in out["samples"]["ropebench_sotu_era_256"]]
        assert len(per_sample[method]) == 2 and all(len(x) == 4 for x in per_sample[method])
    assert per_sample["yarn"] == per_sample["plain"]  # yarn at factor 1 is the model itself, bit for bit
    from ropebench.extend import current

    assert current(model) is None


@pytest.mark.real
def test_cli_shim_end_to_end(tmp_path, small_tasks, smollm2):
    """`python -m ropebench.integrations.lm_eval run` on a tiny model directory (a random 1-layer Llama with
    SmolLM2's tokenizer), a local task folder and --limit; then results.from_lm_eval reads the JSON."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = smollm2[1]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model_dir = tmp_path / "tiny"
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out_dir = tmp_path / "out"
    out = shim(
        "run",
        "--model",
        "ropebench",
        "--model_args",
        f"pretrained={model_dir},method=yarn,factor=2",
        "--tasks",
        "ropebench_passkey_256",
        "ropebench_sotu_era_256",
        "--include_path",
        str(small_tasks),
        "--limit",
        "1",
        "--device",
        "cpu",
        "--output_path",
        str(out_dir),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    files = list(out_dir.rglob("results*.json"))
    assert len(files) == 1
    blob = json.loads(files[0].read_text())
    assert blob["config"]["ropebench_max_length"] == 1024 and blob["config"]["ropebench_method"] == "yarn"
    assert "exact_match,first_integer" in blob["results"]["ropebench_passkey_256"]
    results = pytest.importorskip("ropebench.results")
    if not hasattr(results, "from_lm_eval"):
        pytest.skip("results.from_lm_eval has not landed")
    df = results.from_lm_eval(files[0])
    row = df[(df.task == "ropebench_sotu_era_256") & (df.metric == "acc")].iloc[0]
    assert row.method == "yarn" and row.factor == 2.0 and int(row.length) == 256


@pytest.mark.real
def test_prefix_sharing_gives_stock_numbers(smollm2, monkeypatch):
    """batch_size 1: loglikelihood requests that share a prefix (every one of `_requests` is a prefix of one
    text) reuse its KV cache, and generate_until prefills only what a prompt does not share with the last one;
    the numbers and the generated text are stock HFLM's."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from ropebench.extend import prefix_cache
    from ropebench.integrations.lm_eval import RopebenchLM

    model, tok = smollm2
    monkeypatch.setattr(prefix_cache, "MIN_SHARED", 4)  # these requests share tens of tokens, not hundreds
    caches = []
    real_cache = prefix_cache.PrefixCache
    monkeypatch.setattr(
        prefix_cache, "PrefixCache", lambda *a, **k: caches.append(real_cache(*a, **k)) or caches[-1]
    )
    reqs = _requests(tok)
    stock = HFLM(pretrained=model, tokenizer=tok, batch_size=1, max_length=8192)
    expected = stock._loglikelihood_tokens(reqs, disable_tqdm=True)
    text = "The pass key is 12345. Remember it. The grass is green. The sky is blue. " * 3
    prompts = [
        text + "What is the pass key? The pass key is",
        text + "What is the grass? The grass is",
        text + "What is the sky? The sky is",
    ]
    gen = [
        Instance(
            request_type="generate_until",
            doc={},
            idx=i,
            arguments=(p, {"until": ["\n"], "max_gen_toks": 6, "do_sample": False}),
        )
        for i, p in enumerate(prompts)
    ]
    expected_text = stock.generate_until(gen, disable_tqdm=True)
    lm = RopebenchLM(pretrained=model, tokenizer=tok, method="plain", batch_size=1)
    try:
        got = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
        got_text = lm.generate_until(gen, disable_tqdm=True)
    finally:
        lm.close()
    assert max(abs(a[0] - b[0]) for a, b in zip(got, expected)) < 1e-4
    assert [g for _, g in got] == [g for _, g in expected]
    assert got_text == expected_text and all(t.strip() for t in got_text)
    scoring, generating = caches
    assert scoring.reused > 0 and generating.reused > 0  # the shared prefixes did not run again


@pytest.mark.parametrize("method", ["dynamic-ntk", "xpos"])
def test_generate_until_keeps_one_set_of_frequencies(tok, monkeypatch, method, tiny_llama_factory):
    """generate_until with a length-dependent method runs under extend.fixed_length(model, prompt +
    max_gen_toks): every cached step's logits are a full forward's at that length (unfixed, each step used its
    own length's frequencies against keys rotated for the prompt's: ~5e-4 logit drift per step on SmolLM2, up
    to 4 here). xPos (length-independent; its centre kept on the prefix cache and through generate's `cache=`)
    must match too. Tolerance: sqrt(float32 eps) of the logits' scale, as in
    tests/extend/test_transformers_api.py."""
    from lm_eval.api.instance import Instance
    from ropebench import extend
    from ropebench.integrations.lm_eval import RopebenchLM

    # trained context 32, prompt ~40 + 8 new tokens: dynamic-ntk's frequencies change at every step
    model = tiny_llama_factory(max_position_embeddings=32, vocab_size=len(tok), initializer_range=0.3)
    calls = []

    def spy_generate(**kwargs):  # the real generate, keeping its per-step logits
        out = type(model).generate(model, **kwargs, output_logits=True, return_dict_in_generate=True)
        calls.append(
            (out.sequences, torch.cat(out.logits), kwargs["input_ids"].shape[1], kwargs["max_length"])
        )
        return out.sequences

    monkeypatch.setattr(model, "generate", spy_generate)
    prompt = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 2
    request = [
        Instance(
            request_type="generate_until",
            doc={},
            idx=0,
            arguments=(prompt, {"until": ["<never>"], "max_gen_toks": 8, "do_sample": False}),
        )
    ]
    lm = RopebenchLM(pretrained=model, tokenizer=tok, method=method, factor=2, batch_size=1)
    try:
        lm.generate_until(request, disable_tqdm=True)
        ((sequence, steps, prompt_len, max_length),) = calls
        assert 32 < prompt_len and steps.shape[0] > 1
        with extend.fixed_length(model, max_length), torch.no_grad():
            full = model(sequence[:, :-1]).logits[0, prompt_len - 1 :]
    finally:
        lm.close()
    scale = float(full.abs().max())
    torch.testing.assert_close(steps, full, atol=torch.finfo(torch.float32).eps ** 0.5 * scale, rtol=0)
