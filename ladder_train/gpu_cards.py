"""The dense bf16 tensor-core peak of each GPU card: the one table that the trainer's MFU (``train/observability.py``) and
ladder-predict's GPU profiles (``card: NAME`` in ``predict/hardware.yaml``) read.

A card is found by the longest of its ``match`` substrings that occurs in ``torch.cuda.get_device_name()``
(case-insensitive), so "H200 NVL" wins over "H200"; a card this table does not know has no peak (MFU null), never
another card's. NVIDIA's datasheets give the bf16 figures with sparsity: the dense peak is half.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    """A GPU card: the substrings of its device name, its dense bf16 peak (FLOP/s) and the datasheet it is from."""

    name: str
    match: tuple[str, ...]
    peak_flops: float
    source: str


CARDS = {
    card.name: card
    for card in (
        Card(
            "h100_sxm",
            ("H100 80GB HBM3", "H100 SXM"),  # "NVIDIA H100 80GB HBM3" is how torch names the SXM5 card
            989.4e12,
            "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 1,979 TFLOPS with sparsity",
        ),
        Card(
            "h100_pcie",
            ("H100 PCIe",),
            756e12,
            "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: BF16 1,513 TFLOPS with sparsity",
        ),
        Card(
            "h100_nvl",
            ("H100 NVL",),
            835e12,
            "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL: BF16 1,671 TFLOPS with sparsity",
        ),
        Card(
            "h200",
            ("H200",),  # also GH200 (its Hopper GPU has the H100 SXM tensor cores: 1,979 TFLOPS with sparsity)
            989.4e12,
            "NVIDIA H200 datasheet, H200 SXM: BF16 1,979 TFLOPS with sparsity (same Hopper die as H100 SXM)",
        ),
        Card(
            "h200_nvl",
            ("H200 NVL",),
            835e12,
            "NVIDIA H200 datasheet, H200 NVL: BF16 1,671 TFLOPS with sparsity",
        ),
        Card(
            "a100",
            ("A100",),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", ...
            312e12,
            "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS (624 with sparsity), SXM and PCIe alike",
        ),
    )
}


def card_for(device_name: str) -> Card | None:
    """The card whose longest ``match`` substring occurs in ``device_name`` (case-insensitive; the most specific
    wins: "H200 NVL" over "H200"), or None: an unknown card never borrows another card's figure."""
    name = device_name.casefold()
    found = [(len(m), card) for card in CARDS.values() for m in card.match if m.casefold() in name]
    return max(found, key=lambda hit: hit[0])[1] if found else None


def peak_flops_for(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the card ``torch.cuda.get_device_name()`` calls ``device_name``, or None."""
    card = card_for(device_name)
    return card.peak_flops if card else None
