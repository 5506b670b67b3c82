"""The wheel works outside the checkout (issue 31, item 1): built from a copy of the tracked tree, installed
(not editable) into a fresh virtual environment elsewhere, and run from a directory that holds a user's own
`tasks.py`, `results.py` and `extend.py`. Every ropebench module then comes from the installed wheel under
the one import name `ropebench`; the demo config and lm-eval's task folder ship as package data.

The new environment reuses this environment's dependencies (a `.pth` line naming its site-packages: nothing
is downloaded); that folder's own `.pth` files, the checkout's editable install among them, are not run."""

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What a user's working directory may hold: module names ropebench once installed at the top level.
SHADOWS = ("tasks", "results", "extend", "benchmarks")


def _tracked_copy(dest: Path) -> Path:
    """The checkout's tracked files (what a clean clone holds), so the build writes nothing into the tree."""
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(python, ropebench command, user directory) of a fresh venv with ropebench's wheel installed."""
    base = tmp_path_factory.mktemp("wheel")
    src = _tracked_copy(base / "src")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            base / "dist",
            src,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (base / "dist").glob("ropebench-*.whl")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    (Path(purelib) / "deps.pth").write_text("\n".join(deps) + "\n")
    install = subprocess.run(
        # this environment's pip, run by the new interpreter: it installs into the new venv and leaves
        # this environment's ropebench alone ("outside environment")
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    user = base / "user"
    user.mkdir()
    for name in SHADOWS:  # a user's own modules of these names, in the working directory
        (user / f"{name}.py").write_text(f"raise ImportError('the user\\'s {name}.py was imported')\n")
    return python, env_dir / "bin" / "ropebench", user


def _run(argv, cwd, timeout=600):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert out.returncode == 0, f"{argv}: rc {out.returncode}\n{out.stdout[-1500:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_the_wheel_holds_one_import_name_and_the_demo_config(wheel_env):
    python, _, user = wheel_env
    code = (
        "import importlib.metadata as md, pathlib, ropebench\n"
        "from ropebench import extend, tasks, results, benchmarks\n"
        "from ropebench.sweep_lib.config import DEMO_CONFIG\n"
        "tops = md.distribution('ropebench').read_text('top_level.txt')\n"
        "print(sorted(set((tops or '').split())))\n"
        "print(pathlib.Path(ropebench.__file__).parent)\n"
        "print(all(pathlib.Path(m.__file__).is_relative_to(pathlib.Path(ropebench.__file__).parent)"
        " for m in (extend, tasks, results, benchmarks)))\n"
        "print(DEMO_CONFIG.is_file())\n"
    )
    tops, where, inside, demo = _run([python, "-c", code], user).split("\n")[:4]
    assert tops in ("['ropebench']", "[]")  # one top-level name (newer setuptools write no top_level.txt)
    assert "site-packages" in where and not Path(where).is_relative_to(ROOT)
    assert inside == "True" and demo == "True"


def test_the_wheel_runs_the_readme_commands_from_any_directory(wheel_env, tiny_model_dir):
    """`python -m` puts the working directory first on sys.path, so the user's tasks.py and results.py are
    found first for those names: ropebench never asks for them."""
    python, ropebench, user = wheel_env
    assert "sweep" in _run([ropebench, "--help"], user)
    demo = _run([python, "-m", "ropebench.cli", "sweep", "--dry-run", "--out", user / "demo"], user)
    assert "smollm2" in demo.lower()  # the shipped demo config, read from package data
    out = user / "run"
    _run(
        [ropebench, "sweep", "--model", tiny_model_dir, "--methods", "plain", "yarn", "--factors", "2"]
        + [
            "--tasks",
            "perplexity",
            "--lengths",
            "64",
            "-t",
            "perplexity.num_docs=1",
            "--out",
            out,
            "--quiet",
        ],
        user,
    )
    assert (out / "records.jsonl").is_file()
    _run([python, "-m", "ropebench.cli", "report", out], user)
    assert (out / "report.md").read_text().startswith("# ropebench report")
    assert "yarn" in _run([ropebench, "inspect", tiny_model_dir, "--method", "yarn", "--factor", "2"], user)
    folder = Path(_run([ropebench, "lm-eval", "tasks"], user).strip())
    assert folder.is_dir() and not folder.is_relative_to(ROOT) and list(folder.glob("*.yaml"))
    assert "usage" in _run([ropebench, "bench", "--help"], user).lower()
