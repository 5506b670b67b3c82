"""Every method against an independent float64 reference written from its paper's equations, and against
transformers' own rope types where they exist. Positions up to 32768, factors 1, 2, 4, 8."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from ropebench import extend
from ropebench.extend.frequency_methods import transformers_rope
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

THETA, HEAD_DIM, L = 1e5, 64, 8192  # SmolLM2-135M's RoPE
FACTORS = [1.0, 2.0, 4.0, 8.0]
POSITIONS = torch.arange(0, 32768, 7, dtype=torch.long)
D = HEAD_DIM
PAIR = torch.arange(0, D // 2, dtype=torch.float64)  # rotary pair index i


def base_inv_freq():
    return THETA ** (-2 * PAIR / D)  # theta_i = b^(-2i/d)  (Su et al. 2021)


# ---- references from the papers (float64) ----
def ref_pi(s):  # Chen et al. 2023: f(x, m) = f(x, m / s)
    return base_inv_freq() / s, 1.0


def ref_ntk(s):  # b' = b * s^(d/(d-2))
    return (THETA * s ** (D / (D - 2))) ** (-2 * PAIR / D), 1.0


def dynamic_scale(s, seq_len, rule):
    """paper (YaRN sec. 3.3): max(1, L'/L); transformers/emozilla: max(1, s L'/L - (s - 1))."""
    return max(1.0, seq_len / L) if rule == "paper" else max(1.0, s * seq_len / L - (s - 1))


def ref_dynamic_ntk(s, seq_len, rule="transformers"):
    scale = dynamic_scale(s, seq_len, rule)
    return ref_ntk(scale) if scale > 1 else (base_inv_freq(), 1.0)


def yarn_ramp(beta_fast=32.0, beta_slow=1.0):
    """YaRN eq. 17-18 as the authors' reference code defines it: gamma ramps linearly over the dimension
    index between the dims where the wavelength makes beta_fast resp. beta_slow rotations in L (rounded
    outward); gamma = 1 keeps theta_i (extrapolate), gamma = 0 interpolates by s."""

    def dim_for_rotations(r):  # solve L / lambda_d = r for d, with lambda_d = 2 pi b^(2d/D)
        return D * math.log(L / (r * 2 * math.pi)) / (2 * math.log(THETA))

    low = max(math.floor(dim_for_rotations(beta_fast)), 0)
    high = min(math.ceil(dim_for_rotations(beta_slow)), D - 1)
    ramp = ((PAIR - low) / (high - low)).clamp(0, 1)  # 0 at high frequency, 1 at low frequency
    return 1 - ramp


def ref_yarn(s, temperature=True):
    gamma = yarn_ramp()
    theta = base_inv_freq()
    h = (1 - gamma) * theta / s + gamma * theta
    return h, (0.1 * math.log(s) + 1 if temperature and s > 1 else 1.0)


def ref_dynamic_yarn(s, seq_len, rule="paper"):
    scale = dynamic_scale(s, seq_len, rule)
    return ref_yarn(scale) if scale > 1 else (base_inv_freq(), 1.0)


def ref_llama3(s, low=1.0, high=4.0):  # Meta Llama 3.1 apply_scaling
    theta = base_inv_freq()
    wavelen = 2 * math.pi / theta
    smooth = (L / wavelen - low) / (high - low)
    out = torch.where(wavelen > L / low, theta / s, theta)
    mid = (wavelen >= L / high) & (wavelen <= L / low)
    return torch.where(mid, (1 - smooth) * theta / s + smooth * theta, out), 1.0


SHORT = [1.0 + 0.01 * i for i in range(D // 2)]
LONG = [1.0 + 0.2 * i for i in range(D // 2)]


def ref_longrope(s, seq_len):  # Ding et al. 2024: theta_i / lambda_i; attention sqrt(1 + ln s / ln L)
    lam = torch.tensor(LONG if seq_len > L else SHORT, dtype=torch.float64)
    return base_inv_freq() / lam, (math.sqrt(1 + math.log(s) / math.log(L)) if s > 1 else 1.0)


def model():
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=L,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
    )
    return LlamaForCausalLM(config).eval()


MODEL = model()


def patched_cos_sin(method, factor, positions, **options):
    with extend.patched(MODEL, method, factor=factor, **options):
        rotary = MODEL.base_model.rotary_emb
        x = torch.zeros(1, dtype=torch.float32)
        cos, sin = rotary(x, positions[None])
        inv_freq = rotary.rotary.inv_freq.clone()
        attention = rotary.rotary.attention_scaling
    return cos[0].double(), sin[0].double(), inv_freq.double(), attention


def assert_close_rope(cos, sin, ref_cos, ref_sin, angle):
    """cos/sin within 1e-6 plus the float32 rounding of the angle m * theta_i (relative 2^-24, twice): that
    phase error is inherent to any float32 RoPE, so no implementation can do better at 32k positions."""
    phase = 2.0**-22 * angle.abs()
    for ours, ref in ((cos, ref_cos), (sin, ref_sin)):
        err = (ours.double() - ref.double()).abs()
        assert (err <= 1e-6 + phase).all(), f"max error {err.max():.3g}"


def assert_matches(method, factor, ref, positions=POSITIONS, **options):
    ref_inv, ref_att = ref
    cos, sin, inv, att = patched_cos_sin(method, factor, positions, **options)
    torch.testing.assert_close(inv, ref_inv, rtol=1e-6, atol=0)
    assert abs(att - ref_att) <= 1e-6
    angle = positions.double()[:, None] * ref_inv
    ref_cos = torch.cat([angle.cos(), angle.cos()], -1) * ref_att
    ref_sin = torch.cat([angle.sin(), angle.sin()], -1) * ref_att
    assert_close_rope(cos, sin, ref_cos, ref_sin, torch.cat([angle, angle], -1) * ref_att)


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize(
    "method,ref",
    [
        ("pi", ref_pi),
        ("ntk", ref_ntk),
        ("yarn", ref_yarn),
        ("ntk-parts", lambda s: ref_yarn(s, temperature=False)),
        ("llama3", ref_llama3),
    ],
)
def test_static_methods_match_paper(method, ref, factor):
    assert_matches(method, factor, ref(factor))


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("seq_len", [4096, 8192, 12000, 32768])
@pytest.mark.parametrize("method,ref", [("dynamic-ntk", ref_dynamic_ntk), ("dynamic-yarn", ref_dynamic_yarn)])
def test_dynamic_methods_use_current_length(method, ref, factor, seq_len):
    positions = torch.arange(seq_len)[:: max(1, seq_len // 4096)]
    positions[-1] = seq_len - 1  # the forward's length is max(position) + 1
    assert_matches(method, factor, ref(factor, seq_len), positions=positions)
    other = "paper" if method == "dynamic-ntk" else "transformers"  # the non-default rule, by name
    assert_matches(method, factor, ref(factor, seq_len, other), positions=positions, scale_rule=other)


def test_dynamic_yarn_default_is_the_papers_rule():
    """At factor 2 and L' = 2L the paper's s = L'/L is 2 (transformers' rule would give 3)."""
    base = extend.patching.rope_bases(MODEL, MODEL.base_model.rotary_emb)[None]
    method = extend.registry.get("dynamic-yarn")
    paper = method(base, 2.0, seq_len=2 * L)
    torch.testing.assert_close(paper.inv_freq.double(), ref_yarn(2.0)[0], rtol=1e-6, atol=0)
    rule = method(base, 2.0, seq_len=2 * L, scale_rule="transformers")
    torch.testing.assert_close(rule.inv_freq.double(), ref_yarn(3.0)[0], rtol=1e-6, atol=0)
    with pytest.raises(extend.ExtendError, match="scale_rule must be"):
        extend.patch(MODEL, "dynamic-ntk", factor=2.0, scale_rule="emozilla")


@pytest.mark.parametrize("method,rule", [("dynamic-ntk", "paper"), ("dynamic-yarn", "paper")])
def test_a_dynamic_rule_without_factor_gives_one_setting(method, rule):
    """Under the paper's rule s = L'/L the factor does not enter: x2 and x4 are bit-identical (float32 RoPE),
    so the registry says the factor does not apply (a sweep runs it once), and the reach is not factor x L."""
    positions = torch.arange(0, 4 * L, 5)
    x2, x4 = (patched_cos_sin(method, f, positions, scale_rule=rule)[:2] for f in (2.0, 4.0))
    assert all(torch.equal(a, b) for a, b in zip(x2, x4))
    spec = extend.registry.get(method)
    assert not spec.factor_applies({"scale_rule": rule}) and spec.factor_applies(
        {"scale_rule": "transformers"}
    )
    assert spec.reach(2.0, L, {"scale_rule": rule}) == math.inf  # s L >= L' at every length L'


def test_dynamic_rules_in_use_give_different_settings():
    """The "transformers" (emozilla) rule s = f L'/L - (f - 1) depends on the factor: x2 and x4 differ."""
    positions = torch.arange(0, 4 * L, 5)
    for method in ("dynamic-ntk", "dynamic-yarn"):
        cos2, cos4 = (patched_cos_sin(method, f, positions, scale_rule="transformers")[0] for f in (2.0, 4.0))
        assert not torch.equal(cos2, cos4), method


