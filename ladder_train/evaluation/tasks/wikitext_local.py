"""Helpers of the wikitext2_local task: split the WikiText-2 file into articles, then score them exactly as
lm-eval's own wikitext task does (its detokenizer and word/byte counts are reused, not rewritten)."""

import re

import datasets
from lm_eval.tasks.wikitext.preprocess_wikitext import process_results, wikitext_detokenizer

# an article starts at a top-level heading line " = Title = " (section headings are " = = ... = = ")
_ARTICLE_HEADING = re.compile(r"^ = [^=].* = $", flags=re.MULTILINE)


def split_articles(dataset: datasets.Dataset) -> datasets.Dataset:
    """One row per article, in the column "page" that lm-eval's wikitext helpers read."""
    pages = []
    for text in dataset["text"]:
        starts = [m.start() for m in _ARTICLE_HEADING.finditer(text)] or [0]
        starts[0] = 0  # anything before the first heading belongs to the first article
        pages += [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)], strict=True) if text[a:b].strip()]
    return datasets.Dataset.from_dict({"page": pages})


__all__ = ["process_results", "split_articles", "wikitext_detokenizer"]
