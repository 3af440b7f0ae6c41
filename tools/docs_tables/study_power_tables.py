"""What the layout study's differences mean (docs/results.md): the paper's ladder − standard gap in the study's unit
against the power of the study's pairs, and a unigram model's score as the floor for scale. Each table's data:
``manifest.toml``."""

from __future__ import annotations

import math
from pathlib import Path

from ladder_train.paper import PRETRAINING
from ladder_train.report.tables import markdown_table
from ladder_train.study import default_baseline, group_runs, pairs_for_power, pooled_sd, power

from .manifest import read_json
from .study_runs import ladder_difference, loss_differences, study_runs


def paper_gap(root: Path, seeds: str) -> str:
    """The paper's ladder − standard Wikitext gap in the study's unit, nats per byte (through the bytes per word of
    the study's own ``wikitext2_local`` evaluations), beside what the study's pairs can detect at their measured sd."""
    groups = group_runs(study_runs(root, seeds))
    baseline = default_baseline(groups)
    wikitext = baseline.runs[0].eval_summary["wikitext2_local"]
    # ln(word perplexity) / ln(byte perplexity) = (loss / words) / (loss / bytes) = bytes per word of the text
    bytes_per_word = math.log(wikitext["word_perplexity"]) / math.log(wikitext["byte_perplexity"])
    loss = loss_differences(groups, baseline)
    tested = [row.difference for row in loss if row.difference is not None]
    ladder = ladder_difference(loss)
    pooled = pooled_sd(tested)
    n = ladder.n
    paper = {(row.size, row.residual): row.wikitext_ppl for row in PRETRAINING}
    gaps = [
        (f"paper {size}: ladder − standard", math.log(paper[size, "ladder"] / paper[size, "standard"]))
        for size in ("1.2B", "3.5B")
    ]
    rows = []
    for name, per_word in gaps:
        rows.append(_gap_row(name, f"{per_word:+.4f}", per_word / bytes_per_word, n, ladder.sd, pooled))
    for effect in (0.01, 0.02, 0.05):
        rows.append(_gap_row(f"a difference of {effect:g} nats/byte", "—", effect, n, ladder.sd, pooled))
    header = [
        "difference",
        "nats per WikiText word",
        "nats per byte",
        f"power of {n} pairs (sd {ladder.sd:.4f})",
        f"pairs for 80 % (sd {ladder.sd:.4f})",
        f"pairs for 80 % (sd {pooled:.4f})",
    ]
    return (
        markdown_table(header, rows)
        + f"\n\nBytes per word {bytes_per_word:.2f}: ln(word perplexity) / ln(byte perplexity) of `wikitext2_local` in "
        f"the baseline's seed-{baseline.runs[0].seed} run. The paper's Wikitext perplexities are its Table 3 "
        f"(`ladder_train/paper.py`). Pair sd: the ladder − standard validation-loss pairs' ({ladder.sd:.4f}) and the "
        f"pooled sd of the {len(tested)} comparisons with the baseline ({pooled:.4f}), each comparison's variance "
        f"weighted by its degrees of freedom, n − 1 (pairs: {_pair_counts(loss)}), over the seeds in "
        f"`{seeds}`. Power: two-sided paired t test at 95 % (noncentral t). "
        f"{_controls_power(loss, baseline, pooled)}\n"
    )


def _pair_counts(loss: list) -> str:
    """The pair count of each comparison a pooled sd pools: 'ladder 13, parallel 3, ...'."""
    return ", ".join(f"{row.group.label} {row.difference.n}" for row in loss if row.difference is not None)


def _controls_power(loss: list, baseline, pooled: float) -> str:
    """The power of each control's own pairs to detect a true difference of its measured size at the pooled sd (the
    controls are the baseline's layout at another depth): what their misses say about the design."""
    residual = baseline.runs[0].residual
    controls = [row for row in loss if row.difference is not None and row.group.runs[0].residual == residual]
    if not controls:
        return ""
    figures = "; ".join(
        f"{row.group.label} {row.difference.mean:+.4f} over {row.difference.n} pairs: "
        f"{100 * power(abs(row.difference.mean), pooled, row.difference.n):.0f} %"
        for row in controls
    )
    return (
        f"At the pooled sd, each control's pairs detect a true difference of its measured size with probability "
        f"{figures}."
    )


def _gap_row(name: str, per_word: str, per_byte: float, n: int, sd: float, pooled: float) -> list[str]:
    needed = [pairs_for_power(abs(per_byte), s) for s in (sd, pooled)]
    return [
        name,
        per_word,
        f"{per_byte:+.4f}",
        f"{power(abs(per_byte), sd, n):.0%}",
        *("more than 10,000" if k is None else f"{k:,}" for k in needed),
    ]


def unigram(root: Path, unigram: str) -> str:
    """The study's floor: a unigram model of the training bytes on the runs' validation bytes
    (``benchmarks/unigram_baseline.py``)."""
    data = read_json(root / unigram)
    return (
        f"For scale, a unigram model of the training bytes scores {data['nats_per_byte']:.3f} nats per byte on the "
        f"same {data['val_tokens']:,} validation bytes the runs score ({data['smoothing']} of "
        f"{data['vocab_size']} tokens, counted over {data['train_tokens']:,} training labels; `{unigram}`, "
        f"written {data['date'][:10]} by `{data['command']}`).\n"
    )
