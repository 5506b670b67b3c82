"""Shared fixtures. Tests never reach a hub: everything is built from configs or ships in packages."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M (model, tokenizer), loaded once per test session."""
    import extend

    return extend.load("smollm2-135m", device="cpu", dtype=torch.float32)


def tiny_llama(max_position_embeddings=256, seed=0, **overrides):
    """A tiny random Llama built from a config (no hub)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_position_embeddings, **overrides)
    return LlamaForCausalLM(config).eval()
