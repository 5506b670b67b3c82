"""Documentation that cannot drift. The README's and docs/methods.md's method tables and the README's
paragraph on what the demo runs are generated (`python -m ropebench.docs --write`, from the method registry
and scripts/configs/demo.yaml): the files must hold exactly what the generator writes. docs/layout.md's file
lists must name every code file under extend/, tasks/, results/, scripts/ and benchmarks/, and nothing that
does not exist."""

import re
from pathlib import Path

import pytest
import yaml
from ropebench import docs, extend

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "run `python -m ropebench.docs --write` and commit the result"


def builtin_names() -> list[str]:
    return [
        name
        for name in extend.methods()
        if extend.registry.get(name).fn.__module__.startswith("ropebench.extend.")
    ]


def block(text: str, name: str) -> str:
    start = text.index(docs.begin_marker(name)) + len(docs.begin_marker(name))
    return text[start : text.index(docs.END, start)]


@pytest.mark.parametrize("name", sorted(docs.BLOCKS))
def test_generated_blocks_are_current(name):
    text = (ROOT / name).read_text()
    assert docs.render(text, docs.BLOCKS[name], ROOT, name) == text, (
        f"{name}: a generated block differs from the method registry or {docs.DEMO_CONFIG} — {REGENERATE}"
    )


def test_check_command_exits_1_naming_the_stale_file(tmp_path, capsys):
    for name in (*docs.BLOCKS, *docs.FILES, docs.DEMO_CONFIG):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    assert docs.main(["--check", "--root", str(tmp_path)]) == 0
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("| `yarn` |", "| `yarn` (edited by hand) |"))
    assert docs.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "README.md" in err and "docs/methods.md" not in err and "python -m ropebench.docs --write" in err
    assert docs.main(["--write", "--root", str(tmp_path)]) == 0
    assert readme.read_text() == (ROOT / "README.md").read_text()


def test_the_frozen_declarations_are_the_tasks_own(tmp_path, capsys):
    """results/built_in_meanings.json (results' fallback for old rows) is generated from the tasks: a hand
    edit is stale, and --write restores the tasks' declarations."""
    for name in (*docs.BLOCKS, *docs.FILES, docs.DEMO_CONFIG):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    frozen = tmp_path / "results" / "built_in_meanings.json"
    frozen.write_text(frozen.read_text().replace('"lower"', '"higher"', 1))
    assert docs.main(["--check", "--root", str(tmp_path)]) == 1
    assert "results/built_in_meanings.json" in capsys.readouterr().err
    assert docs.main(["--write", "--root", str(tmp_path)]) == 0
    assert frozen.read_text() == (ROOT / "results" / "built_in_meanings.json").read_text()


