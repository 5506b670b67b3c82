"""`ropebench export` (scripts/export_cli.py, issue 40): bad input is one `error:` line and exit 2 before any
model loads and before anything is written; an existing folder is never overwritten; the gate refuses a known
engine difference unless --allow-mismatch; vllm and llama.cpp get their forms printed (and recorded with
--out). The parity of what the transformers export computes: tests/extend/test_export.py."""

import json

import pytest
from ropebench.export_cli import main
from ropebench.extend import loading


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any weight load (a GGUF snapshot, from_pretrained) fails the test."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "gguf_snapshot", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def one_error_line(capsys) -> str:
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.err
    return lines[0]


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["--method", "dynamic-yarn", "--to", "transformers"], "no length-dependent YaRN"),
        (["--method", "xpos", "--factor", "2", "--to", "vllm"], "no xPos"),
        (["--method", "llama3", "--factor", "2", "--to", "llama.cpp"], "rope_freqs"),
        (["--method", "self-extend", "--factor", "2", "--to", "llama.cpp"], "Self-Extend"),
        (["--method", "yarn", "--factor", "2", "--to", "onnx"], "unknown engine 'onnx'"),
        (["--method", "ntk", "--factor", "0.5", "--to", "transformers"], "only extends context"),
        (["--method", "yarn", "--factor", "2", "-o", "beta_fast=-1", "--to", "vllm"], "beta_fast"),
        (["--method", "dynamic-ntk", "--factor", "2", "--to", "vllm"], "allow-mismatch"),
        (["--method", "longrope", "-o", "short_factor=[1]", "-o", "long_factor=[2]", "--to", "vllm"], "32"),
        (["--method", "yarn", "--factor", "2", "--to", "transformers"], "give --out"),
    ],
)
def test_bad_input_is_one_line_before_anything_loads_or_is_written(
    argv, expect, tmp_path, capsys, no_model_loads
):
    out = tmp_path / "out"
    extra = [] if "give --out" in expect else ["--out", str(out)]
    assert main(["smollm2-135m", *argv, *extra]) == 2
    assert expect in one_error_line(capsys)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_never_overwritten(tmp_path, capsys, no_model_loads):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    argv = ["smollm2-135m", "--method", "yarn", "--factor", "2", "--to", "transformers", "--out", str(out)]
    assert main(argv) == 2
    assert "not empty" in one_error_line(capsys)
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and (out / "mine.txt").read_text() == "keep"
    file = tmp_path / "file"
    file.write_text("x")
    assert main(["smollm2-135m", "--method", "pi", "--factor", "2", "--to", "vllm", "--out", str(file)]) == 2
    assert "is a file" in one_error_line(capsys) and file.read_text() == "x"


def test_the_gate_lets_a_known_difference_through_only_when_asked(tmp_path, capsys, no_model_loads):
    out = tmp_path / "d"
    argv = ["smollm2-135m", "--method", "dynamic-ntk", "--factor", "2", "--to", "vllm", "--out", str(out)]
    assert main([*argv, "--allow-mismatch"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("parity vllm/dynamic-ntk: differs — vLLM's `dynamic` is static")
    record = json.loads((out / "export.json").read_text())
    assert record["parity"]["status"] == "differs"
    assert record["hf_overrides"]["rope_parameters"]["factor"] == 2


def test_vllm_form_is_printed(capsys, no_model_loads):
    assert main(["smollm2-135m", "--method", "yarn", "--factor", "4", "--to", "vllm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("parity vllm/yarn: not measured")
    serve = lines[1]
    overrides = json.loads(serve.split("--hf-overrides '")[1].split("'")[0])
    assert overrides["rope_parameters"] == {
        "rope_type": "yarn",
        "rope_theta": 100000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 8192,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    assert serve.endswith("--max-model-len 32768") and lines[2].startswith("LLM(model=")


def test_llama_cpp_flags_name_the_embedded_gguf(capsys, no_model_loads):
    assert main(["smollm2-135m", "--method", "ntk", "--factor", "2", "--to", "llama.cpp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("parity llama.cpp/ntk: measured")
    gguf = str(loading.embedded_gguf())
    assert lines[1].startswith(f"llama-cli -m {gguf} -c 16384 --rope-scaling none --rope-freq-base ")
    keywords = "n_ctx=16384, rope_scaling_type=0, rope_freq_base="
    assert lines[2].startswith(f"Llama(model_path={gguf!r}, {keywords}")
