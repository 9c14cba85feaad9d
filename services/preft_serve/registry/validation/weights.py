"""Reading ``adapter_model.safetensors`` without loading it into memory.

The safetensors library validates the header (offsets, sizes, dtypes); values are then
read through a read-only memory map in bounded chunks, so a large file costs page cache,
not heap. NaN/Inf are found from the exponent bits, which works the same for F32, F16 and
BF16 (numpy has no bfloat16).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from preft_serve.common.text import clip

_CHUNK = 1 << 22  # elements per finite-check step
# dtype -> (unsigned view, exponent mask): all exponent bits set means Inf or NaN.
_EXPONENT = {
    "F32": (np.uint32, 0x7F800000),
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
    "F64": (np.uint64, 0x7FF0000000000000),
}
_FLOATS = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
MAX_HEADER_BYTES = 4 << 20
"""A safetensors header is one JSON entry (~150 bytes) per tensor: a LoRA on all seven
projections of an 80-layer model has 1,120 (~170 KB). The cap is checked before the header
is parsed: the library accepts headers up to 100 MB, and Python's ``json.loads`` of one
holds ~12 bytes per header byte."""
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
CONVERT_HINT = (
    "convert it to safetensors with `preft adapter convert <adapter folder>` (which reads it "
    "with torch.load(weights_only=True) only), or save it with "
    "`model.save_pretrained(dir, safe_serialization=True)`"
)


class WeightsFormatError(ValueError):
    """Not a readable safetensors file; the message says what it looks like instead."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def sniff_pickle(head: bytes) -> bool:
    """True for pickle or torch.save (zip) content, whatever the file is called."""
    return head.startswith(_PICKLE_MAGIC) or head.startswith(b"PK\x03\x04")


class WeightsFile:
    """Tensor table of a safetensors file plus value access through a memory map."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            head = fh.read(9)
            if sniff_pickle(head):
                raise WeightsFormatError(
                    f"adapter_model.safetensors holds a pickled PyTorch checkpoint, which the "
                    f"registry never loads; {CONVERT_HINT}"
                )
            if len(head) < 9 or head[8:9] != b"{":
                raise WeightsFormatError(
                    "adapter_model.safetensors is not a safetensors file (no JSON header); "
                    f"{CONVERT_HINT}"
                )
            header_len = int.from_bytes(head[:8], "little")
            if header_len > MAX_HEADER_BYTES:
                raise WeightsFormatError(
                    f"adapter_model.safetensors has a {header_len}-byte header; the limit is "
                    f"{MAX_HEADER_BYTES} (an adapter's tensor table is a few hundred KB at "
                    "most)"
                )
            try:
                with safe_open(str(self.path), framework="numpy"):
                    pass  # validates header, offsets and sizes
            except (SafetensorError, OSError, ValueError) as exc:
                # The library's message may quote the header (an unknown dtype, in full).
                raise WeightsFormatError(
                    f"adapter_model.safetensors is not a valid safetensors file: {clip(str(exc))}"
                ) from None
            fh.seek(8)
            header = json.loads(fh.read(header_len))
        base = 8 + header_len
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self.tensors: dict[str, TensorInfo] = {
            name: TensorInfo(
                name,
                spec["dtype"],
                tuple(spec["shape"]),
                base + spec["data_offsets"][0],
                base + spec["data_offsets"][1],
            )
            for name, spec in header.items()
        }
        self._max_abs: dict[str, float] = {}

    def _raw(self, info: TensorInfo) -> np.ndarray:
        if info.end == info.start:
            return np.empty(0, dtype=np.uint8)
        return np.memmap(
            self.path, dtype=np.uint8, mode="r", offset=info.start, shape=(info.end - info.start,)
        )

    def has_non_finite(self, name: str) -> bool:
        """Whether a float tensor holds NaN or Inf (other dtypes: False)."""
        info = self.tensors[name]
        if info.dtype not in _EXPONENT:
            return False
        view, mask = _EXPONENT[info.dtype]
        bits = self._raw(info).view(view)
        return any(np.any(bits[i : i + _CHUNK] & mask == mask) for i in range(0, bits.size, _CHUNK))

    def max_abs(self, name: str) -> float:
        """Largest |value| of a float tensor (finite values assumed), read in chunks."""
        if name in self._max_abs:
            return self._max_abs[name]
        info = self.tensors[name]
        raw = self._raw(info)
        if info.dtype == "BF16":
            values = raw.view(np.uint16)
        elif info.dtype in _FLOATS:
            values = raw.view(_FLOATS[info.dtype])
        else:
            raise ValueError(f"{name} is not a float tensor ({info.dtype})")
        largest = 0.0
        for i in range(0, values.size, _CHUNK):
            chunk = values[i : i + _CHUNK]
            if info.dtype == "BF16":
                chunk = (chunk.astype(np.uint32) << 16).view(np.float32)
            largest = max(largest, float(np.max(np.abs(chunk))))
        self._max_abs[name] = largest
        return largest

    def array(self, name: str) -> np.ndarray:
        """A (small) float tensor as float32, for value checks such as orthonormality."""
        info = self.tensors[name]
        raw = self._raw(info)
        if info.dtype == "BF16":
            values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info.dtype in ("F16", "F32", "F64"):
            values = raw.view(
                {"F16": np.float16, "F32": np.float32, "F64": np.float64}[info.dtype]
            ).astype(np.float32)
        else:
            raise ValueError(f"{name} is not a float tensor ({info.dtype})")
        return values.reshape(info.shape)
