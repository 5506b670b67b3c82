"""Random-weight models built from a seed, so a CPU and a GPU see the same weights with nothing carried:
the tiny model of every tested family (tests/extend/conftest.py's `family_model_factory` uses this table)
and models shaped like SmolLM2-135M and Llama-3-8B (their published configs, random weights). Imports torch
and transformers when called, not at import."""

from __future__ import annotations

# A small config, and per tested family what it needs besides (head_dim, layer types, special token ids):
# tests/extend/conftest.py builds its family models from this same table.
SMALL_CONFIG = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
WINDOWED = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16}
FAMILY_EXTRAS = {  # family (config.model_type) -> (config class name, model class name, extra config)
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16, **WINDOWED}),
    "phi": ("PhiConfig", "PhiForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"bos_token_id": 0, "eos_token_id": 0}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", WINDOWED),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {"bos_token_id": 0, "eos_token_id": 0}),
    "cohere": (
        "CohereConfig",
        "CohereForCausalLM",
        {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2},
    ),
}

# Published shapes (config.json of HuggingFaceTB/SmolLM2-135M and meta-llama/Meta-Llama-3-8B), random weights.
SHAPES = {
    "smollm2-135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    "llama-3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
}
# --cpu-sizes: the same shapes shrunk (layers, widths, vocabulary, trained context) to run in seconds
TINY_SHAPES = {
    "smollm2-135m": dict(
        SHAPES["smollm2-135m"],
        hidden_size=72,
        intermediate_size=192,
        num_hidden_layers=2,
        vocab_size=512,
        max_position_embeddings=128,
    ),
    "llama-3-8b": dict(
        SHAPES["llama-3-8b"],
        hidden_size=128,
        intermediate_size=448,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=1024,
        max_position_embeddings=128,
    ),
}


def family_config(family: str, *, attn_implementation: str = "sdpa", **overrides):
    import transformers

    config_name, _, extra = FAMILY_EXTRAS[family]
    config = getattr(transformers, config_name)(**{**SMALL_CONFIG, **extra, **overrides})
    config._attn_implementation = attn_implementation
    return config


def build_family(
    family: str,
    *,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    dtype=None,
    device: str = "cpu",
    **overrides,
):
    """A new tiny random model of `family` (default: on the CPU in float32), the same weights for the same
    seed on every device: generated on the CPU, then moved. Another `dtype` is set while the model is built,
    so the rotary module's inverse frequencies stay float32 as transformers computes them
    (`model.to(bfloat16)` would round them to bfloat16)."""
    import torch
    import transformers

    _, model_name, _ = FAMILY_EXTRAS[family]
    config = family_config(family, attn_implementation=attn_implementation, **overrides)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)
    try:
        model = getattr(transformers, model_name)(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device).eval()


def shape_config(name: str, *, tiny: bool = False, attn_implementation: str = "sdpa", **overrides):
    from transformers import LlamaConfig

    params = {**(TINY_SHAPES if tiny else SHAPES)[name], **overrides}
    theta = params.pop("rope_theta")
    config = LlamaConfig(**params, rope_parameters={"rope_type": "default", "rope_theta": theta})
    config._attn_implementation = attn_implementation
    return config


def build_shape(name: str, *, device: str, dtype, tiny: bool = False, seed: int = 0, **overrides):
    """A random-weight model of the shape `name`, built directly on `device` in `dtype` (an 8B model never
    exists in float32 or on the CPU). The rotary module keeps float32 inverse frequencies (transformers
    computes them in float32 explicitly). `overrides` change config fields (the demo grid's model: the
    tokenizer's vocabulary and special tokens, a shorter trained context); those that change no parameter's
    shape (max_position_embeddings, token ids) leave the weights of a seed unchanged."""
    import torch
    from transformers import LlamaForCausalLM

    config = shape_config(name, tiny=tiny, **overrides)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()
