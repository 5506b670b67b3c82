"""Fixtures of the tests of extend/ (methods, patching, families, loading)."""

import pytest
import torch
import transformers as T

# A small config and, per tested family, its config and model classes and what the family needs besides
# (head_dim, layer types, special token ids).
SMALL_CONFIG = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
FAMILY_CONFIGS = {
    "llama": (T.LlamaConfig, T.LlamaForCausalLM, {}),
    "mistral": (T.MistralConfig, T.MistralForCausalLM, {}),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, {}),
    "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, {"head_dim": 16}),
    "gemma": (T.GemmaConfig, T.GemmaForCausalLM, {"head_dim": 16}),
    "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM, {"head_dim": 16}),
    "gemma3_text": (
        T.Gemma3TextConfig,
        T.Gemma3ForCausalLM,
        {"head_dim": 16, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16},
    ),
    "phi": (T.PhiConfig, T.PhiForCausalLM, {}),
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM, {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM, {"bos_token_id": 0, "eos_token_id": 0}),
    "olmo2": (T.Olmo2Config, T.Olmo2ForCausalLM, {}),
    "olmo3": (
        T.Olmo3Config,
        T.Olmo3ForCausalLM,
        {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16},
    ),
    "stablelm": (T.StableLmConfig, T.StableLmForCausalLM, {"bos_token_id": 0, "eos_token_id": 0}),
    "cohere": (
        T.CohereConfig,
        T.CohereForCausalLM,
        {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2},
    ),
}


def build(family, seed=0):
    config_cls, model_cls, extra = FAMILY_CONFIGS[family]
    torch.manual_seed(seed)
    return model_cls(config_cls(**SMALL_CONFIG, **extra)).eval()


@pytest.fixture(scope="session")
def family_configs() -> dict:
    """Family (config.model_type) -> (config class, model class, config overrides) of every tested family."""
    return FAMILY_CONFIGS


@pytest.fixture(scope="session")
def family_model_factory():
    """`family_model_factory(family, seed=0)`: a new tiny random model of `family` (a key of
    `family_configs`): 2 layers, hidden size 64, trained context 64, seeded."""
    return build
