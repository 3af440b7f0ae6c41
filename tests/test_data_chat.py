"""Chat SFT data (data.format: chat): the loss mask (assistant contents and their turns' closing text only),
windows that keep inputs and labels aligned across their boundaries, exact resume, the trainer's loss averaged
over the scored tokens of the whole global batch (micro-batches and ranks), and one-line refusals."""

import json
import math
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_utils import run_ranks
from tiny import tiny_run_config
from tokenizers import AddedToken

from ladder_train.config import ConfigError, DataConfig, load_config
from ladder_train.data import build_dataloader, byte_tokenizer
from ladder_train.errors import DataError

# ChatML, as Qwen / SmolLM2 tokenizer_config.json files write it
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONVERSATIONS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "q2?"},
        {"role": "assistant", "content": "a2."},
    ],
    [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven."}],
    [{"role": "user", "content": "no answer here"}],  # no assistant turn: every token is context
    [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4, as\nusual"}],
    [{"role": "user", "content": "long " * 6}, {"role": "assistant", "content": "reply " * 5}],
]
IGNORE = -100


def model_folder(root: Path, template: str = CHATML) -> Path:
    folder = root / "model"
    folder.mkdir(exist_ok=True)
    config = {"chat_template": template, "eos_token": "<|im_end|>", "bos_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def write_conversations(path: Path, conversations) -> Path:
    path.write_text("".join(json.dumps({"id": i, "messages": c}) + "\n" for i, c in enumerate(conversations)))
    return path


def chatml_tokenizer():
    """The byte tokenizer plus <|im_start|> = 257, <|im_end|> = 258 as single special tokens."""
    tok = byte_tokenizer()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    return tok


def by_hand(tok, messages) -> tuple[list[int], list[int]]:
    """ChatML's tokens and targets of one conversation, written out by hand: the assistant content and
    '<|im_end|>\\n' are targets; the rest, and the <|endoftext|> after the conversation, are -100."""
    ids, targets = [], []
    for m in messages:
        if m["role"] == "assistant":
            pieces = [("<|im_start|>assistant\n", False), (m["content"] + "<|im_end|>\n", True)]
        else:
            pieces = [(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n", False)]
        for text, target in pieces:
            piece = tok.encode(text).ids
            ids += piece
            targets += piece if target else [IGNORE] * len(piece)
    return ids + [0], targets + [IGNORE]


def chat_cfg(tmp_path: Path, source: Path, **extra) -> DataConfig:
    return DataConfig(
        source=str(source), tokenizer="byte", format="chat", chat_template=str(model_folder(tmp_path)), **extra
    )


# -- the mask --------------------------------------------------------------------------------------------


def test_labels_are_the_assistant_turns_and_nothing_else(tmp_path):
    tok = chatml_tokenizer()
    conversation = CONVERSATIONS[0]
    source = write_conversations(tmp_path / "chat.jsonl", [conversation])
    ids, targets = by_hand(tok, conversation)
    assert tok.token_to_id("<|im_start|>") == 257 and ids[0] == 257  # the special tokens are matched, not spelt
    # one window = the conversation and its <|endoftext|> (the inputs) + the next pass's first token
    cfg = chat_cfg(tmp_path, source, seq_len=len(ids))
    inputs, labels = next(iter(build_dataloader(cfg, tok, batch_size=1, num_workers=0)))
    assert inputs[0].tolist() == ids
    assert labels[0].tolist() == targets[1:] + [IGNORE]  # the next conversation's <|im_start|> is context

    scored = labels[0] != IGNORE
    assert tok.decode(labels[0][scored].tolist(), skip_special_tokens=False) == "yo<|im_end|>\na2.<|im_end|>\n"
    next_tokens = inputs[0].tolist()[1:] + [257]
    context = [t for t, s in zip(next_tokens, scored.tolist(), strict=True) if not s]
    assert tok.decode(context, skip_special_tokens=False) == (
        "system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        "<|im_start|>user\nq2?<|im_end|>\n<|im_start|>assistant\n<|endoftext|><|im_start|>"
    )
    assert torch.equal(labels[0][scored], inputs[0][1:][scored[:-1]])  # a label is the next token


def test_the_rule_holds_for_another_template(tmp_path):
    """A Llama-3-like template: BOS text, a header with a blank line, <|eot_id|> closing every turn."""
    from ladder_train.data.conversations import ConversationEncoder, load_template

    template = (
        "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + "
        "m['content'] + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    )
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": "<s>"}))
    encoder = ConversationEncoder(load_template(str(folder)), byte_tokenizer(), 0)
    pieces = encoder.pieces(CONVERSATIONS[3])
    assert pieces == [
        ("<s><|start_header_id|>user<|end_header_id|>\n\n2+2<|eot_id|>", False),
        ("<|start_header_id|>assistant<|end_header_id|>\n\n", False),
        ("4, as\nusual<|eot_id|>", True),
    ]
    ids, mask = encoder.encode([CONVERSATIONS[3]])
    tok = byte_tokenizer()
    assert tok.decode(ids[mask].tolist()) == "4, as\nusual<|eot_id|>"
    assert ids.tolist() == tok.encode("".join(text for text, _ in pieces)).ids + [0]


# -- packing and resume ----------------------------------------------------------------------------------


def test_windows_cut_across_turns_keep_inputs_and_labels_aligned(tmp_path):
    tok = chatml_tokenizer()
    source = write_conversations(tmp_path / "chat.jsonl", CONVERSATIONS)
    stream, targets = [], []
    for conversation in CONVERSATIONS:
        ids, marks = by_hand(tok, conversation)
        stream += ids
        targets += marks
    seq = 13
    batches = list(islice(build_dataloader(chat_cfg(tmp_path, source, seq_len=seq), tok, 2, num_workers=0), 20))
    n_windows = 2 * len(batches)
    passes = n_windows * (seq + 1) // len(stream) + 1  # one file: every pass is the same conversations in order
    stream, targets = stream * passes, targets * passes
    assert passes >= 3
    cut_inside_an_answer = 0
    for k, (inputs, labels) in enumerate(batches):
        assert inputs.shape == labels.shape == (2, seq) and labels.dtype == torch.long
        for row in range(2):
            at = (2 * k + row) * (seq + 1)
            assert inputs[row].tolist() == stream[at : at + seq]
            assert labels[row].tolist() == targets[at + 1 : at + seq + 1]
            # labels[t] is inputs[t + 1] or -100
            inner = labels[row, :-1]
            assert bool(((inner == inputs[row, 1:]) | (inner == IGNORE)).all())
            cut_inside_an_answer += targets[at + seq] != IGNORE and targets[at + seq + 1] != IGNORE
    assert cut_inside_an_answer >= 2  # some window boundaries fall inside an assistant turn


def write_shards(folder: Path, n_files: int = 4) -> Path:
    folder.mkdir()
    for f in range(n_files):
        rows = [CONVERSATIONS[(f + i) % len(CONVERSATIONS)] for i in range(4)]
        rows = [[{**m, "content": f"{m['content']} ({f}.{i})"} for m in c] for i, c in enumerate(rows)]
        write_conversations(folder / f"train-{f:05d}-of-{n_files:05d}.jsonl", rows)
    return folder


@pytest.mark.parametrize("workers, shuffle", [(0, 0), pytest.param(2, 3, marks=pytest.mark.slow)])
def test_resume_mid_stream_gives_the_same_next_batches(tmp_path, workers, shuffle):
    tok = byte_tokenizer()
    cfg = chat_cfg(tmp_path, write_shards(tmp_path / "shards"), seq_len=24, shuffle_buffer=shuffle)

    def loader():
        return build_dataloader(cfg, tok, batch_size=2, dp_rank=1, dp_world_size=2, seed=5, num_workers=workers)

    first = loader()
    batches = iter(first)
    for _ in range(7):
        next(batches)
    state = first.state_dict()
    expected = [next(batches) for _ in range(6)]
    assert any(bool((y == IGNORE).any()) and bool((y != IGNORE).any()) for _, y in expected)

    resumed = loader()
    resumed.load_state_dict(state)
    got = list(islice(resumed, 6))
    for (x, y), (x2, y2) in zip(expected, got, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    fresh_x, _ = next(iter(loader()))
    assert not torch.equal(fresh_x, got[0][0])  # the resumed loader did not start over

    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "a document"}\n')
    text_cfg = DataConfig(source=str(texts), tokenizer="byte", seq_len=24, shuffle_buffer=shuffle)
    text = build_dataloader(text_cfg, tok, 2, dp_rank=1, dp_world_size=2, seed=5, num_workers=workers)
    with pytest.raises(DataError, match=r", format: saved 'chat', now 'text'\); resume with the same data"):
        text.load_state_dict(state)


# -- the trainer's loss ----------------------------------------------------------------------------------

SEQ, VOCAB = 64, 257


def tiny_chat_config(tmp: str, model: str, source: str, micro: int, **extra):
    overrides = {
        "data.source": source,
        "data.tokenizer": "byte",
        "data.num_workers": 0,
        "data.format": "chat",
        "data.chat_template": model,
        "train.global_batch_size": 4,
        "train.micro_batch_size": micro,
        "train.max_steps": 3,
        "train.dtype": "fp32",
        "train.optimizer.lr": 3e-3,
        "train.schedule.warmup_steps": 1,
        "train.schedule.total_steps": 10,
        "checkpoint.every": 0,
        "eval.at_end": False,
        "wandb.mode": "disabled",
        **extra,
    }
    return tiny_run_config(tmp, VOCAB, SEQ, **overrides)


@torch.no_grad()
def hand_losses(model, micro_batches) -> dict[str, float]:
    """The step's loss as cross_entropy(ignore_index=-100, reduction='mean') over the whole batch, and two wrong
    normalisations it must differ from: the scored tokens' summed loss over every token (text mode's divisor),
    and the mean of the micro-batches' means."""
    logits = torch.cat([model(x) for x, _ in micro_batches]).flatten(0, 1)
    labels = torch.cat([y for _, y in micro_batches]).flatten()
    means = [F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE) for x, y in micro_batches]
    return {
        "masked_mean": F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="mean").item(),
        "over_all_tokens": (F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum") / len(labels)).item(),
        "mean_of_micro_means": (sum(means) / len(means)).item(),
    }


def train_on_chat_data(tmp: str, model: str, source: str) -> dict:
    from ladder_train.data import build_dataloader as loader_of
    from ladder_train.evaluation.perplexity import validation_loss
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    try:
        cfg = tiny_chat_config(tmp, model, source, 2, **{"eval.val_every": 3, "eval.val_batches": 2})
        trainer = Trainer(cfg, env)
        first_step = list(islice(loader_of(cfg.data, trainer.tokenizer, 2, num_workers=0), 2))  # 2 micro-batches
        expected = hand_losses(trainer.model, first_step)
        history = trainer.train()
        val = loader_of(cfg.data, trainer.tokenizer, 2, split="validation", num_workers=0, cycle=True)
        val_expected, _ = validation_loss(trainer.model, islice(val, 2))
    finally:
        dist.destroy_process_group()
    records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    return {"losses": [r["loss"] for r in history], "expected": expected, "records": records, "val": val_expected}


@pytest.mark.slow
def test_trainer_loss_is_the_mean_over_assistant_tokens(tmp_path):
    source = write_shards(tmp_path / "data", n_files=1)
    write_conversations(source / "validation-00000-of-00001.jsonl", CONVERSATIONS)
    out = run_ranks(train_on_chat_data, 1, str(tmp_path / "run"), str(model_folder(tmp_path)), str(source))[0]
    losses, expected = out["losses"], out["expected"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(expected["masked_mean"], rel=1e-5)
    assert abs(expected["masked_mean"] - expected["over_all_tokens"]) > 1e-1
    # (at initialisation every token's loss is about log(vocab), so how the micro-batches are weighted shows only
    # after training: test_masked_loss_is_the_same_over_ranks_and_micro_batches)
    train_records = [r for r in out["records"] if "loss" in r]
    assert [r["loss"] for r in train_records] == losses
    assert train_records[-1]["tokens"] == 3 * 4 * SEQ  # throughput counts every token, scored or not
    (val,) = [r["val_loss"] for r in out["records"] if "val_loss" in r]
    assert val == pytest.approx(out["val"], rel=1e-6)  # the validation loss is the scored-token mean too


def masked_batches(rank: int, world: int, micro: int):
    """Fixed global batches of 8 with a very uneven mask: row i scores its first 2 * i tokens (row 0 none), so
    ranks and micro-batches hold different numbers of scored tokens."""
    per_rank, step = 8 // world, 0
    while True:
        gen = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, VOCAB, (8, SEQ + 1), generator=gen)
        labels = tokens[:, 1:].clone()
        for i in range(8):
            labels[i, 2 * i :] = IGNORE
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        for start in range(0, per_rank, micro):
            rows = slice(mine.start + start, mine.start + start + micro)
            yield tokens[rows, :-1], labels[rows]
        step += 1


def train_on_masked_batches(tmp: str, model: str, micro: int) -> dict:
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    try:
        cfg = tiny_chat_config(tmp, model, "unused", micro, **{"train.global_batch_size": 8})
        trainer = Trainer(cfg, env, batches=masked_batches(env.rank, env.world_size, micro))
        expected = None
        if env.world_size == 1:  # the whole global batch on one rank: the hand computation
            expected = hand_losses(trainer.model, list(islice(masked_batches(0, 1, micro), 8 // micro)))
        losses = [(r["loss"], r["grad_norm"]) for r in trainer.train()]
    finally:
        dist.destroy_process_group()
    return {"losses": losses, "expected": expected}


@pytest.mark.slow
def test_masked_loss_is_the_same_over_ranks_and_micro_batches(tmp_path):
    model = str(model_folder(tmp_path))
    one = run_ranks(train_on_masked_batches, 1, str(tmp_path / "one"), model, 2)[0]
    assert one["losses"][0][0] == pytest.approx(one["expected"]["masked_mean"], rel=1e-5)
    assert abs(one["expected"]["masked_mean"] - one["expected"]["mean_of_micro_means"]) > 1e-3
    two = run_ranks(train_on_masked_batches, 2, str(tmp_path / "two"), model, 1)  # 2 ranks x 4 micro-batches of 1
    for (loss, norm), (loss2, norm2) in zip(one["losses"], two[0]["losses"], strict=True):
        assert loss2 == pytest.approx(loss, abs=1e-5) and norm2 == pytest.approx(norm, abs=1e-5)
    assert two[1]["losses"] == two[0]["losses"]


# -- bad input: one line naming the key or file ----------------------------------------------------------


def one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_bad_chat_input_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.format=sft"])
    assert one_line(err) == "key 'data.format' must be one of text, chat, got 'sft'"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.format=chat"])
    assert one_line(err).startswith("key 'data.chat_template' is required with data.format=chat: a model folder")
    cfg = load_config(None, ["run.name=my-model", "data.format=chat", "data.chat_template=/models/${run.name}"])
    assert cfg.data.chat_template == "/models/my-model"  # recipes write ${checkpoint.init_from}

    tok = byte_tokenizer()
    good = write_conversations(tmp_path / "good.jsonl", CONVERSATIONS[:2])
    with pytest.raises(DataError) as err:
        build_dataloader(DataConfig(source=str(good), format="chat"), tok, 2, num_workers=0)
    assert one_line(err).startswith("data.chat_template: required with data.format=chat")
    with pytest.raises(DataError) as err:
        build_dataloader(
            DataConfig(source=str(good), format="chat", chat_template=str(tmp_path)), tok, 2, num_workers=0
        )
    assert one_line(err) == (
        f"data.chat_template: {tmp_path}/tokenizer_config.json: not found; the chat template is read from a "
        "model folder's tokenizer_config.json"
    )
    with pytest.raises(DataError) as err:
        build_dataloader(DataConfig(source=str(good), format="sft"), tok, 2, num_workers=0)
    assert one_line(err) == "data.format: must be one of text, chat, got 'sft'"

    # the first record is checked before any loader starts; later rows when they are read
    text = tmp_path / "text.jsonl"
    text.write_text('{"text": "a plain document"}\n')
    with pytest.raises(DataError) as err:
        build_dataloader(chat_cfg(tmp_path, text, seq_len=8), tok, 2, num_workers=0)
    assert one_line(err) == f"{text}: no 'messages' key (data.format=chat) in the first record; keys: text"
    for bad_row, line, why in [
        ({"id": 9, "text": "no messages"}, 3, "no 'messages' list (data.format=chat)"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}, 3, "message 1 has no 'content'"),
        ({"messages": [{"content": "x"}]}, 3, "message 0 has no 'role'"),
    ]:
        source = write_conversations(tmp_path / "rows.jsonl", CONVERSATIONS[:2])
        source.write_text(source.read_text() + json.dumps(bad_row) + "\n" + json.dumps({"messages": CONVERSATIONS[1]}))
        with pytest.raises(DataError) as err:
            list(islice(build_dataloader(chat_cfg(tmp_path, source, seq_len=8), tok, 2, num_workers=0), 100))
        assert one_line(err) == f"{source}: line {line}: {why}"

    # parquet: a list<struct> column, whose missing fields arrive as nulls; rows count from 0
    rows = [CONVERSATIONS[1], [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}]]
    table = pa.table({"messages": rows})
    parquet = tmp_path / "chat.parquet"
    pq.write_table(table, parquet)
    with pytest.raises(DataError) as err:
        list(islice(build_dataloader(chat_cfg(tmp_path, parquet, seq_len=8), tok, 2, num_workers=0), 100))
    assert one_line(err) == f"{parquet}: row 1 (counting from 0): message 1 has no 'content'"
    pq.write_table(pa.table({"messages": ["not a conversation"]}), parquet)
    with pytest.raises(DataError) as err:
        build_dataloader(chat_cfg(tmp_path, parquet, seq_len=8), tok, 2, num_workers=0)
    assert one_line(err) == f"{parquet}: column 'messages' holds string, not a list of {{role, content}} messages"

    # a template that rewrites earlier turns cannot be cut into a mask
    (tmp_path / "m2").mkdir()
    rewriting = model_folder(
        tmp_path / "m2", CHATML.replace("message['content']", "(message['content'] if loop.last else '...')")
    )
    cfg = DataConfig(source=str(good), tokenizer="byte", format="chat", chat_template=str(rewriting), seq_len=8)
    with pytest.raises(DataError) as err:
        next(iter(build_dataloader(cfg, tok, 2, num_workers=0)))
    assert one_line(err) == (
        f"data.source: {good} (split train): a conversation: message 1 (user): the chat template "
        f"{rewriting}/tokenizer_config.json does not render the conversation prefix by prefix, so the loss mask "
        "cannot be cut out of it"
    )


# -- nothing to learn ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_bad_chat_row_read_in_a_worker_is_one_line_in_the_trainer(tmp_path):
    tok = byte_tokenizer()
    source = write_conversations(tmp_path / "rows.jsonl", CONVERSATIONS[:2])
    source.write_text(source.read_text() + json.dumps({"messages": [{"content": "x"}]}) + "\n")
    loader = build_dataloader(chat_cfg(tmp_path, source, seq_len=8), tok, 2, num_workers=2)
    with pytest.raises(DataError) as err:
        list(islice(loader, 100))
    loader.close()
    assert one_line(err) == f"{source}: line 3: message 0 has no 'role'"


@pytest.mark.slow
def test_chat_data_with_no_assistant_turn_is_refused_before_any_update(tmp_path):
    import os
    import subprocess
    import sys

    from ladder_train.config import save_config

    source = tmp_path / "data"
    source.mkdir()
    user_only = [[{"role": "user", "content": f"question {i} " * 5}] for i in range(12)]
    write_conversations(source / "train-00000-of-00001.jsonl", user_only)
    recipe = tmp_path / "recipe.yaml"
    save_config(tiny_chat_config(str(tmp_path / "run"), str(model_folder(tmp_path)), str(source), 2), recipe)
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "ladder_train.train", "--config", str(recipe)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert [line for line in done.stderr.splitlines() if line.startswith("ladder-train")] == [
        f"ladder-train: error: data.source={source}: the first global batch holds no token to learn from (no "
        "assistant turn in its conversations, or a data.chat_template that renders none)"
    ]
    assert not (tmp_path / "run" / "checkpoints").exists()  # no update, no checkpoint


def train_with_an_empty_second_batch(tmp: str, model: str) -> dict:
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    def batch(scored: bool):
        inputs = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
        return inputs, inputs.clone() if scored else torch.full_like(inputs, IGNORE)

    env = init_distributed()
    try:
        cfg = tiny_chat_config(tmp, model, "unused", 2, **{"train.max_steps": 3})
        batches = [batch(True), batch(True), batch(False), batch(False), batch(True), batch(True)]
        trainer = Trainer(cfg, env, batches=batches)
        weights = []

        def embedding():
            weight = trainer.model.tok_embeddings.weight.detach()
            return (weight.full_tensor() if hasattr(weight, "full_tensor") else weight).clone()

        for _ in range(3):
            weights.append(embedding())
            trainer.train_step()
            trainer.step += 1
            trainer.tokens_seen += trainer.batch.tokens_per_step
        weights.append(embedding())
        return {
            "changed": [not torch.equal(a, b) for a, b in zip(weights, weights[1:], strict=False)],
            "empty_skips": trainer.empty_skips,
            "lr_steps": trainer.scheduler.last_epoch,
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_later_global_batch_with_nothing_to_learn_is_skipped_and_counted(tmp_path):
    out = run_ranks(train_with_an_empty_second_batch, 1, str(tmp_path / "run"), str(model_folder(tmp_path)))[0]
    assert out["changed"] == [True, False, True]  # no update (and no weight decay) on the empty step
    assert out["empty_skips"] == 1 and out["lr_steps"] == 2


# -- a template is data: bounded in time and size ----------------------------------------------------------


@pytest.mark.parametrize(
    "template, reason",
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "it ran longer than 1 s"),
        ("{{ 'a' * 300000000 }}", "a repetition of 300,000,000 items"),
        ("{% for i in range(100000) %}{{ 'abcdefghijk' }}{% endfor %}", "it rendered more than 1,000,000 characters"),
        ("{{ 2 ** 100000000 }}", "an exponent of 100000000"),
        ("{% include 'other.jinja' %}", "no loader for this environment specified"),
        ("{{ ''.__class__.__mro__ }}", "chat template failed: "),
    ],
    ids=["nested loops", "huge repetition", "long output", "huge power", "include", "dunder access"],
)
def test_a_hostile_template_is_refused_in_one_line_within_its_limits(monkeypatch, template, reason):
    import time

    from ladder_train.data import chat
    from ladder_train.errors import InputError

    monkeypatch.setattr(chat, "MAX_RENDER_SECONDS", 1.0)
    started = time.monotonic()
    with pytest.raises(InputError) as caught:
        chat.ChatTemplate("model/tokenizer_config.json", template).render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - started < 5
    line = str(caught.value)
    assert line.startswith("model/tokenizer_config.json: chat template ") and reason in line and "\n" not in line


def test_an_ordinary_template_still_renders_and_the_alarm_is_left_as_it_was():
    import signal

    from ladder_train.data.chat import ChatTemplate

    before = signal.getsignal(signal.SIGALRM)
    text = ChatTemplate("t", CHATML).render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL)[0] == 0
