"""Issue 40: `ropebench export` and its parity with ropebench's patch.

The mapping (ropebench.extend.export) is checked against values derived here from the papers' formulas; the
transformers export is loaded by a Python that cannot import ropebench (tests/extend/export_child.py: isolated
mode, no site processing, site-packages without ropebench) and its rotary frequencies, attention scaling,
cos/sin and logits must equal the patched model's bit for bit (fp32), on the tiny model of every tested family
and on the embedded SmolLM2-135M."""

import json
import math
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from ropebench import extend
from ropebench.export_cli import main as export_main
from ropebench.extend import export as engines
from ropebench.extend.export import ExportError

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("export_child.py")
PARTIAL = ("phi", "gpt_neox", "stablelm")  # partial-rotary families (ropebench's temperature: "logits")


def longrope_lists(pairs: int) -> dict:
    return {
        "short_factor": [1.0 + i / (4 * pairs) for i in range(pairs)],
        "long_factor": [1.0 + 3 * i / pairs for i in range(pairs)],
    }


def settings(family: str, pairs: int) -> dict:
    """name -> (method, factor, options) exported for a model with `pairs` rotary pairs."""
    temperature = {"temperature": "rotary"} if family in PARTIAL else {}
    out = {
        "plain": ("plain", 1.0, {}),
        "pi": ("pi", 2.0, {}),
        "ntk": ("ntk", 2.0, {}),
        "dynamic-ntk": ("dynamic-ntk", 2.0, {}),
        "dynamic-ntk-paper": ("dynamic-ntk", 1.0, {"scale_rule": "paper"}),
        "yarn": ("yarn", 2.0, temperature),
        "yarn-attention": ("yarn", 4.0, {"attention_factor": 1.3, "beta_fast": 16.0, **temperature}),
        "ntk-parts": ("ntk-parts", 2.0, {}),
        "llama3": ("llama3", 4.0, {}),
        "longrope": ("longrope", 4.0, {**longrope_lists(pairs), **temperature}),
    }
    if family not in PARTIAL:  # transformers' proportional spans head_dim: refused on partial-rotary models
        out["proportional"] = ("proportional", 2.0, {"partial_rotary_factor": 0.5})
    return out


def admits(family: str, method: str) -> bool:
    """Whether the family's transformers config takes the method's rope type (transformers' Phi3Config takes
    only `default` and `longrope`: its validate_rope)."""
    return family != "phi3" or method in ("plain", "ntk", "longrope")


def export(model_dir, method, factor, options, out, engine="transformers", *extra) -> int:
    argv = [str(model_dir), "--method", method, "--factor", str(factor), "--to", engine, "--out", str(out)]
    for key, value in options.items():
        argv += ["-o", f"{key}={json.dumps(value)}"]
    return export_main([*argv, *extra])


