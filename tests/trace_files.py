"""The project files a piece of work runs through: a profiler hook records every function called in
ladder_train/ (module bodies, i.e. imports, do not count). Used by test_structure.py against docs/design.md."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ladder_train"


class FileTrace:
    def __init__(self):
        self.files: set[str] = set()
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
