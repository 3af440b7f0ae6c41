"""ladder_train/paper.py: the paper's tables as entered. A few cells against the paper, and every row's stated
average against the mean of its own columns, to the paper's rounding (two decimals): a mistyped cell that moves a
row's mean by more than the rounding fails here."""

import dataclasses

import pytest

from ladder_train import paper


def average_matches(values, stated: float) -> bool:
    """The mean of ``values`` rounds to ``stated`` at two decimals (half a unit of the last digit, plus float slack)."""
    values = list(values)
    return abs(sum(values) / len(values) - stated) <= 0.005 + 1e-9


def test_table3_cells_as_the_paper_prints_them():
    row = paper.pretraining_row("1.2B", "standard")
    assert row.tasks["arc_challenge"] == 34.22 and row.tasks["winogrande"] == 55.41
    assert (row.avg6, row.wikitext_ppl, row.tokens_per_s) == (59.98, 18.54, 1008.29)
    row = paper.pretraining_row("3.5B", "ladder")
    assert row.tasks["hellaswag"] == 45.66 and row.tasks["sciq"] == 89.90 and row.wikitext_ppl == 14.90
    assert paper.pretraining_row("4.5B", "ladder").tokens_per_s == 1217.71
    assert paper.pretraining_row("3.5B", "parallel").tokens_per_s is None  # the paper leaves it empty
    assert paper.pretraining_row("7B", "ladder") is None
    assert len(paper.PRETRAINING) == 8


@pytest.mark.parametrize("row", paper.PRETRAINING, ids=lambda r: f"{r.residual}-{r.size}")
def test_table3_average_is_the_mean_of_its_six_tasks(row):
    assert tuple(row.tasks) == paper.AVERAGED_TASKS
    assert average_matches(row.tasks.values(), row.avg6), (row.size, row.residual, row.tasks, row.avg6)


@pytest.mark.parametrize("row", paper.ADAPTATION, ids=lambda r: r.name)
def test_adaptation_average_is_the_mean_of_its_nine_benchmarks(row):
    assert tuple(row.scores) == paper.ADAPTATION_BENCHMARKS
    assert average_matches(row.scores.values(), row.average), (row.name, row.scores, row.average)


def test_the_average_check_catches_a_mistyped_cell():
    row = paper.pretraining_row("3.5B", "standard")
    typo = dataclasses.replace(row, tasks={**row.tasks, "piqa": 75.59})  # 74.59 typed as 75.59
    assert average_matches(row.tasks.values(), row.avg6)
    assert not average_matches(typo.tasks.values(), typo.avg6)


def test_adaptation_table():
    zero_shot, retrained16, retrained20 = paper.ADAPTATION[1:]
    assert (zero_shot.ladder_layers, zero_shot.retrained) == (16, False)  # the zero-shot row converts 16 layers
    assert (retrained16.ladder_layers, retrained20.ladder_layers) == (16, 20) and retrained20.retrained
    assert zero_shot.scores["GSM8K"] == paper.ADAPTATION_GSM8K_ZERO_SHOT == 10.54
    assert retrained20.scores["AlpacaEval 2"] == 21.72 and paper.ADAPTATION[0].scores["MMLU"] == 68.14
    assert paper.ADAPTATION_LLAMA31_8B["ladder 16 of 32 layers, retrained"] == 57.61
    assert paper.ADAPTATION_RETRAIN_TOKENS == {"paper text": 3.0e9, "paper slides": 1.6e9}


def test_inference_table_has_its_16_cells():
    table = paper.INFERENCE_TP8_70B
    assert sum(len(v) for v in table.values()) == 16 and paper.INFERENCE_BATCHES == (1, 4, 16, 64)
    assert table[("standard tokens/s", "P2P disabled")] == (51.66, 173.62, 546.68, 1454.42)
    assert table[("ladder speedup", "P2P disabled")][0] == 1.599
    assert paper.INFERENCE_TP8_70B_INFERRED[64] == (1940.99, 1.155, 1.282)