def run_child(jobs: list, tmp: Path) -> dict:
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    spec = {"site_packages": sorted(paths), "checkout": str(ROOT), "jobs": jobs, "out": str(tmp / "child.pt")}
    (tmp / "jobs.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(CHILD), str(tmp / "jobs.json")],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    saved = torch.load(tmp / "child.pt")
    assert saved["ropebench_importable"] is False
    return saved["results"]


def patched_side(model, method, factor, options, prompt, seq_len, layer_types) -> dict:
    """The same quantities as export_child.py, from ropebench's patch."""
    out = {}
    with torch.no_grad(), extend.patched(model, method, factor, **options) as patch:
        out["logits"] = model(torch.tensor([prompt])).logits
        rotary = model.base_model.rotary_emb
        positions = torch.tensor([[0, 1, seq_len - 1]])
        for lt in layer_types:
            cos, sin = rotary(torch.zeros(1, 3, 8), positions, *((lt,) if lt else ()))
            out[lt] = {
                "cos": cos,
                "sin": sin,
                "inv_freq": patch.frequencies(lt, seq_len).inv_freq,
                "scaling": patch.scalings(lt, seq_len)[0],
            }
    return out


# transformers' `dynamic` computes its scale from the length as a float32 tensor, ropebench in float64: equal
# up to float32 rounding of the base (relative 1e-6 on frequencies), not bit for bit
DYNAMIC_TOLERANCE = {"inv_freq": 1e-6, "cos": 1e-5, "sin": 1e-5, "logits": 1e-5}


def close(ours: torch.Tensor, theirs: torch.Tensor, key: str, exact: bool) -> bool:
    if exact:
        return torch.equal(ours, theirs)
    if key == "inv_freq":
        return torch.allclose(ours, theirs, rtol=DYNAMIC_TOLERANCE[key], atol=0)
    return torch.allclose(ours, theirs, rtol=0, atol=DYNAMIC_TOLERANCE[key])


def differences(ours: dict, theirs: dict, layer_types, exact: bool = True) -> list[str]:
    """What differs between the patch and the export: anything not bit-equal (`exact`), else anything beyond
    DYNAMIC_TOLERANCE. Empty when they agree."""
    found = []
    for lt in layer_types:
        for key in ("inv_freq", "cos", "sin"):
            if not close(ours[lt][key], theirs[lt][key], key, exact):
                gap = float((ours[lt][key].double() - theirs[lt][key].double()).abs().max())
                found.append(f"{lt} {key}: max |diff| {gap:.3g}")
        if ours[lt]["scaling"] != theirs[lt]["scaling"]:
            found.append(f"{lt} scaling {ours[lt]['scaling']!r} != {theirs[lt]['scaling']!r}")
    if not close(ours["logits"], theirs["logits"], "logits", exact):
        found.append(f"logits: max |diff| {float((ours['logits'] - theirs['logits']).abs().max()):.3g}")
    return found


# ------------------------------------------------------------------------------------- tiny family models
@pytest.fixture(scope="module")
def family_exports(tmp_path_factory, family_configs, family_model_factory):
    """Every family x setting exported from a saved tiny model, loaded by the ropebench-free child once."""
    tmp = tmp_path_factory.mktemp("export-families")
    models, jobs = {}, []
    for family in family_configs:
        model = family_model_factory(family)
        source = tmp / f"src-{family}"
        model.save_pretrained(source)
        with extend.patched(model, "plain") as patch:
            layer_types = list(patch.layer_types)
            pairs = patch.frequencies(patch.extended_layer_types[0]).inv_freq.numel()
        context = extend.trained_context(model)
        prompt = [(7 * i + 3) % model.config.vocab_size for i in range(context + context // 2)]
        models[family] = (model, layer_types, prompt)
        for name, (method, factor, options) in settings(family, pairs).items():
            out = tmp / f"{family}-{name}"
            if not admits(family, method):
                assert export(source, method, factor, options, out) == 2 and not out.exists(), (family, name)
                continue
            assert export(source, method, factor, options, out) == 0, (family, name)
            jobs.append(
                {
                    "name": f"{family}/{name}",
                    "dir": str(out),
                    "prompt": prompt,
                    "seq_len": 3 * context,
                    "layer_types": layer_types,
                    "attention": model.config._attn_implementation,  # the patched model's, on both sides
                }
            )
    return models, run_child(jobs, tmp)


@pytest.mark.parametrize("family", sorted(extend.TESTED_FAMILIES))
def test_transformers_export_equals_the_patch_on_every_family(family, family_exports):
    models, results = family_exports
    model, layer_types, prompt = models[family]
    pairs = len(results[f"{family}/plain"][layer_types[-1]]["inv_freq"])
    context = extend.trained_context(model)
    found = []
    for name, (method, factor, options) in settings(family, pairs).items():
        if not admits(family, method):
            continue
        ours = patched_side(model, method, factor, options, prompt, 3 * context, layer_types)
        theirs = results[f"{family}/{name}"]
        found += [f"{name}: {d}" for d in differences(ours, theirs, layer_types, method != "dynamic-ntk")]
    assert not found, found


def test_every_family_is_exported():
    from ropebench.benchmarks.tiny_models import FAMILY_EXTRAS

    assert set(FAMILY_EXTRAS) == set(extend.TESTED_FAMILIES)


# ------------------------------------------------------------------------------------- the embedded model
EMBEDDED = {
    "plain": ("plain", 1.0, {}),
    "pi": ("pi", 2.0, {}),
    "ntk": ("ntk", 2.0, {}),
    "dynamic": ("dynamic-ntk", 2.0, {}),
    "yarn": ("yarn", 2.0, {}),
    "ntk-parts": ("ntk-parts", 2.0, {}),
    "llama3": ("llama3", 2.0, {}),
    "longrope": ("longrope", 2.0, longrope_lists(32)),
    "proportional": ("proportional", 2.0, {"partial_rotary_factor": 0.5}),
}
PROMPT = (
    "Mr. Speaker, Mr. Vice President, Members of Congress, my fellow Americans: tonight I want to speak "
    "about the state of our union, about the work we have done together and the work that is left to do."
)


@pytest.fixture(scope="module")
def embedded_exports(tmp_path_factory, smollm2):
    """smollm2-135m exported with each setting through the `ropebench export` command's main."""
    tmp = tmp_path_factory.mktemp("export-smollm2")
    _, tokenizer = smollm2
    prompt = tokenizer(PROMPT)["input_ids"]
    jobs = []
    for name, (method, factor, options) in EMBEDDED.items():
        assert export("smollm2-135m", method, factor, options, tmp / name) == 0, name
        jobs.append(
            {
                "name": name,
                "dir": str(tmp / name),
                "prompt": prompt,
                "seq_len": 12288,
                "layer_types": [None],
                "attention": smollm2[0].config._attn_implementation,
            }
        )
    return prompt, run_child(jobs, tmp), tmp


@pytest.mark.parametrize("name", list(EMBEDDED))
def test_transformers_export_equals_the_patch_on_smollm2(name, embedded_exports, smollm2):
    prompt, results, _ = embedded_exports
    model, _ = smollm2
    method, factor, options = EMBEDDED[name]
    ours = patched_side(model, method, factor, options, prompt, 12288, [None])
    assert differences(ours, results[name], [None], exact=method != "dynamic-ntk") == []


def test_embedded_export_links_the_weights_and_records_the_setting(embedded_exports):
    _, _, tmp = embedded_exports
    folder = tmp / "yarn"
    weights = folder / "model.safetensors"
    assert weights.is_symlink() and weights.resolve().parent.parent.name == "gguf"
    record = json.loads((folder / "ropebench-export.json").read_text())
    assert (record["method"], record["factor"], record["parity"]["status"]) == ("yarn", 2.0, "measured")
    rope = json.loads((folder / "config.json").read_text())["rope_parameters"]
    assert rope == {
        "rope_type": "yarn",
        "rope_theta": 100000.0,
        "factor": 2.0,
        "original_max_position_embeddings": 8192,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }


# ------------------------------------------------------------------------------------- the mapping alone
@pytest.fixture(scope="module")
def smollm2_config():
    return extend.loading.load_config("smollm2-135m")


def test_ntk_is_the_base_the_paper_gives(smollm2_config):
    updates = engines.plan("transformers", "ntk", 4, {}, smollm2_config).config_updates
    assert updates["rope_parameters"] == {"rope_type": "default", "rope_theta": 100000.0 * 4 ** (64 / 62)}
    assert updates["max_position_embeddings"] == 4 * 8192


def test_llama_cpp_flags_for_the_embedded_model(smollm2_config):
    yarn = engines.plan("llama.cpp", "yarn", 4, {}, smollm2_config)
    flags = dict(zip(yarn.flags[::2], yarn.flags[1::2], strict=True))
    assert flags["--rope-scaling"] == "yarn" and float(flags["--rope-scale"]) == 4
    assert int(flags["--yarn-orig-ctx"]) == 8192 and int(flags["-c"]) == 4 * 8192
    # llama.cpp puts YaRN's own 0.1 ln s + 1 on cos/sin: the default needs no attention factor at all
    assert (
        "--yarn-attn-factor" not in flags
        and "--override-kv" not in flags
        and "kv_overrides" not in yarn.kwargs
    )
    assert yarn.kwargs["rope_freq_scale"] == 0.25 and yarn.kwargs["rope_scaling_type"] == 2
    # ntk-parts (attention factor 1) cancels it through the model's rope.scaling.attn_factor, which llama.cpp
    # multiplies in (its --yarn-attn-factor is overwritten while YaRN's ramp is on)
    parts = engines.plan("llama.cpp", "ntk-parts", 4, {}, smollm2_config)
    attn = parts.kwargs["kv_overrides"]["llama.rope.scaling.attn_factor"]
    assert attn * (0.1 * math.log(4) + 1) == pytest.approx(1.0, abs=1e-15)
    assert (
        parts.flags[parts.flags.index("--override-kv") + 1]
        == f"llama.rope.scaling.attn_factor=float:{attn!r}"
    )
    pi = engines.plan("llama.cpp", "pi", 2, {}, smollm2_config)
    assert pi.flags == ["-c", "16384", "--rope-scaling", "linear", "--rope-scale", "2"]
    ntk = engines.plan("llama.cpp", "ntk", 2, {}, smollm2_config)
    assert float(ntk.flags[ntk.flags.index("--rope-freq-base") + 1]) == 100000.0 * 2 ** (64 / 62)


def test_vllm_overrides_are_the_transformers_config(smollm2_config):
    """vLLM applies --hf-overrides to the config transformers reads: the overrides must be the transformers
    export's updates (whose parity is measured above)."""
    for method, factor, options in EMBEDDED.values():
        if method == "dynamic-ntk":
            continue
        tf = engines.plan("transformers", method, factor, options, smollm2_config)
        vllm = engines.plan("vllm", method, factor, options, smollm2_config)
        overrides = json.loads(json.dumps(vllm.hf_overrides))
        overrides.get("rope_parameters", {}).pop("attn_factor", None)  # vLLM's own YaRN key, besides
        assert overrides == tf.config_updates, method
        if tf.config_updates:
            assert vllm.kwargs["max_model_len"] == tf.config_updates["max_position_embeddings"], method


def test_vllm_yarn_attention_factor_in_its_own_key(smollm2_config):
    out = engines.plan("vllm", "yarn", 4, {"attention_factor": 1.3}, smollm2_config)
    params = out.hf_overrides["rope_parameters"]
    assert params["attn_factor"] * (0.1 * math.log(4) + 1) == pytest.approx(1.3, rel=1e-15)


@pytest.mark.parametrize(
    "engine, method, lacks",
    [
        ("transformers", "dynamic-yarn", "no length-dependent YaRN"),
        ("transformers", "xpos", "no xPos"),
        ("vllm", "self-extend", "no Self-Extend"),
        ("llama.cpp", "llama3", "rope_freqs"),
        ("llama.cpp", "dynamic-ntk", "no length-dependent NTK"),
        ("llama.cpp", "longrope", "rope_factors"),
        ("llama.cpp", "dca", "Dual Chunk"),
    ],
)
def test_methods_an_engine_lacks_are_refused(engine, method, lacks, smollm2_config):
    with pytest.raises(ExportError, match=lacks):
        engines.plan(engine, method, 2, {}, smollm2_config)


def test_the_gate_refuses_a_known_difference(smollm2_config, family_configs):
    vllm = engines.plan("vllm", "dynamic-ntk", 2, {}, smollm2_config)
    assert vllm.parity.status == "differs"
    with pytest.raises(ExportError, match="allow-mismatch"):
        engines.gate(vllm, allow_mismatch=False)
    engines.gate(vllm, allow_mismatch=True)
    config_cls, _, extra = family_configs["phi"]
    from ropebench.benchmarks.tiny_models import SMALL_CONFIG

    phi = config_cls(**SMALL_CONFIG, **extra)
    assert engines.plan("transformers", "yarn", 2, {}, phi).parity.status == "differs"
    rotary = engines.plan("transformers", "yarn", 2, {"temperature": "rotary"}, phi)
    assert rotary.parity.status == "measured"
    assert engines.plan("transformers", "ntk-parts", 2, {}, phi).parity.status == "measured"


def test_every_parity_row_names_an_engine_and_a_method():
    for (engine, method), parity in engines.PARITY.items():
        assert engine in engines.ENGINES and method in extend.methods()
        assert parity.status in ("measured", "differs", "not measured") and parity.detail
        assert method not in engines.LACKS[engine]
