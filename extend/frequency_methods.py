"""The built-in frequency methods (the position-remapping ones are in extend/remap.py). Each is one short
function; where transformers implements the method (a rope type of `ROPE_INIT_FUNCTIONS`) we delegate to it,
and write by hand only what it lacks (static NTK-aware scaling, dynamic YaRN, xPos).

A method's docstring opens with a one-line summary, then `Formula:` and `Reference:` lines: the README's and
docs/methods.md's method tables are generated from them (`python -m ropebench.docs --write`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated

import torch
from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .errors import ExtendError
from .method_spec import Range, Rope, RopeBase, register

# Declared option ranges (checked by registry.check_options before any model is touched).
Rotations = Annotated[float, Range(gt=0, why="a number of rotations over the trained context")]
Positive = Annotated[float, Range(gt=0)]
Fraction = Annotated[float, Range(ge=0, le=1, why="the fraction of rotary pairs that keep rotating")]


def transformers_rope(
    rope_type: str, rope: RopeBase, factor: float | None, seq_len: int | None = None, **params
):
    """Call transformers' own rope function on a minimal config carrying the model's base parameters.
    `factor` None: a rope type that declares no factor (`proportional`; transformers warns about one)."""
    original = rope.original_max_position_embeddings
    parameters = {
        "rope_type": rope_type,
        "rope_theta": rope.theta,
        "partial_rotary_factor": rope.partial_rotary_factor,
        **{k: v for k, v in params.items() if v is not None},
    }
    if factor is not None:
        parameters["factor"] = factor
    if rope_type in ("yarn", "longrope", "llama3"):  # the types that read it (others warn about it)
        parameters["original_max_position_embeddings"] = original
    # `dynamic` reads the trained context from max_position_embeddings; the others want it > original.
    stretch = 1.0 if factor is None else factor
    max_positions = original if rope_type == "dynamic" else max(original + 1, math.ceil(original * stretch))
    config = PreTrainedConfig(
        hidden_size=rope.head_dim,
        num_attention_heads=1,
        head_dim=rope.head_dim,
        max_position_embeddings=max_positions,
        rope_parameters=parameters,
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](config, rope.inv_freq.device, seq_len=seq_len)
    return inv_freq.to(torch.float32), float(attention_factor)


def _check_ramp(beta_fast: float, beta_slow: float) -> None:
    """YaRN's ramp runs from beta_slow rotations (interpolated) up to beta_fast (kept): an empty or inverted
    ramp is not the method."""
    if not beta_fast > beta_slow:
        raise ExtendError(
            f"yarn's ramp needs beta_fast > beta_slow, got beta_fast={beta_fast} and "
            f"beta_slow={beta_slow} — e.g. beta_fast=32, beta_slow=1 (the paper's)"
        )


def yarn_on_frequencies(
    rope: RopeBase, factor: float, beta_fast: float, beta_slow: float, attention_factor: float | None
) -> tuple[torch.Tensor, float]:
    """YaRN (paper eq. 17-18) on the frequencies the method starts from when they are not theta's series
    (RopeBase.start: the shipped ones under start_from="shipped", p-RoPE's): pair i turns
    r_i = L theta_i / 2 pi times in the trained context L;
    gamma = clamp((r_i - beta_slow) / (beta_fast - beta_slow), 0, 1);
    theta_i' = (1 - gamma) theta_i / s + gamma theta_i. A stopped pair (theta_i = 0) stays stopped.
    Attention factor 0.1 ln s + 1 (1 at s <= 1) unless given. Computed in float64, returned as float32."""
    theta = rope.inv_freq.double()
    rotations = rope.original_max_position_embeddings * theta / (2 * math.pi)
    gamma = ((rotations - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)
    inv_freq = (1 - gamma) * theta / factor + gamma * theta
    if attention_factor is None:
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq.to(torch.float32), float(attention_factor)


def llama3_on_frequencies(
    rope: RopeBase, factor: float, low_freq_factor: float, high_freq_factor: float
) -> torch.Tensor:
    """Llama 3.1's wavelength bands on the frequencies the method starts from (RopeBase.start), as
    transformers' `llama3` computes them on theta's series (float32): wavelength > L/low_freq_factor:
    theta_i/s; < L/high_freq_factor: theta_i; between: (1 - g) theta_i/s + g theta_i with g = (L/wavelength -
    low_freq_factor) / (high_freq_factor - low_freq_factor). A stopped pair stays stopped."""
    context = rope.original_max_position_embeddings
    inv_freq = rope.inv_freq
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > context / low_freq_factor, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < context / high_freq_factor) * ~(wavelength > context / low_freq_factor)
    return torch.where(medium, smoothed, scaled)


SCALE_RULES = ("paper", "transformers")


def dynamic_scale(factor: float, seq_len: int, original: int, rule: str) -> float:
    """Current scale of the dynamic methods at length L' = seq_len, trained context L = original; 1 up to L.
    "paper": s = max(1, L'/L) (YaRN paper sec. 3.3 and its reference `LlamaDynamicYaRNScaledRotaryEmbedding`;
    `factor` does not enter). "transformers": s = max(1, factor L'/L - (factor - 1)) (emozilla's dynamic NTK
    and transformers' `dynamic` rope type; at factor 1 the two agree)."""
    if rule not in SCALE_RULES:
        raise ExtendError(
            f"scale_rule must be 'paper' (s = L'/L) or 'transformers' (s = factor L'/L - (factor-1)), "
            f"got {rule!r}"
        )
    if rule == "paper":
        return max(1.0, seq_len / original)
    return max(1.0, factor * seq_len / original - (factor - 1))


@register("plain", uses_factor=False, on_frequencies=True)
def plain(rope: RopeBase, *, factor: float):
    """No extension: the model as loaded, bit-identical (the baseline; its shipped RoPE scaling kept).

    Formula: the model as loaded, bit-identical (default `start_from="shipped"`), or the pretrained RoPE with
    `start_from="pretrained"`
    Reference: Su et al. 2021, RoFormer, arXiv:2104.09864

    `factor` is ignored. With start_from="shipped" (default) this is the model as loaded, bit-identical (its
    shipped RoPE scaling kept); with start_from="pretrained" the pretrained RoPE (a model's shipped scaling
    removed)."""
    return rope.inv_freq, 1.0


@register("pi", identity_at_one=True)
def pi(rope: RopeBase, *, factor: float):
    """Position interpolation, m -> m/s.

    Formula: theta_i / s (positions m -> m/s)
    Reference: Chen et al. 2023, arXiv:2306.15595

    Positions m -> m / s, i.e. theta_i' = theta_i / s for every frequency. Delegates to transformers' `linear`
    rope type."""
    return transformers_rope("linear", rope, factor)


@register("ntk", min_factor=1.0, identity_at_one=True)
def ntk(rope: RopeBase, *, factor: float):
    """NTK-aware base scaling.

    Formula: b' = b * s^(d/(d-2))
    Reference: bloc97 2023; YaRN paper eq. 15, arXiv:2309.00071

    theta_i = b'^(-2i/d): high frequencies are kept, the lowest is interpolated by s."""
    base = rope.theta * factor ** (rope.dim / (rope.dim - 2))
    exponents = (
        torch.arange(0, rope.dim, 2, dtype=torch.int64).to(rope.inv_freq.device, torch.float) / rope.dim
    )
    return 1.0 / (base**exponents), 1.0


def _factor_enters(options: dict) -> bool:
    """The dynamic methods' factor enters only the "transformers" rule: with "paper" x2 and x4 are one
    setting."""
    return options["scale_rule"] != "paper"


def _any_length(factor: float, context: int, options: dict) -> float:
    """Dynamic scaling picks s from the current length L' so that s L >= L' (both rules, factor >= 1): no
    length is past what it interpolates to."""
    return math.inf


@register(
    "dynamic-ntk",
    dynamic=True,
    min_factor=1.0,
    uses_factor=_factor_enters,
    reach=_any_length,
    record=("scale_rule",),
)
def dynamic_ntk(
    rope: RopeBase, *, factor: float, seq_len: int | None = None, scale_rule: str = "transformers"
):
    """NTK-aware scaling from the current length, stateless.

    Formula: ntk with s(L') = max(1, s L'/L - (s-1)) from the current length L', stateless (3 at L' = 2L for
    s = 2); `scale_rule="paper"`: max(1, L'/L), `factor` does not enter
    Reference: emozilla 2023 (transformers' `dynamic`); `scale_rule="paper"`: YaRN sec. 3.3

    Dynamic NTK scaling (emozilla 2023, reddit r/LocalLLaMA "Dynamically Scaled RoPE", the rule transformers'
    `dynamic` rope type implements): NTK-aware scaling b' = b * s^(d/(d-2)) with s from the current length
    L', unchanged up to the trained context L. scale_rule="transformers" (default; emozilla's rule):
    s = max(1, factor L'/L - (factor - 1)), e.g. 3 at L' = 2L for factor 2. scale_rule="paper" (YaRN paper
    sec. 3.3, arXiv:2309.00071): s = max(1, L'/L) — `factor` does not enter, so a sweep runs it once, at 1.
    The rule is recorded in the patch's options. Stateless: computed from the current forward's length only
    (or the length fixed by extend.fixed_length). Delegates to transformers' `dynamic`."""
    scale = dynamic_scale(factor, seq_len or 0, rope.original_max_position_embeddings, scale_rule)
    if scale == 1.0:
        return rope.inv_freq, 1.0
    # transformers' formula with factor 1 is the paper's rule
    return transformers_rope(
        "dynamic", rope, factor if scale_rule == "transformers" else 1.0, seq_len=seq_len
    )


@register("ntk-parts", min_factor=1.0, identity_at_one=True, on_frequencies=True)
def ntk_parts(rope: RopeBase, *, factor: float, beta_fast: Rotations = 32.0, beta_slow: Rotations = 1.0):
    """NTK-by-parts, no temperature.

    Formula: per pair: theta_i/s where wavelength > L/beta_slow, theta_i where < L/beta_fast, ramp between;
    no temperature
    Reference: YaRN paper eq. 17-18 (bloc97 2023)

    Per dimension, interpolate by s where the wavelength is long (fewer than beta_slow rotations in L), keep
    where short (more than beta_fast rotations), linear ramp between. No attention temperature: `yarn` with
    attention_factor 1 (its ramp on shipped frequencies included)."""
    inv_freq, _ = yarn(rope, factor=factor, beta_fast=beta_fast, beta_slow=beta_slow, attention_factor=1.0)
    return inv_freq, 1.0


@register("yarn", min_factor=1.0, identity_at_one=True, on_frequencies=True)
def yarn(
    rope: RopeBase,
    *,
    factor: float,
    beta_fast: Rotations = 32.0,
    beta_slow: Rotations = 1.0,
    attention_factor: Positive | None = None,
):
    """NTK-by-parts + attention temperature.

    Formula: ntk-parts (beta_fast 32, beta_slow 1) and cos/sin scaled by 0.1 ln s + 1 (`attention_factor`
    None; a number replaces it)
    Reference: Peng et al. 2023, arXiv:2309.00071

    NTK-by-parts frequencies (ramp between beta_fast=32 and beta_slow=1 rotations) and attention temperature
    sqrt(1/t) = 0.1 ln s + 1 applied to cos/sin. Delegates to transformers' `yarn`. On frequencies other
    than theta's series (the shipped ones a method starts from under start_from="shipped", e.g. Llama 3.1's
    llama3 x8; p-RoPE's) the ramp counts their rotations,
    eq. 17-18 as written: gamma = clamp((r - beta_slow) / (beta_fast - beta_slow), 0, 1) with
    r = L / wavelength (`yarn_on_frequencies`; transformers' ramp runs over pair indices between the bounds
    rounded to whole pairs, which only theta's series has)."""
    _check_ramp(beta_fast, beta_slow)
    if rope.start is not None:
        return yarn_on_frequencies(rope, factor, beta_fast, beta_slow, attention_factor)
    return transformers_rope(
        "yarn", rope, factor, beta_fast=beta_fast, beta_slow=beta_slow, attention_factor=attention_factor
    )


@register(
    "dynamic-yarn",
    dynamic=True,
    min_factor=1.0,
    uses_factor=_factor_enters,
    reach=_any_length,
    record=("scale_rule",),
    on_frequencies=True,
)
def dynamic_yarn(
    rope: RopeBase,
    *,
    factor: float,
    seq_len: int | None = None,
    beta_fast: Rotations = 32.0,
    beta_slow: Rotations = 1.0,
    scale_rule: str = "paper",
):
    """YaRN from the current length (`factor` does not enter: runs once).

    Formula: yarn with s(L') = max(1, L'/L) (`factor` does not enter: a sweep runs it once, at 1);
    `scale_rule="transformers"`: max(1, s L'/L - (s-1))
    Reference: YaRN paper sec. 3.3

    Dynamic YaRN (Peng et al. 2023, arXiv:2309.00071 sec. 3.3, reference code
    `LlamaDynamicYaRNScaledRotaryEmbedding`): YaRN (frequencies and temperature) with the
    scale taken from the current length L': scale_rule="paper" (default) s = max(1, L'/L) — `factor` does not
    enter, so a sweep runs it once, at factor 1; scale_rule="transformers" s = max(1, factor L'/L -
    (factor - 1)) (emozilla's dynamic-ntk rule, as in transformers' `dynamic`). Unchanged up to the trained
    context L. The rule is recorded in the patch's options."""
    _check_ramp(beta_fast, beta_slow)
    scale = dynamic_scale(factor, seq_len or 0, rope.original_max_position_embeddings, scale_rule)
    if scale == 1.0:
        return rope.inv_freq, 1.0
    return yarn(rope, factor=scale, beta_fast=beta_fast, beta_slow=beta_slow)


@register("llama3", min_factor=1.0, identity_at_one=True, on_frequencies=True)
def llama3(
    rope: RopeBase, *, factor: float, low_freq_factor: Positive = 1.0, high_freq_factor: Positive = 4.0
):
    """Llama 3.1 wavelength-band scaling.

    Formula: wavelength > L/low_freq_factor: theta_i/s; < L/high_freq_factor: theta_i; smooth between
    Reference: Meta 2024, Llama 3.1

    Wavelengths longer than L/low_freq_factor are divided by s, shorter than L/high_freq_factor kept, smooth
    interpolation between. Delegates to transformers' `llama3`; on frequencies other than theta's series
    (the shipped ones under start_from="shipped", p-RoPE's) the bands are the same formula on their
    wavelengths (`llama3_on_frequencies`)."""
    if not high_freq_factor > low_freq_factor > 0:
        raise ExtendError(
            f"llama3 needs high_freq_factor > low_freq_factor > 0, got {high_freq_factor} and "
            f"{low_freq_factor} — e.g. low_freq_factor=1, high_freq_factor=4"
        )
    if rope.start is not None:
        return llama3_on_frequencies(rope, factor, low_freq_factor, high_freq_factor), 1.0
    return transformers_rope(
        "llama3", rope, factor, low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor
    )


@register("longrope", dynamic=True, min_factor=1.0)
def longrope(
    rope: RopeBase,
    *,
    factor: float,
    short_factor,
    long_factor,
    attention_factor: Positive | None = None,
    seq_len: int | None = None,
):
    """Per-pair rescale factors (user lists).

    Formula: theta_i / lambda_i with user `short_factor` (L' <= L) / `long_factor` lists (one value per rotary
    pair); attention sqrt(1 + ln s / ln L)
    Reference: Ding et al. 2024, arXiv:2402.13753

    LongRoPE: per-dimension rescale factors lambda_i, theta_i' = theta_i / lambda_i, `short_factor` up to the
    trained context and `long_factor` beyond; attention factor sqrt(1 + ln s / ln L). Delegates to
    transformers' `longrope`."""
    for name, values in (("short_factor", short_factor), ("long_factor", long_factor)):
        if not isinstance(values, (list, tuple)) or len(values) != rope.dim // 2:
            raise ExtendError(
                f"longrope {name} must be a list of {rope.dim // 2} numbers (one per rotary pair "
                f"of this model), got {_describe_list(values)}"
            )
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values):
            raise ExtendError(f"longrope {name} must hold finite numbers > 0 — check the values you passed")
    return transformers_rope(
        "longrope",
        rope,
        factor,
        seq_len=seq_len,
        short_factor=list(short_factor),
        long_factor=list(long_factor),
        attention_factor=attention_factor,
    )


@register("xpos")
def xpos(
    rope: RopeBase,
    *,
    factor: float,
    gamma: Positive = 0.4,
    scale_base: Positive = 512.0,
    centre: float | None = None,
):
    """RoPE with an exponential decay on q and k.

    Formula: RoPE on m/s, q scaled by zeta_i^(m/(s sb)), k by zeta_i^(-n/(s sb)),
    zeta_i = (2i/d + gamma)/(1 + gamma), sb = `scale_base`; `centre` None: automatic
    Reference: Sun et al. 2022, arXiv:2212.10554

    xPos: RoPE times an exponential decay per rotary pair, zeta_i = (2i/d + gamma) / (1 + gamma); q at
    position m is scaled by zeta^(+m/scale_base) and k at n by zeta^(-n/scale_base), so q.k decays as
    zeta^((m-n)/scale_base). `factor` interpolates positions as in `pi` (for both the rotation and the
    decay). Exponents use (position - centre), which cancels in q.k but keeps values finite: by default the
    centre is the middle of the positions being run (of the whole call under extend.fixed_length; kept for
    cached continuations), and a span too wide for float32/bf16 raises ExtendError naming the widest one (see
    extend/xpos.py); `centre` fixes it instead."""
    if not gamma > 0 or not scale_base > 0:
        raise ExtendError(
            f"xpos needs gamma > 0 and scale_base > 0, got gamma={gamma}, scale_base={scale_base}"
        )
    zeta = (
        torch.arange(0, rope.dim, 2, dtype=torch.float32, device=rope.inv_freq.device) / rope.dim + gamma
    ) / (1 + gamma)
    centre = None if centre is None else float(centre)
    return Rope(rope.inv_freq / factor, 1.0, zeta, float(scale_base) * factor, centre)


def _describe_list(values) -> str:
    if isinstance(values, (list, tuple)):
        return f"{len(values)} values"
    return f"{type(values).__name__} {values!r}"[:60]


@register("proportional", on_frequencies=True)
def proportional(rope: RopeBase, *, factor: float, partial_rotary_factor: Fraction = 1.0):
    """p-RoPE: only the fastest-turning fraction p of the rotary pairs turns (at theta_i / s), the rest stop.

    Formula: theta_i / s for the first floor(p d/2) pairs (the highest frequencies), 0 (no rotation) for the
    others; p = `partial_rotary_factor`
    Reference: Barbero et al. 2024, arXiv:2410.06205 (transformers' `proportional`)

    p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings useful?", ICLR
    2025, sec. 6): trained models use the highest frequencies for positional attention patterns and the lowest
    as semantic channels, which rotation makes unreliable over long contexts; p-RoPE stops rotating the lowest
    (those dims become NoPE) and keeps the model's own frequencies on the rest. p counts the model's rotary
    pairs (on a partial-rotary model, those of its rotary dims) as transformers' `proportional` rope type
    counts head_dim's: floor(p d/2) pairs rotate. Gemma 4 ships p = 0.25 on its global layers. `factor` s is
    transformers' (5.x): every rotating pair's frequency is divided by s, i.e. position interpolation (`pi`)
    on the pairs that still rotate, so p-RoPE with a factor is p-RoPE of a model whose positions are m/s; the
    stopped pairs stay stopped. p = 1 (the default, transformers' too) at factor 1 is the model's RoPE,
    bit-identical; p = 1 at factor s is `pi`. Delegates to transformers' `proportional` where transformers has
    it; on frequencies other than theta's series (a shipped scaling under start_from="shipped") the first
    floor(p d/2) of them rotate, divided by s."""
    kept = int(partial_rotary_factor * rope.dim // 2)  # transformers' count: int(p * head_dim // 2)
    if kept == rope.dim // 2 and factor == 1.0:
        return rope.inv_freq, 1.0  # every pair rotates at factor 1: the model's own tensor
    if rope.start is None and "proportional" in ROPE_INIT_FUNCTIONS:
        # transformers' head_dim is the model's rotary dim here, so the kept pairs are the model's frequencies
        on_rotary_dims = dataclasses.replace(rope, head_dim=rope.dim)
        inv_freq, _ = transformers_rope(
            "proportional", on_rotary_dims, None, partial_rotary_factor=partial_rotary_factor
        )
        # transformers' last step, `inv_freq /= factor` (float32): done here, as its config validation warns
        # about a `factor` this type does not declare
        return inv_freq / factor, 1.0
    # the start frequencies (shipped ones), or a transformers without `proportional` (added for Gemma 4)
    inv_freq = rope.inv_freq.clone()
    inv_freq[kept:] = 0.0
    inv_freq /= factor
    return inv_freq, 1.0
