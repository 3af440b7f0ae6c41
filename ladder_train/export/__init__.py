"""Hub-ready model folders from a training checkpoint or a Hugging Face format folder: weights and config in
Hugging Face Llama names, the tokenizer, generation_config.json, the transformers classes of a parallel, ladder
or desync model, and a model card (``writer``, ``model_card``). ``ladder-export`` and the trainer's ``eval.mode=slurm`` use
it."""

from .writer import export_checkpoint, export_folder

__all__ = ["export_checkpoint", "export_folder"]
