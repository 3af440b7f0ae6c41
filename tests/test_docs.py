"""The docs' tables made from committed data (ladder_train/report/docs_tables.py) equal what that data give, and
an edited number is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

from ladder_train.report.docs_tables import main, remake, stale_tables

ROOT = Path(__file__).resolve().parents[1]


def test_every_table_made_from_data_equals_what_its_data_give():
    assert stale_tables(ROOT) == []


def _copy_docs(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for name in ("README.md",):
        shutil.copyfile(ROOT / name, tmp_path / name)
    return tmp_path


def test_an_edited_number_in_a_table_is_caught_and_write_restores_it(tmp_path):
    root = _copy_docs(tmp_path)
    results = root / "docs" / "results.md"
    text = results.read_text()
    assert "**1.9322**" in text  # standard's best rate in the learning-rate sweep
    results.write_text(text.replace("**1.9322**", "**1.9222**"))
    assert stale_tables(root) == ["docs/results.md: study-lr-sweep"]
    assert main(["--check", "--root", str(root)]) == 1
    assert main(["--write", "--root", str(root)]) == 0
    assert results.read_text() == text and stale_tables(root) == []


def test_a_new_run_changes_the_table_it_feeds(tmp_path):
    """The table follows the data: dropping one run's folder turns its cell into 'not yet'."""
    root = _copy_docs(tmp_path)
    shutil.rmtree(root / "docs/results/study_small/lr/model.residual=parallel,train.optimizer.lr=3.2e-2")
    remade = remake((root / "docs" / "results.md").read_text(), root)
    assert "| parallel | 2.0133 | **1.9739** | 1.9768 | 2.0275 | not yet |" in remade
