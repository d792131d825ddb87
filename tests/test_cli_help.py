"""`--help` of lp.generate, lp.bench and lp.serve: every key of the config, with its default and a
line on what it does, rendered from the yaml files that hold the defaults; and docs/cli.md (docs/serving.md
for lp.serve) shows it as printed."""

from __future__ import annotations

import re
import sys

import pytest
from helpers import REPO
from hydra import compose, initialize_config_dir

import lp.bench.__main__
import lp.bench.sweep
import lp.generate
import lp.serve.__main__
from lp.frontend import cli

MAINS = {
    "generate": lp.generate.main,
    "bench": lp.bench.__main__.main,
    "sweep": lp.bench.sweep.main,
    "serve": lp.serve.__main__.main,
}
DOCS = {"serve": "serving.md"}  # the page that shows a command's --help (else cli.md)


def printed_help(name: str, monkeypatch, capsys) -> str:
    monkeypatch.setattr(sys, "argv", [f"lp.{name}", "--help"])
    with pytest.raises(SystemExit) as exc:
        MAINS[name]()
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(MAINS))
def test_help_lists_every_key_of_the_config(name, monkeypatch, capsys):
    with initialize_config_dir(str(cli.CONFIGS), version_base=None):
        cfg = compose(name)
    documented = cli.keys(name)
    assert [k for k, _, _ in documented if k != "model"] == [k for k in cfg if k != "model"]
    text = printed_help(name, monkeypatch, capsys)
    for key, default, doc in documented:
        assert doc, f"{name}.yaml: `{key}` has no comment, so --help cannot say what it does"
        assert re.search(rf"^  {re.escape(key)}={re.escape(default)}(\s|$)", text, re.M), key
        assert doc in text, key
    assert "Examples:" in text


@pytest.mark.parametrize("name", sorted(MAINS))
def test_readme_shows_the_help_as_printed(name, monkeypatch, capsys):
    page = DOCS.get(name, "cli.md")
    blocks = re.findall(r"```text\n(.*?)```", (REPO / "docs" / page).read_text(encoding="utf-8"), re.S)
    text = printed_help(name, monkeypatch, capsys)
    assert text in blocks, f"docs/{page} has no ```text block equal to `python -m lp.{name} --help`:\n{text}"