def test_dynamic_defaults_agree_with_docs_and_are_recorded():
    """dynamic-ntk defaults to emozilla's rule (s = 3 at L' = 2L for factor 2; README and docs/methods.md cite
    it), dynamic-yarn to the paper's (s = 2): describe(), the docs' rows and every patch's options agree."""
    root = Path(__file__).resolve().parents[2]
    readme, methods_doc = (root / "README.md").read_text(), (root / "docs" / "methods.md").read_text()
    expected = {"dynamic-ntk": ("transformers", "emozilla"), "dynamic-yarn": ("paper", "YaRN paper sec. 3.3")}
    for method, (rule, source) in expected.items():
        assert extend.describe(method)["options"]["scale_rule"] == rule
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{method}` |"))
        assert row.split("|")[3].strip().startswith(source), row  # the default's source is cited first
        other = "paper" if rule == "transformers" else "transformers"
        cited = row.split("|")[3].replace(source, "")
        assert "YaRN" not in cited or f'scale_rule="{other}"' in cited, (
            row
        )  # the other rule's source: by name
        doc_row = next(line for line in methods_doc.splitlines() if line.startswith(f"| `{method}` |"))
        assert f'`scale_rule` (string; default "{rule}")' in doc_row, doc_row  # generated: scripts/docs.py
        assert doc_row.split("|")[5].strip().startswith(source), doc_row
        with extend.patched(MODEL, method, factor=2.0) as handle:
            assert handle.options["scale_rule"] == rule  # recorded although not given
    base = extend.patching.rope_bases(MODEL, MODEL.base_model.rotary_emb)[None]
    ntk = extend.registry.get("dynamic-ntk")(base, 2.0, seq_len=2 * L)
    torch.testing.assert_close(ntk.inv_freq.double(), ref_ntk(3.0)[0], rtol=1e-6, atol=0)


def test_sweep_collapses_a_factor_that_changes_nothing_with_one_line(capsys):
    """A sweep over factors 2 and 4 runs dynamic-yarn (paper rule) once, at factor 1, and says so in one line;
    dynamic-ntk (emozilla's rule, the factor enters) keeps both."""
    from ropebench.sweep_lib import checks

    cfg = {
        "methods": [
            {"method": m, "options": dict(o), "factors": [2.0, 4.0]}
            for m, o in [
                ("plain", {}),
                ("dynamic-yarn", {}),
                ("dynamic-ntk", {}),
                ("dynamic-ntk", {"scale_rule": "paper"}),
            ]
        ]
    }
    checks.check_methods(cfg)
    assert [m["factors"] for m in cfg["methods"]] == [[1.0], [1.0], [2.0, 4.0], [1.0]]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "dynamic-yarn[scale_rule=paper] (given x2, x4)" in lines[0], lines
    assert "dynamic-ntk[scale_rule=paper]" in lines[0] and "plain" not in lines[0]  # plain's is documented


def _unpatched_at_one(name: str) -> bool:
    """Registry facts: identity_at_one, or a dynamic frequency method without required options (unchanged up
    to the trained context). longrope needs its per-pair lists, which are not the identity."""
    spec = extend.registry.get(name)
    return spec.identity_at_one or (spec.dynamic and not spec.remap and not extend.describe(name)["required"])


@pytest.mark.parametrize("method", sorted(m for m in extend.methods() if _unpatched_at_one(m)))
def test_formula_at_factor_one_is_the_unpatched_rope(method):
    """The method's own formula (not a short-cut) at factor 1 — within the trained context for the dynamic
    ones — gives the model's frequencies and no temperature; patching then uses the model's tensor."""
    base = extend.patching.rope_bases(MODEL, MODEL.base_model.rotary_emb)[None]
    for seq_len in (None, L // 2, L):
        rope = extend.registry.get(method)(base, 1.0, seq_len=seq_len)
        torch.testing.assert_close(rope.inv_freq.double(), base_inv_freq(), rtol=1e-6, atol=0)
        assert rope.attention_factor == 1.0


IDENTITY_AT_ONE = sorted(m for m in extend.methods() if extend.registry.get(m).identity_at_one)


@pytest.mark.parametrize("method", IDENTITY_AT_ONE)
def test_patch_at_factor_one_runs_the_formula(method, monkeypatch):
    """extend.patch at factor 1 calls the method's function (it does not skip to the model's tensor), and a
    formula that does not reduce to the unpatched RoPE at factor 1 is refused."""
    spec = extend.registry.get(method)
    calls = []

    def counted(rope, **kw):
        calls.append(kw["factor"])
        return spec.fn(rope, **kw)

    monkeypatch.setitem(extend.registry._REGISTRY, method, dataclasses.replace(spec, fn=counted))
    with extend.patched(MODEL, method, factor=1.0):
        pass
    assert calls == [1.0]

    def off_by_a_percent(rope, **kw):
        inv_freq, attention = spec.fn(rope, **kw)[:2]
        return inv_freq * 1.01, attention

    monkeypatch.setitem(extend.registry._REGISTRY, method, dataclasses.replace(spec, fn=off_by_a_percent))
    with pytest.raises(extend.ExtendError, match="does not reduce to the unpatched RoPE"):
        extend.patch(MODEL, method, factor=1.0)
    assert extend.current(MODEL) is None


def test_dynamic_formulas_at_scale_one_are_the_unpatched_rope():
    """dynamic-ntk and dynamic-yarn return the model's frequencies while the current scale is 1 (up to the
    trained context); the formulas they delegate to give the same at scale 1, so that shortcut changes no
    value."""
    base = extend.patching.rope_bases(MODEL, MODEL.base_model.rotary_emb)[None]
    for rope_type in ("dynamic", "yarn"):
        inv_freq, attention = transformers_rope(rope_type, base, 1.0, seq_len=L)
        torch.testing.assert_close(inv_freq.double(), base_inv_freq(), rtol=1e-6, atol=0)
        assert attention == 1.0


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("seq_len", [8192, 32768])
def test_longrope_matches_paper(factor, seq_len):
    positions = torch.arange(seq_len)[::5]
    positions[-1] = seq_len - 1
    assert_matches(
        "longrope",
        factor,
        ref_longrope(factor, seq_len),
        positions=positions,
        short_factor=SHORT,
        long_factor=LONG,
    )


def test_dynamic_is_stateless():
    """transformers' dynamic_rope_update reuses 16k frequencies for a later 12k call; ours must not."""
    with extend.patched(MODEL, "dynamic-ntk", factor=2.0):
        rotary = MODEL.base_model.rotary_emb
        x = torch.zeros(1)
        rotary(x, torch.arange(16384)[None])
        cos_after, _ = rotary(x, torch.arange(12288)[None])
        fresh_cos, _ = rotary(x, torch.arange(12288)[None])
    ref_inv, _ = ref_dynamic_ntk(2.0, 12288)
    angle = torch.arange(12288).double()[:, None] * ref_inv
    torch.testing.assert_close(cos_after[0].double()[:, : D // 2], angle.cos(), atol=5e-3, rtol=0)
    assert torch.equal(cos_after, fresh_cos)


# ---- against transformers' own rope types ----
HF_TYPES = {
    "pi": ("linear", {}),
    "yarn": ("yarn", {"original_max_position_embeddings": L}),
    "llama3": (
        "llama3",
        {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": L},
    ),
}


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("method", sorted(HF_TYPES))
def test_static_methods_match_transformers(method, factor):
    rope_type, extra = HF_TYPES[method]
    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        max_position_embeddings=int(L * factor) + 1,
        rope_parameters={"rope_type": rope_type, "rope_theta": THETA, "factor": factor, **extra},
    )
    hf = LlamaRotaryEmbedding(config)
    hf_cos, hf_sin = hf(torch.zeros(1), POSITIONS[None])
    cos, sin, inv, att = patched_cos_sin(method, factor, POSITIONS)
    torch.testing.assert_close(inv.float(), hf.inv_freq, rtol=1e-6, atol=0)
    assert abs(att - hf.attention_scaling) <= 1e-6
    angle = POSITIONS.double()[:, None] * torch.cat([inv, inv])[None] * att
    assert_close_rope(cos, sin, hf_cos[0], hf_sin[0], angle)


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("seq_len", [4096, 16384, 32768])
def test_dynamic_ntk_matches_transformers_first_call(factor, seq_len):
    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        max_position_embeddings=L,
        rope_parameters={"rope_type": "dynamic", "rope_theta": THETA, "factor": factor},
    )
    hf = LlamaRotaryEmbedding(config)  # fresh module: its history-dependent cache is empty
    positions = torch.arange(seq_len)[None]
    hf_cos, hf_sin = hf(torch.zeros(1), positions)
    cos, sin, inv, att = patched_cos_sin("dynamic-ntk", factor, positions[0])
    angle = positions[0].double()[:, None] * torch.cat([inv, inv])[None] * att
    assert_close_rope(cos, sin, hf_cos[0], hf_sin[0], angle)


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("seq_len", [4096, 16384])
def test_longrope_matches_transformers(factor, seq_len):
    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        max_position_embeddings=int(L * factor) + 1,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": THETA,
            "factor": factor,
            "short_factor": SHORT,
            "long_factor": LONG,
            "original_max_position_embeddings": L,
        },
    )
    hf = LlamaRotaryEmbedding(config)
    positions = torch.arange(seq_len)[None]
    hf_cos, hf_sin = hf(torch.zeros(1), positions)
    cos, sin, inv, att = patched_cos_sin(
        "longrope", factor, positions[0], short_factor=SHORT, long_factor=LONG
    )
    angle = positions[0].double()[:, None] * torch.cat([inv, inv])[None] * att
    assert_close_rope(cos, sin, hf_cos[0], hf_sin[0], angle)


# ---- xPos ----
def ref_xpos_qk(q, k, positions, factor, gamma=0.4, scale_base=512.0):
    """Sun et al. 2022: q_m -> R(m) q_m zeta^(m/sb), k_n -> R(n) k_n zeta^(-n/sb); with `factor`,
    positions are interpolated (m / s) for both rotation and decay."""
    theta = base_inv_freq()
    zeta = (2 * PAIR / D + gamma) / (1 + gamma)
    m = positions.double()[:, None] / factor
    angle = m * theta
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)

    def rotate(x):
        return x * cos + torch.cat([-x[..., D // 2 :], x[..., : D // 2]], -1) * sin

    decay = torch.cat([zeta, zeta]) ** (m / scale_base)
    return rotate(q) * decay, rotate(k) / decay


@pytest.mark.parametrize("factor", [1.0, 2.0])
def test_xpos_scores_match_paper(factor):
    """q.k for every (m, n) pair: the centre cancels and only R(n - m) zeta^((m - n)/sb) remains. Positions
    stay small here so float32 phase rounding is negligible; large positions are checked by norms below."""
    import transformers.models.llama.modeling_llama as llama

    positions = torch.tensor([0, 1, 7, 100, 200, 255])
    torch.manual_seed(0)
    q, k = (
        torch.randn(len(positions), D, dtype=torch.float64),
        torch.randn(len(positions), D, dtype=torch.float64),
    )
    with extend.patched(MODEL, "xpos", factor=factor):
        cos, sin = MODEL.base_model.rotary_emb(torch.zeros(1), positions[None])
        q_out, k_out = llama.apply_rotary_pos_emb(q[None, None].float(), k[None, None].float(), cos, sin)
    ref_q, ref_k = ref_xpos_qk(q, k, positions, factor)
    torch.testing.assert_close(
        q_out[0, 0].double() @ k_out[0, 0].double().T, ref_q @ ref_k.T, rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("factor", [1.0, 2.0])
def test_xpos_decay_per_pair_up_to_32k(factor):
    """Rotation keeps each pair's norm, so |pair_i| after xPos = |pair_i| * zeta_i^(+-(m - c)/(s * sb))."""
    import transformers.models.llama.modeling_llama as llama

    # one forward spans at most 32695 positions at factor 1 (every q.k finite, masked pairs included;
    # extend/xpos.py)
    positions = torch.tensor([0, 4095, 8192, 16384, 32000])
    q = torch.ones(len(positions), D)
    with extend.patched(MODEL, "xpos", factor=factor):
        cos, sin = MODEL.base_model.rotary_emb(torch.zeros(1), positions[None])
        q_out, k_out = llama.apply_rotary_pos_emb(q[None, None], q[None, None], cos, sin)
    zeta = (2 * PAIR / D + 0.4) / 1.4
    centre = (0 + 32000) / 2  # default centre: the middle of the positions being run
    exponent = (positions.double()[:, None] - centre) / (512.0 * factor)
    half = D // 2

    def pair_norms(x):
        x = x[0, 0].double()
        return (x[:, :half] ** 2 + x[:, half:] ** 2).sqrt()

    torch.testing.assert_close(pair_norms(q_out), math.sqrt(2) * zeta**exponent, rtol=1e-5, atol=0)
    torch.testing.assert_close(pair_norms(k_out), math.sqrt(2) * zeta**-exponent, rtol=1e-5, atol=0)