def test_a_missing_block_is_one_line_and_exit_2(tmp_path, capsys):
    for name in (*docs.BLOCKS, docs.DEMO_CONFIG):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    methods_md = tmp_path / "docs" / "methods.md"
    methods_md.write_text(methods_md.read_text().replace(docs.END, "", 1))
    assert docs.main(["--check", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "docs/methods.md" in err and "block 'methods'" in err, err


def test_every_builtin_method_is_in_both_tables_with_its_options():
    """From describe() (not the generator): each built-in method has a row in each table, and the row of
    docs/methods.md names each of its own options with its default."""
    readme = block((ROOT / "README.md").read_text(), "methods")
    methods_md = block((ROOT / "docs" / "methods.md").read_text(), "methods")
    names = builtin_names()
    assert re.findall(r"^\| `([\w-]+)` \|", readme, re.MULTILINE) == re.findall(
        r"^\| `([\w-]+)` \|", methods_md, re.MULTILINE
    )
    assert sorted(re.findall(r"^\| `([\w-]+)` \|", readme, re.MULTILINE)) == names
    for name in names:
        info = extend.describe(name)
        row = next(line for line in methods_md.splitlines() if line.startswith(f"| `{name}` |"))
        for option, default in info["options"].items():
            if option in extend.registry.COMMON_OPTIONS:
                continue
            assert f"`{option}` (" in row, (name, option)
            if option in info["required"]:
                assert "required" in row
            elif isinstance(default, float):
                assert f"default {default:g}" in row, (name, option)


def test_a_new_builtin_method_reaches_the_tables_without_a_hand_edit(monkeypatch):
    """A method registered by a module of the package appears in both tables from its docstring and
    signature alone; one without the docstring's fields is refused with what to write."""

    def halve(rope, *, factor, strength: float = 0.5):
        """Halves every frequency.

        Formula: theta_i / 2
        Reference: nobody 2026"""
        return rope.inv_freq / 2, 1.0

    halve.__module__ = "ropebench.extend.frequency_methods"  # as if written there
    monkeypatch.setattr(extend.method_spec, "_REGISTRY", dict(extend.method_spec._REGISTRY))
    extend.register("halve-docs-test", min_factor=1.0)(halve)
    assert "| `halve-docs-test` | Halves every frequency | nobody 2026 |" in docs.readme_methods()
    row = "| `halve-docs-test` | theta_i / 2 | >= 1 | `strength` (number; default 0.5) | nobody 2026 |"
    assert row in docs.methods_md()

    def bare(rope, *, factor):
        """Only a summary."""
        return rope.inv_freq, 1.0

    bare.__module__ = "ropebench.extend.frequency_methods"
    extend.register("bare-docs-test")(bare)
    with pytest.raises(extend.ExtendError, match="no Formula and no Reference"):
        docs.readme_methods()


def test_plugins_stay_out_of_the_tables(monkeypatch):
    monkeypatch.setattr(extend.method_spec, "_REGISTRY", dict(extend.method_spec._REGISTRY))

    @extend.register("plugin-docs-test")
    def plugin(rope, *, factor):
        """A plugin's method, documented by its own package."""
        return rope.inv_freq, 1.0

    assert "plugin-docs-test" not in docs.readme_methods() + docs.methods_md()


def test_the_demo_paragraph_is_the_demo_config():
    """Every setting of scripts/configs/demo.yaml that says what runs appears in the README's paragraph."""
    config = yaml.safe_load((ROOT / docs.DEMO_CONFIG).read_text())
    paragraph = " ".join(block((ROOT / "README.md").read_text(), "demo").split())
    assert f"`{config['model']}`" in paragraph and f"`{config['corpus']}` corpus" in paragraph
    for entry in config["methods"]:
        assert f"`{entry if isinstance(entry, str) else entry['method']}`" in paragraph
    for factor in config["factors"]:
        assert f"{factor:g}" in paragraph
    for task, options in config["tasks"].items():
        assert task in paragraph
        for key in ("lengths", "depths"):
            for value in options.get(key, []):
                assert f"{value:g}" in paragraph, (task, key, value)
        if "trials" in options:
            assert f"{options['trials']} trial" in paragraph
        if "num_docs" in options:
            assert f"{options['num_docs']} document" in paragraph


def test_the_demo_paragraph_follows_a_changed_config():
    config = {
        "model": "some/model",
        "corpus": "pg19",
        "factors": [2, 4],
        "methods": ["plain", {"method": "yarn", "factors": [8], "options": {"beta_fast": 16}}, "pi"],
        "tasks": {
            "passkey": {"lengths": [4096, 8192], "depths": [0.1, 0.5], "trials": 1},
            "perplexity": None,
        },
    }
    text = " ".join(docs.demo_paragraph(config).split())
    assert "`some/model` with `plain` (once, at factor 1: the factor does not apply)" in text
    assert "`yarn` (beta_fast=16) at factor 8, `pi` at factors 2 and 4, on the `pg19` corpus" in text
    assert (
        "passkey at 4096 and 8192 tokens (depths 0.1 and 0.5, 1 trial); perplexity (the task's defaults)"
        in text
    )


# ---- docs/layout.md against the tree ----
CODE_DIRS = ("extend", "tasks", "results", "scripts", "benchmarks")
CODE_SUFFIXES = (".py", ".sh")
FILE_TOKEN = re.compile(r"(?<![\w./-])([\w-]+(?:\.[\w-]+)*\.(?:py|sh|txt|md|json|ya?ml|toml))(?![\w/])")
DIR_TOKEN = re.compile(r"(?<![\w./-])([\w-]+)/(?![\w.])")


def layout_sections() -> dict[str, str]:
    """The tree in docs/layout.md's first code block: top-level entry (`extend/`, `pyproject.toml`) -> its
    text."""
    text = (ROOT / "docs" / "layout.md").read_text()
    tree = re.search(r"```\n(.*?)```", text, re.DOTALL).group(1)
    sections, current = {}, None
    for line in tree.splitlines():
        if line and not line[0].isspace():
            current = line.split()[0]
            sections[current] = line[len(current) :]
        elif current is not None:
            sections[current] += "\n" + line
    return sections


def tree_files(folder: str):
    return [p for p in sorted((ROOT / folder).rglob("*")) if p.is_file() and "__pycache__" not in p.parts]


def test_layout_lists_every_code_file():
    """Every .py/.sh file under the code folders is named in its folder's entry (a file in a subfolder: its
    name and the subfolder's `name/`). `__init__.py` files are package markers and need no entry."""
    sections = layout_sections()
    unlisted = []
    for folder in CODE_DIRS:
        text = sections.get(f"{folder}/", "")
        files, dirs = set(FILE_TOKEN.findall(text)), set(DIR_TOKEN.findall(text))
        for path in tree_files(folder):
            rel = path.relative_to(ROOT / folder)
            if path.suffix not in CODE_SUFFIXES or path.name == "__init__.py":
                continue
            if rel.name not in files or not set(rel.parts[:-1]) <= dirs:
                unlisted.append(f"{folder}/{rel}")
    assert not unlisted, (
        f"docs/layout.md does not list {', '.join(unlisted)} — add each to its folder's entry"
    )


def test_layout_lists_nothing_that_does_not_exist():
    sections = layout_sections()
    missing = [entry for entry in sections if not (ROOT / entry).exists()]
    for folder in CODE_DIRS:
        assert f"{folder}/" in sections, f"docs/layout.md has no entry for {folder}/"
        text = sections[f"{folder}/"]
        names = {p.name for p in tree_files(folder)}
        subdirs = {p.name for p in (ROOT / folder).rglob("*") if p.is_dir()}
        missing += [f"{folder}/.../{name}" for name in sorted(set(FILE_TOKEN.findall(text)) - names)]
        missing += [f"{folder}/.../{name}/" for name in sorted(set(DIR_TOKEN.findall(text)) - subdirs)]
    assert not missing, f"docs/layout.md lists {', '.join(missing)}, which do not exist — fix or remove them"
