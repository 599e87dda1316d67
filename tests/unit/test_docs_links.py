"""The README and docs/ as a reader uses them: every link lands on a page and a heading
that exist, every `make` target the README names is one `make help` lists, and the
README's config example is a valid config file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from sentinel.config import load_config

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text) if "://" not in m.group(1)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_lands_on_a_page_and_heading_that_exist(page: Path) -> None:
    for link in _links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link} points at nothing"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{page.name}: {link}: no such heading in {target.name}"


def test_the_readme_links_every_page_of_the_manual() -> None:
    readme, index = (ROOT / "README.md").read_text("utf-8"), (ROOT / "docs" / "README.md").read_text("utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"(docs/{page.name})" in readme or f"(docs/{page.name}#" in readme, page.name
            assert f"({page.name})" in index, page.name


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text("utf-8").splitlines()) <= 200


def test_every_make_target_the_readme_names_is_in_make_help() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    named = set(re.findall(r"\bmake ([a-z][\w-]*)", (ROOT / "README.md").read_text("utf-8")))
    assert named and named <= listed, named - listed
    assert {"demo", "test", "lint", "help", "docs"} <= listed


def test_the_readme_config_example_is_a_valid_config(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text("utf-8"), flags=re.S)
    assert blocks
    for i, block in enumerate(blocks):
        path = tmp_path / f"example{i}.yaml"
        path.write_text(block, encoding="utf-8")
        cfg, pack = load_config(path)
        raw = yaml.safe_load(block)
        assert set(raw) <= set(type(cfg).model_fields)
        assert not pack.get("LossPlateau").enabled and pack.get("GradientSpike").params.factor == 20  # type: ignore[attr-defined]


def test_the_install_table_names_every_dependency_of_each_extra() -> None:
    """docs/instrumenting.md, "Install": the row of each extra (and of no extra) names every
    package pyproject.toml gives it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    rows = {m.group(1): m.group(2).lower() for m in re.finditer(
        r"^\| (\*\(none\)\*|`[a-z]+`) \| ([^|]*) \|", (ROOT / "docs" / "instrumenting.md").read_text("utf-8"), re.M)}
    wanted = {"*(none)*": project["dependencies"], **{f"`{k}`": v for k, v in project["optional-dependencies"].items()}}
    for row, requirements in wanted.items():
        assert row in rows, row
        names = {re.split(r"[<>=!;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}
        missing = sorted(n for n in names if n not in rows[row] and n.replace("-", "_") not in rows[row])
        assert not missing, (row, missing)


def test_every_sentinel_config_example_in_the_manual_is_valid(tmp_path: Path) -> None:
    """Each ```yaml block of docs/ that sets a key of Sentinel's config file loads as written
    (the others are Prometheus's and the web config's files)."""
    from sentinel.config import SentinelConfig

    fields = set(SentinelConfig.model_fields)
    checked = 0
    for page in sorted((ROOT / "docs").glob("*.md")):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text("utf-8"), flags=re.S)):
            raw = yaml.safe_load(block)
            if not isinstance(raw, dict) or not set(raw) & fields:
                continue
            path = tmp_path / f"{page.stem}{i}.yaml"
            path.write_text(block, encoding="utf-8")
            load_config(path)  # raises ConfigError with the dotted key of what is wrong
            checked += 1
    assert checked >= 5  # alerting.md's three, guard.md's and security.md's


def test_the_alerting_page_names_every_rule_of_the_pack() -> None:
    from sentinel.rules.config import load_pack

    text = (ROOT / "docs" / "alerting.md").read_text("utf-8")
    missing = [r.name for r in load_pack().rules if f"`{r.name}`" not in text]
    assert not missing
