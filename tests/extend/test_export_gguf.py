"""The GGUF form of a llama.cpp export (extend/export_gguf.py, issue 40): the copy carries the setting in the
keys llama.cpp's loader reads, with the values derived here by hand from the papers' formulas; every other key
and every tensor byte is the source's; what the metadata cannot say is refused before anything is written."""

import math

import gguf
import numpy as np
import pytest
from ropebench.export_cli import main
from ropebench.extend import export as engines
from ropebench.extend import loading
from ropebench.extend.export_gguf import GGUFCopyError, gguf_metadata, write_copy

CONTEXT, THETA, HEAD_DIM = 64, 10000.0, 16


@pytest.fixture
def config(tiny_llama_factory):
    """The tests' tiny Llama's config (head dim 16), trained context CONTEXT, base THETA."""
    return tiny_llama_factory(max_position_embeddings=CONTEXT, rope_theta=THETA).config


@pytest.fixture
def source(tmp_path):
    """A small GGUF as llama.cpp's converter lays one out: architecture, a few keys of each kind, two tensors
    (float32 and raw bytes standing for a quantized one)."""
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_context_length(CONTEXT)
    w.add_rope_freq_base(THETA)
    w.add_block_count(2)
    w.add_name("tiny")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor(
        "blk.0.raw", rng.integers(0, 255, 40, dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.I8
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def fields(path) -> dict:
    reader = gguf.GGUFReader(path, "r")
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def tensors(path) -> dict:
    return {t.name: bytes(np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(path, "r").tensors}


def copied(method, factor, options, config, source, tmp_path) -> dict:
    kwargs = engines.plan("llama.cpp", method, factor, options, config).kwargs
    dest = tmp_path / f"{method}.gguf"
    write_copy(source, dest, gguf_metadata(kwargs, "llama"))
    assert tensors(dest) == tensors(source)  # every tensor byte as in the source
    return fields(dest)


def test_pi_ntk_yarn_in_the_keys_llama_cpp_reads(config, source, tmp_path):
    before = fields(source)
    pi = copied("pi", 2, {}, config, source, tmp_path)
    assert pi["llama.rope.scaling.type"] == "linear" and pi["llama.rope.scaling.factor"] == 2.0
    assert pi["llama.context_length"] == 2 * CONTEXT
    ntk = copied("ntk", 4, {}, config, source, tmp_path)
    # NTK-aware: base b * s^(d / (d - 2)) (bloc97), stored as float32
    assert ntk["llama.rope.freq_base"] == pytest.approx(THETA * 4 ** (HEAD_DIM / (HEAD_DIM - 2)), rel=1e-7)
    assert ntk["llama.rope.scaling.type"] == "none"
    yarn = copied("yarn", 2, {}, config, source, tmp_path)
    assert yarn["llama.rope.scaling.type"] == "yarn" and yarn["llama.rope.scaling.factor"] == 2.0
    assert yarn["llama.rope.scaling.original_context_length"] == CONTEXT
    assert "llama.rope.scaling.attn_factor" not in yarn  # llama.cpp's own 0.1 ln s + 1 is YaRN's
    parts = copied("ntk-parts", 2, {}, config, source, tmp_path)
    # no temperature: the model's factor cancels llama.cpp's 1 + 0.1 ln s
    assert parts["llama.rope.scaling.attn_factor"] == pytest.approx(1 / (1 + 0.1 * math.log(2)), rel=1e-7)
    for out in (pi, ntk, yarn, parts):  # everything else as the source has it
        same = {k: v for k, v in before.items() if k not in ("llama.context_length", "llama.rope.freq_base")}
        assert {k: out[k] for k in same} == same
        assert out.get("llama.rope.freq_base", THETA) in (THETA, ntk["llama.rope.freq_base"])


@pytest.mark.parametrize(
    "method, options, expect",
    [("plain", {}, "plain needs no copy"), ("yarn", {"beta_fast": 16}, "beta_fast")],
)
def test_what_the_metadata_cannot_say_is_refused(method, options, expect, config):
    kwargs = engines.plan("llama.cpp", method, 2 if method != "plain" else 1, options, config).kwargs
    with pytest.raises(GGUFCopyError, match=expect):
        gguf_metadata(kwargs, "llama")


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["--method", "yarn", "--factor", "2", "--to", "vllm"], "use it with --to llama.cpp"),
        (["--method", "plain", "--to", "llama.cpp"], "plain needs no copy"),
        (["--method", "yarn", "--factor", "2", "-o", "beta_slow=2", "--to", "llama.cpp"], "beta_slow"),
    ],
)
def test_cli_refuses_before_writing(argv, expect, tmp_path, capsys, monkeypatch):
    """Refused in one line, nothing written, and a setting no GGUF can carry before the source is parsed."""
    from ropebench.extend import export_gguf

    def parsed(*_, **__):
        raise AssertionError("the source GGUF was parsed before the setting was refused")

    monkeypatch.setattr(export_gguf, "check_source", parsed)
    out = tmp_path / "out"
    assert main(["smollm2-135m", *argv, "--out", str(out), "--gguf-copy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expect in err[0]
    assert list(tmp_path.iterdir()) == []


def test_cli_writes_the_copy_of_the_embedded_gguf(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["smollm2-135m", "--method", "yarn", "--factor", "2", "--to", "llama.cpp", "--out", str(out),
                 "--gguf-copy"]) == 0  # fmt: skip
    name = f"{loading.embedded_gguf().stem}.yarn-x2.gguf"
    assert sorted(p.name for p in out.iterdir()) == sorted(["export.json", name])
    got = fields(out / name)
    assert got["llama.rope.scaling.type"] == "yarn" and got["llama.rope.scaling.factor"] == 2.0
    assert got["llama.rope.scaling.original_context_length"] == 8192 and got["llama.context_length"] == 16384
    assert f"wrote {out / name}" in capsys.readouterr().out
