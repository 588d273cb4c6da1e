"""The checkpoint format of the sharded optimizers (ZeRO-1, ACCO, AMSP): the whole, unpadded
state (the master vector in parameter order, each group's settings and optimizer state) with
the wrapped optimizer's class, the parameter shapes and a CRC-32 of all of it, so that a
checkpoint loads on any number of ranks and a damaged or foreign one is refused by name."""

import zlib

import torch

from ..errors import CheckpointError, ShapeMismatchError

__all__ = ["FORMAT", "check_checkpoint", "checksum"]

FORMAT = "mpicomp.optim/1"


def check_checkpoint(sd, optimizer_class, shapes, numel):
    """Raises CheckpointError (or ShapeMismatchError for another model's) unless ``sd`` is
    an intact checkpoint of this format for ``optimizer_class`` over parameters of these
    ``shapes`` (a list per group) with ``numel`` elements in all."""
    if not isinstance(sd, dict) or sd.get("format") != FORMAT:
        raise CheckpointError(f"not an mpicomp.optim checkpoint (format {FORMAT!r} expected, got "
                              f"{sd.get('format') if isinstance(sd, dict) else type(sd).__name__!r})")
    missing = {"optimizer", "shapes", "param_groups", "master", "state", "checksum"} - set(sd)
    if missing:
        raise CheckpointError(f"checkpoint lacks {sorted(missing)}")
    mine = f"{optimizer_class.__module__}.{optimizer_class.__qualname__}"
    if sd["optimizer"] != mine:
        raise CheckpointError(f"checkpoint of optimizer {sd['optimizer']}, this one wraps {mine}")
    if sd["shapes"] != shapes:
        raise ShapeMismatchError(f"checkpoint is of another model: parameter shapes "
                                 f"{_first_difference(sd['shapes'], shapes)}")
    if (not torch.is_tensor(sd["master"]) or tuple(sd["master"].shape) != (numel,)
            or len(sd["state"]) != len(shapes) or len(sd["param_groups"]) != len(shapes)):
        raise CheckpointError("checkpoint is corrupt: master vector or group lists of the wrong size")
    try:
        crc = checksum(sd)
    except (AttributeError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint is corrupt: {e}") from None
    if crc != sd["checksum"]:
        raise CheckpointError("checkpoint is corrupt: its checksum does not match its contents")


def checksum(sd):
    groups = [sorted(g.items()) for g in sd["param_groups"]]  # key order is not content
    crc = zlib.crc32(repr((sd["optimizer"], sd["shapes"], groups)).encode())
    crc = zlib.crc32(sd["master"].detach().cpu().contiguous().numpy().tobytes(), crc)
    for group in sd["state"]:
        for key in sorted(group):
            v = group[key]
            data = v.detach().cpu().contiguous().numpy().tobytes() if torch.is_tensor(v) else repr(v).encode()
            crc = zlib.crc32(key.encode() + data, crc)
    return crc


def _first_difference(a, b):
    flat_a = [s for g in a for s in g] if isinstance(a, list) else a
    flat_b = [s for g in b for s in g]
    for i, (x, y) in enumerate(zip(flat_a, flat_b)):
        if x != y:
            return f"differ at parameter {i}: {x} saved, {y} here"
    return f"differ in count: {len(flat_a)} saved, {len(flat_b)} here"
