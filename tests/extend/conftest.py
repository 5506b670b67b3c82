"""Fixtures of the tests of extend/ (methods, patching, families, loading)."""

import pytest
import torch
import transformers as T
from ropebench.benchmarks.tiny_models import FAMILY_EXTRAS, SMALL_CONFIG

# Per tested family: its config and model classes and what the family needs besides (head_dim, layer types,
# special token ids): benchmarks/tiny_models.py's table, from which the GPU check builds the same models.
FAMILY_CONFIGS = {
    family: (getattr(T, config), getattr(T, model), extra)
    for family, (config, model, extra) in FAMILY_EXTRAS.items()
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
