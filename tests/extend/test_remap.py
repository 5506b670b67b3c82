"""Position-remapping methods (Self-Extend, ReRoPE, DCA) on tiny random models of every tested family: plain
RoPE within the window, and beyond it the logits of an independent naive implementation — the full score
matrix in float64 from the papers' relative positions, with the group size G and the slope k derived here from
the papers' definitions — in prefill and cached generation; blockwise tiling, GQA, left padding, sliding
windows, undo, registry and errors."""

import dataclasses
import math

import pytest
import torch
import transformers as T
from ropebench import extend
from ropebench.benchmarks.tiny_models import SMALL_CONFIG as SMALL
from ropebench.extend import remap_attention
from ropebench.extend.forward import with_cache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

FAMILIES = {  # published configs' RoPE layout, shrunk: Mistral v0.2+ has no sliding window
    "llama": (T.LlamaConfig, T.LlamaForCausalLM, {}),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, {}),
    "mistral": (T.MistralConfig, T.MistralForCausalLM, {"sliding_window": None}),
    "gemma3_text": (
        T.Gemma3TextConfig,
        T.Gemma3ForCausalLM,
        {"head_dim": 16, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16},
    ),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM, {"bos_token_id": 0, "eos_token_id": 0}),  # 25% rotary
}
OTHER_FAMILIES = {  # the rest of extend.TESTED_FAMILIES (and Mistral v0.1's sliding window, shrunk)
    "mistral-v0.1": (T.MistralConfig, T.MistralForCausalLM, {"sliding_window": 32}),
    "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, {"head_dim": 16}),
    "gemma": (T.GemmaConfig, T.GemmaForCausalLM, {"head_dim": 16}),
    # published Gemma2 soft-caps its logits (refused at patch time, below); without the cap it runs,
    # windows kept
    "gemma2": (
        T.Gemma2Config,
        T.Gemma2ForCausalLM,
        {"head_dim": 16, "attn_logit_softcapping": None, "sliding_window": 32},
    ),
    "phi": (T.PhiConfig, T.PhiForCausalLM, {}),  # 50% rotary, sliced in the attention module
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM, {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    "olmo2": (T.Olmo2Config, T.Olmo2ForCausalLM, {}),
    "olmo3": (
        T.Olmo3Config,
        T.Olmo3ForCausalLM,
        {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16},
    ),
    "stablelm": (
        T.StableLmConfig,
        T.StableLmForCausalLM,
        {"bos_token_id": 0, "eos_token_id": 0},
    ),  # 25%, sliced
    "cohere": (
        T.CohereConfig,
        T.CohereForCausalLM,
        {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "logit_scale": 1.0},
    ),  # 0.0625 shrinks what is compared
}
CONTEXT = 64  # SMALL's max_position_embeddings: the trained context c every case derives from
CASES = {  # (method, options)
    "self-extend": ("self-extend", {"factor": 2.0, "window": 8}),
    "self-extend-group": ("self-extend", {"window": 12, "group": 5}),
    "self-extend-defaults": ("self-extend", {"factor": 3.0}),
    "leaky-rerope": ("rerope", {"factor": 3.0, "window": 8}),
    "rerope": ("rerope", {"window": 10, "leaky": False}),
    "dca": ("dca", {"chunk_size": 24, "local_window": 4}),
    "dca-pi": ("dca", {"factor": 2.0, "chunk_size": 24, "local_window": 6}),
    "dca-defaults": ("dca", {}),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread avoids OpenMP barrier waits on a busy machine (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(name, seed=0, attn="sdpa"):
    config_cls, model_cls, extra = {**FAMILIES, **OTHER_FAMILIES}[name]
    torch.manual_seed(seed)
    config = config_cls(**SMALL, **extra)
    config._attn_implementation = "eager" if name == "gemma2" else attn  # Gemma2 has no sdpa path
    return model_cls(config).eval()


def token_ids(n, batch=1, seed=1):
    return torch.randint(3, 128, (batch, n), generator=torch.Generator().manual_seed(seed))


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits


# ---- the independent reference: relative positions straight from the papers, full float64 attention ----


def self_extend_group(options, context=CONTEXT):
    """Self-Extend's group size G (Jin et al. 2024): given, or the smallest G whose grouped relative positions
    for s x c tokens stay within the pretrained ones (<= c - 1) — found by trying G = 1, 2, ... on the paper's
    own position matrix. The paper's reach (c - w) G + w (sec. 3) says the same when G divides w."""
    if options.get("group"):
        return options["group"]
    target = math.ceil(options.get("factor", 1.0) * context)
    for g in range(1, target + 1):
        rel = paper_relative("self-extend", dict(options, group=g), target, context)
        if rel.tril().max() <= context - 1:  # pairs j <= i
            return g
    raise AssertionError("no group size")


def leaky_rerope_k(options, context=CONTEXT):
    """Leaky ReRoPE's slope 1/k beyond the window (Su 2023, kexue.fm/archives/9708: w + (d - w) / k), with k
    such that the largest relative position of s x c tokens, s c - 1, lands on the largest trained one,
    c - 1."""
    w, s = options.get("window", context // 8), options.get("factor", 1.0)
    return (s * context - 1 - w) / (context - 1 - w)


def paper_relative(method, options, n, context=CONTEXT):
    """rel[i, j] for positions 0..n-1, written from the papers' definitions (not from extend.remap's pieces);
    G, k and the defaults (window c/8; DCA: chunk 3c/4, local window c/16) derived here from `options` as
    given (the method's documented defaults), never read from the patch."""
    i = torch.arange(n, dtype=torch.float64)[:, None]
    j = torch.arange(n, dtype=torch.float64)[None, :]
    d = i - j
    if (
        method == "self-extend"
    ):  # Jin et al. 2024: neighbour window, then floor(pos / G) shifted by W - W // G
        w = options.get("window", context // 8)
        g = options["group"] if options.get("group") else self_extend_group(options, context)
        return torch.where(d < w, d, torch.floor(i / g) - torch.floor(j / g) + w - w // g)
    if method == "rerope":  # Su 2023: min(d, w); leaky: w + (d - w) / k
        w = options.get("window", context // 8)
        k = leaky_rerope_k(options, context) if options.get("leaky", True) else None  # None: clipped
        return torch.where(d < w, d, w + (0.0 if k is None else (d - w) / k))
    # An et al. 2024 (ChunkLlama): chunks of s = chunk_size - local_window, keys at j mod s
    size, local = options.get("chunk_size", context * 3 // 4), options.get("local_window", context // 16)
    s = size - local
    chunk_i, chunk_j = torch.floor(i / s), torch.floor(j / s)
    key = j - chunk_j * s
    within = i - chunk_i * s
    intra = within - key
    successive = torch.clamp(within + s, max=size) - key
    inter = min(2 * s - 1, size) - key
    rel = torch.where(chunk_i == chunk_j, intra, torch.where(chunk_i - chunk_j == 1, successive, inter))
    return rel / options.get("factor", 1.0)


def plain_relative(n):
    i = torch.arange(n, dtype=torch.float64)
    return i[:, None] - i[None, :]


def rotate_half64(x, angle):
    """Half-layout RoPE of the first 2 * angle.shape[-1] dims of x by `angle` (float64)."""
    dims = 2 * angle.shape[-1]
    rot, rest = x[..., :dims], x[..., dims:]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    x1, x2 = rot[..., : dims // 2], rot[..., dims // 2 :]
    return torch.cat([rot * cos + torch.cat([-x2, x1], -1) * sin, rest], -1)


def rotate_interleaved64(x, angle):
    """Interleaved-pair RoPE (Cohere: pair i is dims 2i, 2i + 1) of x by `angle` (float64)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = angle.cos(), angle.sin()
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)


class Naive:
    """Registered as an attention implementation: un-rotates q and k from their plain positions, then builds
    the full score matrix with every pair rotated by its paper relative position (extended layers) or its
    plain distance (layers left alone: Gemma3's and OLMo3's sliding ones), in float64; a layer's sliding
    window masks keys at distance >= window either way, as transformers' sliding mask does."""

    def __init__(self, model, rel, extended=None):
        self.rel = rel  # (n, n) float64 relative positions for the longest sequence used
        self.extended = extended  # layer types remapped; None: every layer
        rotary = model.base_model.rotary_emb
        self.rotary = getattr(rotary, "rotary", rotary)  # the model's own module, also under a patch
        self.rotate = rotate_interleaved64 if model.config.model_type == "cohere" else rotate_half64

    def layer_type(self, module):
        types = getattr(module.config, "layer_types", None)
        return types[module.layer_idx] if types else None

    def inv_freq(self, module):
        per_type = getattr(self.rotary, f"{self.layer_type(module)}_inv_freq", None)  # Gemma3, OLMo3
        return (per_type if per_type is not None else self.rotary.inv_freq).float()

    def __call__(self, module, q, k, v, mask, scaling=None, dropout=0.0, **kwargs):
        inv = self.inv_freq(module)
        kv, n_q = k.shape[2], q.shape[2]
        pos = torch.arange(kv, dtype=torch.float32)
        plain = (pos[:, None] * inv[None, :]).double()  # the model's own float32 angles, undone in float64
        q0 = self.rotate(q.double(), -plain[kv - n_q :])
        k0 = self.rotate(k.double(), -plain)
        window = kwargs.get("sliding_window")
        remapped = self.extended is None or self.layer_type(module) in self.extended
        rel = self.rel[kv - n_q : kv, :kv] if remapped else (pos[kv - n_q :, None] - pos[None, :]).double()
        groups = q.shape[1] // k.shape[1]
        k0, v0 = k0.repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
        scores = torch.empty(q.shape[0], q.shape[1], n_q, kv, dtype=torch.float64)
        for r in range(n_q):
            qr = self.rotate(
                q0[:, :, r : r + 1].expand(-1, -1, kv, -1), rel[r][:, None] * inv.double()[None, :]
            )
            scores[:, :, r] = (qr * k0).sum(-1) * scaling
        i = torch.arange(kv - n_q, kv)[:, None]
        allowed = torch.arange(kv)[None, :] <= i
        if window is not None:
            allowed &= torch.arange(kv)[None, :] > i - window
        scores = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        return (scores @ v0).to(q.dtype).transpose(1, 2).contiguous(), None


AttentionMaskInterface.register("naive_remap_test", sdpa_mask)  # the attention function is set per model


def naive_logits(model, ids, rel, extended=None, **kwargs):
    AttentionInterface.register("naive_remap_test", Naive(model, rel, extended))
    saved = model.config._attn_implementation
    model.config._attn_implementation = "naive_remap_test"
    try:
        return logits(model, ids, **kwargs)
    finally:
        model.config._attn_implementation = saved


def generate_steps(model, ids, prompt, step=1):
    """Logits of a cached run: the prompt in one forward, then `step` tokens at a time (1: generation; more: a
    prompt continued on a cached prefix, as extend.prefix_cache runs it)."""
    with torch.no_grad():
        out = model(ids[:, :prompt], use_cache=True)
        past, steps = out.past_key_values, [out.logits]
        for t in range(prompt, ids.shape[1], step):
            out = model(ids[:, t : t + step], use_cache=True, **with_cache(model, past))
            past = out.past_key_values
            steps.append(out.logits)
    return torch.cat(steps, 1)


# ---- tests ----


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_beyond_window_matches_naive_prefill_and_generation(family, case, monkeypatch):
    method, options = CASES[case]
    model = build(family)
    n = 150
    ids = token_ids(n)
    with extend.patched(model, method, **options) as handle:
        extended = handle.options.get("layer_types")
        want = naive_logits(model, ids, paper_relative(method, options, n), extended)
        plain = naive_logits(model, ids, plain_relative(n))
        assert (want - plain).abs().max() > 1e-3  # the reference really differs from plain RoPE here
        for block, lengths in ((7, (97, n)), (512, (n,))):  # tiles cut the keys differently
            monkeypatch.setattr(remap_attention, "QUERY_BLOCK", block)
            for length in lengths:  # the reference is causal: its prefixes are the shorter references
                torch.testing.assert_close(
                    logits(model, ids[:, :length]),
                    want[:, :length],
                    atol=2e-5,
                    rtol=0,
                    msg=f"{family}/{case} at {length} tokens, block {block}",
                )
        monkeypatch.setattr(remap_attention, "QUERY_BLOCK", 32)
        torch.testing.assert_close(
            generate_steps(model, ids, 90), want, atol=2e-5, rtol=0, msg=f"{family}/{case}: cached generation"
        )
        torch.testing.assert_close(
            generate_steps(model, ids, 90, step=13),
            want,
            atol=2e-5,
            rtol=0,
            msg=f"{family}/{case}: continued on a cache in blocks",
        )
    assert model.config._attn_implementation == "sdpa"


OTHER_CASES = ["self-extend", "leaky-rerope", "dca-pi"]  # one case per method on the other families


@pytest.mark.parametrize("family", sorted(OTHER_FAMILIES))
@pytest.mark.parametrize("case", OTHER_CASES)
def test_every_tested_family_beyond_window_matches_naive(family, case, monkeypatch):
    """The rest of extend.TESTED_FAMILIES (partial rotary sliced in the attention module: Phi, StableLM;
    interleaved pairs: Cohere; q/k norms: Qwen3, OLMo2/3; sliding windows: Mistral v0.1, Gemma2, OLMo3):
    past the window, prefill and cached generation equal the float64 reference."""
    method, options = CASES[case]
    model = build(family)
    n = 120
    ids = token_ids(n)
    monkeypatch.setattr(remap_attention, "QUERY_BLOCK", 32)
    with extend.patched(model, method, **options) as handle:
        want = naive_logits(model, ids, paper_relative(method, options, n), handle.options.get("layer_types"))
        assert (
            want - naive_logits(model, ids, plain_relative(n))
        ).abs().max() > 1e-4  # 5x atol: not plain RoPE
        torch.testing.assert_close(logits(model, ids), want, atol=2e-5, rtol=0, msg=f"{family}/{case}")
        torch.testing.assert_close(
            generate_steps(model, ids, 90, step=7), want, atol=2e-5, rtol=0, msg=f"{family}/{case}: cached"
        )


def test_every_tested_family_is_covered():
    built = {build(name).config.model_type for name in {**FAMILIES, **OTHER_FAMILIES}}
    assert built == set(extend.TESTED_FAMILIES)


@pytest.mark.parametrize(
    "case, options, group",
    [
        ("factor 2, window 8", {"factor": 2.0, "window": 8}, 3),  # (64 - 8) G + 8 >= 128
        ("factor 4, window 8", {"factor": 4.0, "window": 8}, 5),  # (64 - 8) G + 8 >= 256
        ("factor 3, window 16", {"factor": 3.0, "window": 16}, 4),  # (64 - 16) G + 16 >= 192, G | 16
    ],
)
def test_self_extend_group_is_the_papers(case, options, group):
    """G from Jin et al. 2024's reach, (c - w) G + w >= s c with G minimal, in cases where G divides w or the
    floor does not bite — where the paper's closed form and the brute force on its positions agree."""
    w, target = options["window"], options["factor"] * CONTEXT
    assert group == math.ceil((target - w) / (CONTEXT - w)) == self_extend_group(options)
    with extend.patched(build("llama"), "self-extend", **options) as handle:
        assert handle.options["group"] == group


def test_leaky_rerope_k_maps_the_target_length_onto_the_trained_context():
    """Leaky ReRoPE's relative positions for s x c tokens end at c - 1 exactly: the largest one, s c - 1,
    is w + (s c - 1 - w) / k (Su 2023) with k from that condition."""
    rel = paper_relative("rerope", {"factor": 3.0, "window": 8}, 3 * CONTEXT)
    assert abs(float(rel.tril().max()) - (CONTEXT - 1)) < 1e-9
    assert leaky_rerope_k({"factor": 3.0, "window": 8}) == (3 * 64 - 1 - 8) / (64 - 1 - 8)


def test_remap_extends_from_the_shipped_rope_by_default():
    """A model that ships scaling (llama3 x2 from 32 tokens, max_position_embeddings 64): by default the remap
    keeps the shipped frequencies and derives G from the shipped context 64; start_from="pretrained" restarts
    from the unscaled RoPE and the pretraining context 32."""
    torch.manual_seed(0)
    shipped = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 2.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    model = T.LlamaForCausalLM(T.LlamaConfig(**SMALL, rope_parameters=shipped)).eval()
    model.config._attn_implementation = "sdpa"
    own = model.base_model.rotary_emb.inv_freq.clone()
    ids, options = token_ids(120), {"factor": 2.0, "window": 8}
    with extend.patched(model, "self-extend", **options) as handle:
        assert handle.options["trained_context"] == 64 and handle.options["start_from"] == "shipped"
        assert torch.equal(model.base_model.rotary_emb.rotary.inv_freq, own)
        want = naive_logits(model, ids, paper_relative("self-extend", options, 120, context=64))
        torch.testing.assert_close(logits(model, ids), want, atol=2e-5, rtol=0)
    with extend.patched(model, "self-extend", start_from="pretrained", **options) as handle:
        assert handle.options["trained_context"] == 32
        assert handle.options["group"] == self_extend_group(options, context=32)
        assert not torch.allclose(model.base_model.rotary_emb.rotary.inv_freq, own)


def test_published_gemma2_soft_cap_is_refused_at_patch_time():
    torch.manual_seed(0)
    gemma2 = T.Gemma2ForCausalLM(T.Gemma2Config(**SMALL, head_dim=16)).eval()  # attn_logit_softcapping 50
    for method, options in (
        ("self-extend", {"factor": 2.0, "window": 8}),
        ("rerope", {"factor": 2.0}),
        ("dca", {}),
    ):
        with pytest.raises(extend.ExtendError, match="soft-capped"):
            extend.patch(gemma2, method, **options)
        assert extend.current(gemma2) is None and gemma2.config._attn_implementation == "eager"
    with extend.patched(gemma2, "rerope", factor=1.0):  # factor 1: plain RoPE, nothing to refuse
        pass


WITHIN = {  # windows wider than the 30 tokens run
    "self-extend": {"factor": 2.0, "window": 32},
    "rerope": {"factor": 2.0, "window": 32},
    "rerope-clip": {"window": 32, "leaky": False},
    "dca": {"chunk_size": 48, "local_window": 8},
}


@pytest.mark.parametrize("family", sorted({**FAMILIES, **OTHER_FAMILIES}))
def test_within_window_is_plain(family):
    model = build(family)
    ids = token_ids(30, batch=2)
    plain = logits(model, ids)
    for name, options in WITHIN.items():
        with extend.patched(model, name.split("-clip")[0], **options):
            # exact: the model's own attention runs (every pair is at a plain position)
            assert torch.equal(logits(model, ids), plain), f"{family}/{name} within its window"
            # the blockwise path, forced, agrees within float32 rounding
            state = next(iter(remap_attention._STATE.values()))
            state.remap = dataclasses.replace(state.remap, plain_within=0)
            torch.testing.assert_close(logits(model, ids), plain, atol=1e-5, rtol=0)
        assert torch.equal(logits(model, ids), plain)


def test_factor_one_is_plain_at_every_length():
    model = build("llama")
    ids = token_ids(200)
    plain = logits(model, ids)
    for method, options in [("self-extend", {"window": 8}), ("rerope", {"window": 8})]:
        with extend.patched(model, method, factor=1.0, **options) as handle:
            assert torch.equal(logits(model, ids), plain), method
        assert handle.options.get("group", 1) == 1 and handle.options.get("k", 1.0) == 1.0


def test_not_length_dependent_prefixes_agree():
    """Positions depend on (i, j) only: a prefix of a long forward equals the short forward."""
    model = build("qwen2")
    ids = token_ids(160)
    for method, options in CASES.values():
        with extend.patched(model, method, **options) as handle:
            assert not handle.length_dependent and not extend.length_dependent(model)
            long, short = logits(model, ids), logits(model, ids[:, :111])
        torch.testing.assert_close(long[:, :111], short, atol=1e-5, rtol=0)


def test_left_padded_batch_matches_single_rows():
    model = build("llama")
    a, b = token_ids(120, seed=2)[0], token_ids(100, seed=3)[0]
    ids = torch.stack([a, torch.cat([torch.zeros(20, dtype=torch.long), b])])
    mask = torch.stack(
        [torch.ones(120, dtype=torch.long), torch.cat([torch.zeros(20), torch.ones(100)]).long()]
    )
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with extend.patched(model, "self-extend", factor=2.0, window=8):
        batch = logits(model, ids, attention_mask=mask, position_ids=positions)
        row_a, row_b = logits(model, a[None]), logits(model, b[None])
    torch.testing.assert_close(batch[0], row_a[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(batch[1, 20:], row_b[0], atol=1e-5, rtol=0)


def test_eager_attention_and_undo():
    model = build("llama", attn="eager")
    ids = token_ids(100)
    ref = logits(model, ids)
    with extend.patched(model, "dca", chunk_size=24, local_window=4) as handle:
        assert extend.current(model) is handle and handle.method == "dca"
        out = logits(model, ids)
        rel = paper_relative("dca", {"chunk_size": 24, "local_window": 4}, 100)
        torch.testing.assert_close(out, naive_logits(model, ids, rel), atol=2e-5, rtol=0)
    assert model.config._attn_implementation == "eager" and extend.current(model) is None
    assert torch.equal(logits(model, ids), ref)


def test_two_models_are_independent():
    a, b = build("llama"), build("llama")
    ids = token_ids(100)
    ref = logits(b, ids)
    with extend.patched(a, "rerope", window=8, leaky=False):
        assert torch.equal(logits(b, ids), ref)
        assert not torch.allclose(logits(a, ids), ref)


def test_registry_and_user_remap_method():
    names = extend.methods()
    for name in ("self-extend", "rerope", "dca"):
        info = extend.describe(name)
        assert name in names and info["remap"] and not info["dynamic"] and info["min_factor"] == 1.0
        assert "arXiv" in info["doc"] or "Su 2023" in info["doc"]
    assert extend.describe("self-extend")["options"]["window"] is None  # default: trained context / 8

    @extend.register("clip-test", remap=True)
    def clip(rope, *, factor, window: int = 8):
        """Test method: ReRoPE with its window halved."""
        return extend.remap.rerope(rope, factor=factor, window=window // 2, leaky=False)

    try:
        model = build("llama")
        ids = token_ids(80)
        with extend.patched(model, "clip-test", window=16):
            a = logits(model, ids)
        with extend.patched(model, "rerope", window=8, leaky=False):
            b = logits(model, ids)
        assert torch.equal(a, b)
    finally:
        extend.registry._REGISTRY.pop("clip-test", None)


@pytest.mark.parametrize(
    "method, options, message",
    [
        ("self-extend", {"factor": 2.0, "group": 4}, "not both"),
        ("self-extend", {"window": 64}, "window must be"),
        ("rerope", {"factor": 2.0, "leaky": False}, "no scale"),
        ("dca", {"chunk_size": 24, "local_window": 24}, "local_window"),
        ("dca", {"chunk_size": 0}, "chunk_size( of method 'dca')? must be"),
        ("rerope", {"temperature": "logits"}, "temperature"),
        ("self-extend", {"factor": 0.5}, "only extends"),
    ],
)
def test_bad_options_raise_one_clear_error(method, options, message):
    model = build("llama")
    with pytest.raises(extend.ExtendError, match=message):
        extend.patch(model, method, **options)
    assert extend.current(model) is None and model.config._attn_implementation == "sdpa"


def test_unsupported_setups_raise():
    model = build("llama")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(extend.ExtendError, match="attn_implementation"):
        extend.patch(model, "dca")


def test_generate_agrees_with_the_naive_reference():
    """model.generate (cache, position_ids, masks from transformers) under the patch: every greedy token is
    the argmax of the naive reference on the same sequence."""
    model = build("llama")
    prompt = token_ids(100)
    with extend.patched(model, "self-extend", factor=2.0, window=8), torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
        seq = out.sequences
        want = naive_logits(
            model, seq, paper_relative("self-extend", {"factor": 2.0, "window": 8}, seq.shape[1])
        )
    scores = torch.stack(out.scores, 1)  # (1, new, vocab)
    torch.testing.assert_close(scores, want[:, 99:-1], atol=2e-5, rtol=0)
