"""Position-remapping methods (Self-Extend, ReRoPE, DCA) on tiny random models of five families: plain RoPE
within the window, and beyond it the logits of an independent naive implementation — the full score matrix in
float64 from the papers' relative positions — in prefill and cached generation; blockwise tiling, GQA,
left padding, undo, registry and errors."""

import dataclasses

import pytest
import torch
import transformers as T
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

import extend
from extend import remap_attention

SMALL = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
FAMILIES = {  # published configs' RoPE layout, shrunk: Mistral v0.2+ has no sliding window
    "llama": (T.LlamaConfig, T.LlamaForCausalLM, {}),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, {}),
    "mistral": (T.MistralConfig, T.MistralForCausalLM, {"sliding_window": None}),
    "gemma3_text": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
                    {"head_dim": 16, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16}),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM, {"bos_token_id": 0, "eos_token_id": 0}),  # 25% rotary
}
CASES = {  # (method, options); trained context 64
    "self-extend": ("self-extend", {"factor": 2.0, "window": 8}),
    "self-extend-group": ("self-extend", {"window": 12, "group": 5}),
    "leaky-rerope": ("rerope", {"factor": 3.0, "window": 8}),
    "rerope": ("rerope", {"window": 10, "leaky": False}),
    "dca": ("dca", {"chunk_size": 24, "local_window": 4}),
    "dca-pi": ("dca", {"factor": 2.0, "chunk_size": 24, "local_window": 6}),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread avoids OpenMP barrier waits on a busy machine (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(name, seed=0, attn="sdpa"):
    config_cls, model_cls, extra = FAMILIES[name]
    torch.manual_seed(seed)
    config = config_cls(**SMALL, **extra)
    config._attn_implementation = attn
    return model_cls(config).eval()


def token_ids(n, batch=1, seed=1):
    return torch.randint(3, 128, (batch, n), generator=torch.Generator().manual_seed(seed))


def logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits


# ---- the independent reference: relative positions straight from the papers, full float64 attention ----

def paper_relative(method, resolved, n, factor=1.0):
    """rel[i, j] for positions 0..n-1, written from the papers' definitions (not from extend.remap's pieces)."""
    i = torch.arange(n, dtype=torch.float64)[:, None]
    j = torch.arange(n, dtype=torch.float64)[None, :]
    d = i - j
    if method == "self-extend":  # Jin et al. 2024: neighbour window, then floor(pos / G) shifted by W - W // G
        w, g = resolved["window"], resolved["group"]
        return torch.where(d < w, d, torch.floor(i / g) - torch.floor(j / g) + w - w // g)
    if method == "rerope":  # Su 2023: min(d, w); leaky: w + (d - w) / k
        w, k = resolved["window"], resolved.get("k")  # no k: ReRoPE proper (leaky=False)
        return torch.where(d < w, d, w + (0.0 if k is None else (d - w) / k))
    # An et al. 2024 (ChunkLlama): chunks of s = chunk_size - local_window, keys at j mod s
    size, local = resolved["chunk_size"], resolved["local_window"]
    s = size - local
    chunk_i, chunk_j = torch.floor(i / s), torch.floor(j / s)
    key = j - chunk_j * s
    within = i - chunk_i * s
    intra = within - key
    successive = torch.clamp(within + s, max=size) - key
    inter = min(2 * s - 1, size) - key
    rel = torch.where(chunk_i == chunk_j, intra, torch.where(chunk_i - chunk_j == 1, successive, inter))
    return rel / factor


def rotate_half64(x, angle):
    """Half-layout RoPE of the first 2 * angle.shape[-1] dims of x by `angle` (float64)."""
    dims = 2 * angle.shape[-1]
    rot, rest = x[..., :dims], x[..., dims:]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    x1, x2 = rot[..., :dims // 2], rot[..., dims // 2:]
    return torch.cat([rot * cos + torch.cat([-x2, x1], -1) * sin, rest], -1)


class Naive:
    """Registered as an attention implementation: un-rotates q and k from their plain positions, then builds
    the full score matrix with every pair rotated by its paper relative position (global layers) or its plain
    distance (sliding layers), in float64."""

    def __init__(self, model, rel):
        self.rel = rel  # (n, n) float64 relative positions for the longest sequence used
        rotary = model.base_model.rotary_emb
        self.rotary = getattr(rotary, "rotary", rotary)  # the model's own module, also under a patch

    def inv_freq(self, module):
        lt = getattr(module, "layer_type", None)
        per_type = getattr(self.rotary, f"{lt}_inv_freq", None)  # Gemma3; Qwen2 names layer types too
        return (per_type if per_type is not None else self.rotary.inv_freq).float()

    def __call__(self, module, q, k, v, mask, scaling=None, dropout=0.0, **kwargs):
        inv = self.inv_freq(module)
        kv, n_q = k.shape[2], q.shape[2]
        pos = torch.arange(kv, dtype=torch.float32)
        plain = (pos[:, None] * inv[None, :]).double()  # the model's own float32 angles, undone in float64
        q0 = rotate_half64(q.double(), -plain[kv - n_q:])
        k0 = rotate_half64(k.double(), -plain)
        window = kwargs.get("sliding_window")
        rel = self.rel[kv - n_q:kv, :kv] if window is None else (pos[kv - n_q:, None] - pos[None, :]).double()
        groups = q.shape[1] // k.shape[1]
        k0, v0 = k0.repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
        scores = torch.empty(q.shape[0], q.shape[1], n_q, kv, dtype=torch.float64)
        for r in range(n_q):
            qr = rotate_half64(q0[:, :, r:r + 1].expand(-1, -1, kv, -1), rel[r][:, None] * inv.double()[None, :])
            scores[:, :, r] = (qr * k0).sum(-1) * scaling
        i = torch.arange(kv - n_q, kv)[:, None]
        allowed = torch.arange(kv)[None, :] <= i
        if window is not None:
            allowed &= torch.arange(kv)[None, :] > i - window
        scores = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        return (scores @ v0).to(q.dtype).transpose(1, 2).contiguous(), None


AttentionMaskInterface.register("naive_remap_test", sdpa_mask)  # the attention function is set per model


def naive_logits(model, ids, rel, **kwargs):
    AttentionInterface.register("naive_remap_test", Naive(model, rel))
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
            out = model(ids[:, t:t + step], past_key_values=past, use_cache=True)
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
        want = naive_logits(model, ids, paper_relative(method, handle.options, n, handle.factor))
        plain = naive_logits(model, ids, paper_relative("rerope", {"window": n, "k": 1.0}, n))
        assert (want - plain).abs().max() > 1e-3  # the reference really differs from plain RoPE here
        for block, lengths in ((7, (97, n)), (512, (n,))):  # tiles cut the keys differently
            monkeypatch.setattr(remap_attention, "QUERY_BLOCK", block)
            for length in lengths:  # the reference is causal: its prefixes are the shorter references
                torch.testing.assert_close(logits(model, ids[:, :length]), want[:, :length], atol=2e-5, rtol=0,
                                           msg=f"{family}/{case} at {length} tokens, block {block}")
        monkeypatch.setattr(remap_attention, "QUERY_BLOCK", 32)
        torch.testing.assert_close(generate_steps(model, ids, 90), want, atol=2e-5, rtol=0,
                                   msg=f"{family}/{case}: cached generation")
        torch.testing.assert_close(generate_steps(model, ids, 90, step=13), want, atol=2e-5, rtol=0,
                                   msg=f"{family}/{case}: continued on a cache in blocks")
    assert model.config._attn_implementation == "sdpa"


WITHIN = {  # windows wider than the 30 tokens run
    "self-extend": {"factor": 2.0, "window": 32}, "rerope": {"factor": 2.0, "window": 32},
    "rerope-clip": {"window": 32, "leaky": False}, "dca": {"chunk_size": 48, "local_window": 8},
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
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
    mask = torch.stack([torch.ones(120, dtype=torch.long), torch.cat([torch.zeros(20), torch.ones(100)]).long()])
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
        rel = paper_relative("dca", handle.options, 100)
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


@pytest.mark.parametrize("method, options, message", [
    ("self-extend", {"factor": 2.0, "group": 4}, "not both"),
    ("self-extend", {"window": 64}, "window must be"),
    ("rerope", {"factor": 2.0, "leaky": False}, "no scale"),
    ("dca", {"chunk_size": 24, "local_window": 24}, "local_window"),
    ("dca", {"chunk_size": 0}, "chunk_size must be"),
    ("rerope", {"temperature": "logits"}, "temperature"),
    ("self-extend", {"factor": 0.5}, "only extends"),
])
def test_bad_options_raise_one_clear_error(method, options, message):
    model = build("llama")
    with pytest.raises(extend.ExtendError, match=message):
        extend.patch(model, method, **options)
    assert extend.current(model) is None and model.config._attn_implementation == "sdpa"


def test_unsupported_setups_raise():
    torch.manual_seed(0)
    gemma2 = T.Gemma2ForCausalLM(T.Gemma2Config(**SMALL, head_dim=16)).eval()
    gemma2.config._attn_implementation = "eager"  # sdpa cannot soft-cap
    with extend.patched(gemma2, "rerope", window=8, factor=2.0):  # within the window it is the model's own
        logits(gemma2, token_ids(8))
        with pytest.raises(extend.ExtendError, match="soft-capped"):
            logits(gemma2, token_ids(40))
    model = build("llama")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(extend.ExtendError, match="attn_implementation"):
        extend.patch(model, "dca")
    sliding = build("mistral")
    sliding.config.sliding_window = 32
    with extend.patched(sliding, "rerope", factor=2.0, window=8), pytest.raises(extend.ExtendError, match="sliding"):
        logits(sliding, token_ids(40))


def test_generate_agrees_with_the_naive_reference():
    """model.generate (cache, position_ids, masks from transformers) under the patch: every greedy token is the
    argmax of the naive reference on the same sequence."""
    model = build("llama")
    prompt = token_ids(100)
    with extend.patched(model, "self-extend", factor=2.0, window=8) as handle, torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        seq = out.sequences
        want = naive_logits(model, seq, paper_relative("self-extend", handle.options, seq.shape[1]))
    scores = torch.stack(out.scores, 1)  # (1, new, vocab)
    torch.testing.assert_close(scores, want[:, 99:-1], atol=2e-5, rtol=0)
