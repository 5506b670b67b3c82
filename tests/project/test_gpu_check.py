"""The GPU check's CPU mode (`ropebench bench gpu --cpu-sizes`, as CI runs it; its demo grid is in
test_gpu_check_demo_grid.py), the remap attention's math path that CUDA takes, and the wheel list for the GPU
machine (benchmarks/wheels.py) against the image."""

import ast
import importlib.metadata
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from ropebench import extend
from ropebench.benchmarks import gpu_check, tiny_models, wheels
from ropebench.extend import remap_attention

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("extend", "tasks", "results")


def test_cpu_mode_runs_every_section_and_writes_its_report(tmp_path):
    # the demo grid has its own module (test_gpu_check_demo_grid.py): xdist runs a module whole on one worker,
    # so the two long runs go to the two workers
    assert gpu_check.main(["--cpu-sizes", "--out", str(tmp_path), "--skip", "demo-grid"]) == 0
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    report = (tmp_path / "report.md").read_text()
    for heading in ("## GEMM rate", "## Correctness", "## Long context", "## Remap methods' cost"):
        assert heading in report
    rows = data["correctness"]
    assert {r["method"] for r in rows} >= set(extend.methods())
    judged = {r["check"] for r in rows if r["ok"] is not None}
    assert judged >= {
        "factor 1 = unpatched",
        "device = CPU (fp32)",
        "inv_freq on device, float32",
        "undo restores exactly",
        "remap = float64 reference",
        "generate = full forward",
    }
    assert not [r for r in rows if r["ok"] is False]
    long = data["long_context"]
    assert {r["shape"] for r in long} == set(tiny_models.SHAPES)
    assert all(r["ropebench_s"] > 0 and r["labels_s"] > 0 and r["flops"] > 0 for r in long)
    assert [r["method"] for r in data["remap_cost"]] == ["plain", *gpu_check.REMAP_METHODS]
    assert data["gemm"]["bfloat16"]["flops_per_second"] > 0


def test_the_tiny_families_are_the_tested_families():
    assert set(tiny_models.FAMILY_EXTRAS) == set(extend.TESTED_FAMILIES)


@pytest.mark.parametrize("causal", [True, False])
def test_remap_math_path_equals_the_cpu_flash_kernel(causal):
    """CUDA has no `_scaled_dot_product_flash_attention_for_cpu`: the remap attention takes the float32 math
    path there. On a CPU both run: same output and log-sum-exp, rows with no key included."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 8, 16, generator=g) for _ in range(3))
    mask = None
    if not causal:
        inside = torch.rand(1, 1, 8, 8, generator=g) > 0.4
        inside[..., 3, :] = False  # a row with no key
        mask = torch.zeros(inside.shape).masked_fill_(~inside, float("-inf"))
    flash = remap_attention.attention_with_lse(q, k, v, causal, attn_mask=mask, scale=0.25, math=False)
    math_ = remap_attention.attention_with_lse(q, k, v, causal, attn_mask=mask, scale=0.25, math=True)
    live = torch.ones(8, dtype=torch.bool)
    if not causal:
        live[3] = False
        assert torch.isneginf(math_[1][..., 3]).all() and (math_[0][..., 3, :] == 0).all()
    torch.testing.assert_close(math_[0][..., live, :], flash[0][..., live, :], atol=1e-5, rtol=0)
    torch.testing.assert_close(math_[1][..., live], flash[1][..., live], atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["self-extend", "rerope", "dca"])
def test_a_remap_model_on_the_math_path_matches_the_kernel_path(method, monkeypatch):
    model = tiny_models.build_family("llama")
    ids = torch.randint(0, 128, (1, 160), generator=torch.Generator().manual_seed(1))
    with extend.patched(model, method, factor=4.0), torch.no_grad():
        kernel = model(ids).logits
        forced = remap_attention.attention_with_lse
        monkeypatch.setattr(
            remap_attention, "attention_with_lse", lambda *a, **kw: forced(*a, **kw, math=True)
        )
        math_ = model(ids).logits
    torch.testing.assert_close(math_, kernel, atol=2e-5, rtol=0)


# ---- the wheels for the GPU machine ----


def module_level_imports() -> dict[str, set[str]]:
    """Third-party top-level names that extend/, tasks/, results/ and the lm-eval integration import at module
    level (also inside a module-level if/try), -> the files importing them."""
    found: dict[str, set[str]] = {}
    for layer in (*LAYERS, "scripts/integrations"):
        for path in (ROOT / layer).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
                    if isinstance(sub, ast.Import):
                        names = [a.name for a in sub.names]
                    elif isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module:
                        names = [sub.module]
                    else:
                        continue
                    for name in names:
                        top = name.split(".")[0]
                        if top not in sys.stdlib_module_names and top not in (*LAYERS, "ropebench"):
                            found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def distribution(module: str) -> str:
    names = importlib.metadata.packages_distributions().get(module)
    assert names, f"{module} is imported but no installed distribution provides it"
    return wheels.canonical(names[0])


def test_module_level_imports_are_in_the_image_or_the_wheel_list():
    """What the device image has plus what benchmarks/wheels.py ships covers every third-party import of the
    three layers and the lm-eval integration (the list as declared always; the gathered requirements.txt too
    when the folder exists)."""
    imports = module_level_imports()
    assert {"torch", "transformers", "lm_eval"} <= set(imports)  # the parse finds what we know is there
    shipped = {wheels.canonical(n) for n in wheels.RESOLVED + wheels.NO_DEPS}
    listed = wheels.DEFAULT_OUT / "requirements.txt"
    if listed.is_file():
        gathered = {wheels.canonical(line.split("==")[0]) for line in listed.read_text().split()}
        assert shipped <= gathered
        shipped |= gathered
    missing = {
        module: sorted(files)
        for module, files in imports.items()
        if not (wheels.in_image(distribution(module)) or distribution(module) in shipped)
    }
    assert not missing, f"imported at module level, neither in the image nor shipped: {missing}"


def test_the_wheel_list_names_pyprojects_dependencies():
    declared = wheels.pyproject_requirements()
    assert declared["transformers"].startswith("transformers>=")
    assert not [n for n in wheels.RESOLVED + wheels.NO_DEPS if wheels.in_image(n)]


def top_level_modules(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    tops = {
        n.split("/")[0] for n in names if "/" in n and not n.split("/")[0].endswith((".dist-info", ".data"))
    }
    tops |= {n[:-3] for n in names if "/" not in n and n.endswith(".py")}
    return {t for t in tops if t.isidentifier()}


def test_pure_python_wheels_install_with_no_index_and_import(tmp_path):
    folder = wheels.DEFAULT_OUT
    pure = sorted(folder.glob("*-py3-none-any.whl")) + sorted(folder.glob("*-py2.py3-none-any.whl"))
    if not pure:
        pytest.skip(f"no gathered wheels in {folder} (run `ropebench bench wheels`: needs the network)")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--target",
            str(tmp_path),
        ]
        + [str(w) for w in pure],
        check=True,
    )
    modules = sorted({m for w in pure for m in top_level_modules(w)})
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    mod = importlib.import_module(m)\n"
        f"    assert (mod.__file__ or '').startswith({str(tmp_path)!r}), (m, mod.__file__)\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
