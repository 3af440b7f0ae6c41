"""The project files and functions a piece of work runs through: a profiler hook records every function called in
ladder_train/ (module bodies, i.e. imports, do not count; nor lambdas and comprehensions, read as part of the
function they sit in). Used by test_structure.py against docs/design.md."""

from __future__ import annotations

import ast
import sys
import threading
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ladder_train"


class FileTrace:
    def __init__(self):
        self.files: set[str] = set()
        self.functions: set[tuple[str, int, str]] = set()  # (file in the package, first line, name)
        self._names: dict[str, str | None] = {}  # co_filename -> path inside the package, or None

    def _name(self, filename: str) -> str | None:
        if filename not in self._names:
            path = Path(filename).resolve()
            self._names[filename] = path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else None
        return self._names[filename]

    def _hook(self, frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name != "<module>" and (name := self._name(code.co_filename)):
            self.files.add(name)
            if not code.co_name.startswith("<"):
                self.functions.add((name, code.co_firstlineno, code.co_qualname))

    def start(self):
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)

    def stop(self):
        sys.setprofile(None)
        threading.setprofile(None)


def training_step_files(recipe: str, run_dir: str) -> list[str]:
    """`ladder-train --config RECIPE` in this process, traced from the command line to the end of the first
    optimizer step (its train_step)."""
    import ladder_train.cli as cli
    import ladder_train.cli.train  # noqa: F401  (imported before tracing: imports do not count)
    from ladder_train.train import trainer

    trace = FileTrace()
    first_step = trainer.Trainer.train_step

    def traced_step(self):
        result = first_step(self)
        trace.stop()
        return result

    trainer.Trainer.train_step = traced_step
    trace.start()
    argv = ["--config", recipe, f"run.dir={run_dir}", "train.max_steps=1", "data.num_workers=0", "wandb.mode=disabled"]
    status = cli.main(argv)
    trace.stop()
    assert status == 0
    return sorted(trace.files)


def decode_step_files() -> list[str]:
    """Rank 0 of a TP 2 ladder model (gloo), one decode step of the generator, traced alone."""
    import torch
    import torch.distributed as dist

    from ladder_train.inference import Generator, load_tp_model

    dist.init_process_group("gloo")
    try:
        model = load_tp_model("tiny", tp_rank=dist.get_rank(), tp_size=2, residual="ladder", vocab_size=64)
        generator = Generator(model, dist.group.WORLD)
        generator.setup(1, 8)
        prompt = torch.tensor([[1, 2, 3]])
        token = generator.prefill(prompt).argmax(-1)
        trace = FileTrace()
        trace.start()  # one step of Generator.generate's loop: logits, the next token, the ranks agree on it
        # sampled: the path that also samples and broadcasts (greedy argmax runs inside the step)
        sampler = torch.Generator().manual_seed(0)
        token = generator._next(generator._decode, (token[:, None], prompt.shape[1]), 1.0, 5, sampler)
        trace.stop()
        generator.release()
        return sorted(trace.files)
    finally:
        dist.destroy_process_group()


@cache
def _own_body_lines(path: str) -> dict[int, int]:
    """First line of each function of ``ladder_train/PATH`` (its first decorator's, as the code object counts it) ->
    the lines of its body a reader reads: docstring left out, and the functions and classes defined inside it too
    (they count as functions of their own when they run)."""
    tree = ast.parse((PACKAGE / path).read_text())
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    found = {}
    for node in (n for n in ast.walk(tree) if isinstance(n, defs)):
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1:
            body = body[1:]
        lines = body[-1].end_lineno - body[0].lineno + 1
        for inner in (n for n in ast.walk(node) if n is not node and isinstance(n, (*defs, ast.ClassDef))):
            if inner.lineno >= body[0].lineno:
                lines -= inner.end_lineno - min([d.lineno for d in inner.decorator_list] + [inner.lineno]) + 1
        found[min([d.lineno for d in node.decorator_list] + [node.lineno])] = lines
    return found


def reading(functions: set[tuple[str, int, str]]) -> dict:
    """What a reader of the traced functions reads: the files, ``file:name`` per function, and their body lines."""
    lines = sum(_own_body_lines(path)[first] for path, first, _ in functions)
    names = sorted(f"{path}:{name}" for path, _, name in functions)
    return {"files": sorted({path for path, _, _ in functions}), "functions": names, "lines": lines}


def steady_step_reading(run_dir: str, token_folder: str) -> dict | None:
    """Rank 0's steady step in the setup users run (the launcher's ranks under FSDP, a token folder, bf16): the
    second turn of ``Trainer.train``'s loop, from its ``_step`` to the next one's start (the step, its logged record,
    and the components asked whether they act: validation, checkpoint, evaluation, profiler). Other ranks train the
    same steps and return None."""
    from tiny import tiny_run_config

    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer, trainer

    env = init_distributed()
    trace, calls = FileTrace(), []
    plain_step = trainer.Trainer._step

    def traced_step(self, logger):
        calls.append(None)
        if env.is_main and len(calls) == 2:
            trace.start()
        elif env.is_main and len(calls) == 3:
            trace.stop()
        return plain_step(self, logger)

    trainer.Trainer._step = traced_step
    try:
        keys = {
            "data.source": token_folder,
            "data.tokenizer": "byte",
            "train.dtype": "bf16",
            "train.max_steps": 3,
            "eval.at_end": False,
        }
        batch = {"train.global_batch_size": 8, "train.micro_batch_size": 2, "train.schedule.warmup_steps": 1}
        cfg = tiny_run_config(run_dir, vocab=257, seq=16, **keys, **batch, **{"train.schedule.total_steps": 3})
        Trainer(cfg, env).train()
    finally:
        trace.stop()
        trainer.Trainer._step = plain_step
        import torch.distributed as dist

        dist.destroy_process_group()
    return reading(trace.functions) if env.is_main else None
