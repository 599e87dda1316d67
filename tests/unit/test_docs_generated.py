"""The reference pages generated from the code (docs/metrics.md, rules.md, configuration.md)
are current, and they hold what a reader looks them up for."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel import docs
from sentinel.catalog import CATALOG, DAEMON_CATALOG, GPU_CATALOG
from sentinel.config import SentinelConfig
from sentinel.instrument.options import WatchOptions
from sentinel.rules.config import load_pack

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("name", sorted(docs.PAGES))
def test_the_committed_page_is_what_the_generator_writes_now(name: str) -> None:
    committed = (DOCS / name).read_text(encoding="utf-8") if (DOCS / name).is_file() else ""
    assert committed == docs.PAGES[name](), f"docs/{name} is stale: regenerate with `{docs.REGENERATE}`"


def test_every_metric_rule_and_option_has_its_entry() -> None:
    metrics = (DOCS / "metrics.md").read_text(encoding="utf-8")
    for name in [*CATALOG, *GPU_CATALOG, *DAEMON_CATALOG]:
        assert f"| `{name}` |" in metrics, name
    rules = (DOCS / "rules.md").read_text(encoding="utf-8")
    for rule in load_pack().rules:
        section = rules.split(f"\n## {rule.name}\n", 1)[1].split("\n## ", 1)[0]
        assert rule.checks[0] in section and " ".join(rule.runbook.split())[:40] in section, rule.name
    config = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for option in WatchOptions.__dataclass_fields__:
        if option != "extra":
            assert f"| `{option}` |" in config, option
    for section in SentinelConfig.model_fields:
        assert f"| `{section}" in config, section


def test_no_generated_page_cites_the_source_documents_by_section() -> None:
    for name, render in docs.PAGES.items():
        text = render()
        assert "§" not in text and "seed 00" not in text.lower(), name


def test_check_mode_names_a_stale_page(tmp_path: Path) -> None:
    for name, render in docs.PAGES.items():
        (tmp_path / name).write_text(render(), encoding="utf-8")
    assert docs.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "rules.md").write_text("old\n", encoding="utf-8")
    assert docs.stale(tmp_path) == ["rules.md"]
    assert docs.main(["--check", str(tmp_path)]) == 1
