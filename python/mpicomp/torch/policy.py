"""Which codec compresses which traffic: the hybrid compression policy of Xu et al.,
"Accelerating Large Language Model Training with Hybrid GPU-based Compression"
(arXiv 2409.02423).

Their finding: data-parallel gradients tolerate aggressive compression (they are averaged
over replicas and, with error feedback, what is dropped is carried to the next step), while
tensor- and pipeline-parallel traffic (activations in the forward pass, their gradients in
the backward pass) feeds straight into the next layer and must be compressed mildly.
Compressing everything aggressively ("naive") moves fewer bytes but the loss suffers.
"""

import mpicomp

from ..errors import ArgumentError

__all__ = ["Policy"]

_KINDS = {"dp": ("gradients",), "tp": ("forward", "backward"), "pp": ("forward", "backward")}


def _parse(dim, value):
    """{kind: Codec} for one dimension; value is a codec (spec or Codec) or {kind: codec}."""
    kinds = _KINDS[dim]
    if isinstance(value, dict):
        unknown = set(value) - set(kinds)
        if unknown:
            raise ArgumentError(f"Policy: {dim} has no traffic kind {sorted(unknown)[0]!r} "
                                f"(kinds: {', '.join(kinds)})")
        missing = [k for k in kinds if k not in value]
        if missing:
            raise ArgumentError(f"Policy: {dim} needs a codec for {', '.join(missing)} too")
        return {k: mpicomp.codec(value[k]) for k in kinds}
    return {k: mpicomp.codec(value) for k in kinds}


class Policy:
    """A codec for each parallel dimension and traffic kind.

    Args:
        dp: codec for data-parallel gradient allreduces (spec string such as "int4", or an
            mpicomp.Codec).
        tp: codec for tensor-parallel collectives, or a dict {"forward": codec, "backward":
            codec} to compress activations and activation gradients differently.
        pp: codec for pipeline sends between stages, or a {"forward", "backward"} dict as tp.
        dp_error_feedback: keep per-tensor error feedback for the dp gradients (recommended
            for any lossy dp codec: without it the dropped part of every step is lost).

    Presets (``Policy.preset(name)``):
        "none": no compression anywhere (the baseline).
        "naive": the aggressive codec everywhere, without error feedback (the paper's
            naive scheme: fewest bytes, worse loss).
        "hybrid": the aggressive codec with error feedback for dp gradients, the mild codec
            for tp and pp traffic (the paper's scheme: baseline loss, far fewer bytes).

    Raises:
        CodecError: an unknown codec spec; ArgumentError: an unknown dimension or kind.
    """

    PRESETS = ("none", "naive", "hybrid")

    def __init__(self, dp="none", tp="none", pp="none", dp_error_feedback=False):
        if not isinstance(dp_error_feedback, bool):
            raise ArgumentError(f"Policy: dp_error_feedback must be a bool, got {dp_error_feedback!r}")
        self._codecs = {"dp": _parse("dp", dp), "tp": _parse("tp", tp), "pp": _parse("pp", pp)}
        self.dp_error_feedback = dp_error_feedback
        self.name = "custom"

    @classmethod
    def preset(cls, name, aggressive="int4:block=32", mild="int8"):
        """A named policy (see the class docstring).

        Args:
            name: "none", "naive" or "hybrid".
            aggressive: codec of "naive" everywhere and of "hybrid" for dp gradients.
                By default int4 with a scale per 32 elements (6.4x fewer bytes than
                float32): in examples/train_gpt.py (AdamW) it reached the baseline loss
                where int4 with 256-element blocks (7.8x) stayed 1.3% above it. "sign"
                (28x) needs error feedback to converge at all.
            mild: codec of "hybrid" for tp and pp traffic; int8 (3.9x) by default, "bf16"
                (2x) is milder still, "lossless" (Blosc2, 1.2x on activations) changes no
                number: the role of the lossless float compressor in the hybrid design
                (docs/torch.md measures where each pays).
        """
        if name == "none":
            p = cls()
        elif name == "naive":
            p = cls(dp=aggressive, tp=aggressive, pp=aggressive)
        elif name == "hybrid":
            p = cls(dp=aggressive, tp=mild, pp=mild, dp_error_feedback=True)
        else:
            raise ArgumentError(f"Policy.preset: name must be one of {', '.join(cls.PRESETS)}, got {name!r}")
        p.name = name
        return p

    def codec(self, dim, kind):
        """The Codec for traffic ``kind`` ("gradients" for dp; "forward" or "backward" for
        tp and pp) along dimension ``dim`` ("dp", "tp", "pp")."""
        if dim not in _KINDS:
            raise ArgumentError(f"Policy.codec: dim must be one of 'dp', 'tp', 'pp', got {dim!r}")
        if kind not in _KINDS[dim]:
            raise ArgumentError(f"Policy.codec: {dim} traffic kind must be one of {', '.join(_KINDS[dim])}, "
                                f"got {kind!r}")
        return self._codecs[dim][kind]

    def describe(self):
        """A dict of spec strings, e.g. for a training log."""
        out = {f"{d}.{k}": c.spec for d, kinds in self._codecs.items() for k, c in kinds.items()}
        out["dp.error_feedback"] = self.dp_error_feedback
        return out

    def __repr__(self):
        return f"Policy({self.name}: {', '.join(f'{k}={v}' for k, v in self.describe().items())})"
