"""The transformers configuration of a Ladder Residual Llama (arXiv 2501.06589): a ``LlamaConfig`` plus the
residual layout. Imports only transformers, so it also runs from an export folder with ``trust_remote_code``."""

from transformers import LlamaConfig

RESIDUAL_LAYOUTS = ("standard", "parallel", "ladder")


class LadderLlamaConfig(LlamaConfig):
    """``residual``: standard | parallel | ladder. ``ladder_layers`` (ladder only): the last N layers are ladder
    layers and the first L - N standard (a hybrid, as a converted pretrained Llama); None = every layer."""

    model_type = "ladder_llama"

    residual: str = "ladder"
    ladder_layers: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.residual not in RESIDUAL_LAYOUTS:
            raise ValueError(f"residual={self.residual!r}: must be one of {', '.join(RESIDUAL_LAYOUTS)}")
        n = self.ladder_layers
        if n is not None and not (self.residual == "ladder" and 0 <= n <= self.num_hidden_layers):
            raise ValueError(f"ladder_layers={n!r}: a ladder needs 0..num_hidden_layers, other layouts null")

    def layer_layouts(self) -> list[str]:
        """The layout of each layer, first to last."""
        if self.residual != "ladder":
            return [self.residual] * self.num_hidden_layers
        n_ladder = self.num_hidden_layers if self.ladder_layers is None else self.ladder_layers
        return ["standard"] * (self.num_hidden_layers - n_ladder) + ["ladder"] * n_ladder


__all__ = ["LadderLlamaConfig"]
