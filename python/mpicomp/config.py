"""Process-wide settings of the compressed collectives.

Each setting starts from an environment variable (read at import) and can be changed at run
time; all ranks must use the same values, or their calls disagree and raise
ShapeMismatchError (never a hang). Every call that travels uncompressed is counted with its
reason in ``mpicomp.stats()`` (and printed at exit with ``MPICOMP_STATS=1``).

=====================  ==============================  ============================================
attribute              environment variable            meaning
=====================  ==============================  ============================================
``min_bytes``          ``MPICOMP_MIN_BYTES``           messages with fewer input bytes are sent
                                                       uncompressed (latency bound: encoding only
                                                       adds time). Default 65536: from there every
                                                       codec beat ``none`` on a 10 Gbit/s link
                                                       (1 Gbit/s: from 4 KiB; README, "Measured").
                                                       Codec bound's sums only where MPI's own
                                                       sums keep its bound (docs/error_bound.md).
``eager_bytes``        ``MPICOMP_EAGER_BYTES``         uncompressed allreduces (reduce-scatter
                                                       inputs, allgather outputs) up to this size
                                                       travel with the agreement step itself (one
                                                       round of latency); on two ranks all of
                                                       them do, whatever the size. Default
                                                       32768. 0 turns it off. Also send/recv's
                                                       one-message limit.
``segment_bytes``      ``MPICOMP_SEGMENT_BYTES``       input bytes per pipelined message: encoding
                                                       of one segment overlaps sending the previous.
                                                       Codecs compressing more than 8x (sign) take
                                                       longer segments, to put segment_bytes / 8 on
                                                       the wire per message. An allreduce goes a
                                                       tile of one segment per rank at a time, so
                                                       that its float32 sums stay in cache, the
                                                       next tile's first stage in flight beside
                                                       this tile's second. Default 512 KiB.
``gpu_segment_bytes``  ``MPICOMP_GPU_SEGMENT_BYTES``  segment_bytes for a call where any rank's
                                                       buffers are on a GPU: each segment costs the
                                                       GPU engine kernel launches and a stream
                                                       synchronisation (docs/gpu.md). Default
                                                       32 MiB. Python API only (the interposer
                                                       takes host buffers).
``skip_local``         ``MPICOMP_SKIP_LOCAL``          1: send uncompressed when all ranks of the
                                                       communicator share one node's memory, where
                                                       MPI's shared-memory copies beat any codec
                                                       (README, "Measured"; send/recv still
                                                       compress). Default 0: the codec you name is
                                                       the codec applied, on one node as on many.
``verbose``            ``MPICOMP_VERBOSE``             1: rank 0 prints one line the first time a
                                                       collective travels uncompressed for a reason
                                                       other than codec "none" (below min_bytes,
                                                       one rank, skip_local). Default 0.
``timeout_s``          ``MPICOMP_TIMEOUT``             seconds a call may wait for the other ranks
                                                       before it raises CommTimeoutError on every
                                                       rank that waits (a rank that never arrives
                                                       does not hang the others). Default 1800,
                                                       torch's process-group default (the
                                                       interposer: 0, no limit, as MPI); one
                                                       communicator's own: mpicomp.set_timeout.
                                                       0: no limit. A wait not done within 0.1 ms
                                                       sleeps between its polls. Not covered: a
                                                       communicator's first mpicomp call, which
                                                       makes its private duplicate and node layout
                                                       with MPI's own (blocking) MPI_Comm_dup and
                                                       MPI_Comm_split.
``cache_bytes``        ``MPICOMP_CACHE_BYTES``         scratch memory a thread keeps between calls;
                                                       beyond it, buffers are freed after each
                                                       call, largest first. Default 128 MiB.
                                                       GPU buffers: uncompressed calls whose
                                                       input and output fit it keep pinned host
                                                       memory of that size as well; a larger
                                                       uncompressed allreduce goes in pieces of
                                                       half of it (on every rank).
``hierarchy``          ``MPICOMP_HIERARCHY``           "auto": on a communicator spanning several
                                                       nodes with several ranks on some node,
                                                       allreduce runs in two levels: exact inside
                                                       each node, compressed between nodes, so each
                                                       byte crosses a node's network card once
                                                       (docs/cluster.md). "flat": every rank
                                                       exchanges with every other. Default "auto".
``ranks_per_node``     ``MPICOMP_RANKS_PER_NODE``      0: nodes are the ranks that share memory
                                                       (MPI_Comm_split_type). K: ranks r of
                                                       COMM_WORLD with the same r // K form a node
                                                       (emulated nodes, block placement). A
                                                       communicator's layout is fixed at its first
                                                       mpicomp call. Default 0.
``auto_reprobe_s``     ``MPICOMP_AUTO_REPROBE``        codec "auto" (mpicomp.auto) measures a
                                                       communicator again when its calls run 1.5x
                                                       slower (or faster) than it measured, at most
                                                       this often: seconds. 0: never. Default 60.
``codec_threads``      ``MPICOMP_CODEC_THREADS``       threads that share one call's encoding and
                                                       decoding (every host codec; results
                                                       identical whatever the count). Set 0 for the default:
                                                       the cores this process may run on divided
                                                       by the ranks the launcher started on this
                                                       node (MPI_LOCALNRANKS, Open MPI's
                                                       OMPI_COMM_WORLD_LOCAL_SIZE). Reads back the
                                                       count in use. Does not shape the wire.
=====================  ==============================  ============================================

``mpicomp-config --preload`` (or ``python -m mpicomp --preload``) prints the path of
the LD_PRELOAD interposer library, which reads its own ``MPICOMP_*`` variables (README).
"""

import os
import sys
import warnings
from importlib.metadata import version
from pathlib import Path

from . import _core
from .errors import ArgumentError

__all__ = ["config"]

# The core's Config fields, in get_config()'s order, and the codecs' own setting.
_FIELDS = ("min_bytes", "eager_bytes", "segment_bytes", "skip_local", "verbose", "timeout_s", "cache_bytes",
           "hierarchy", "ranks_per_node", "auto_reprobe_s", "gpu_segment_bytes")
_SETTINGS = _FIELDS + ("codec_threads",)
_HIERARCHY = ("auto", "flat")  # the core's Hierarchy values, in order
# {setting: (variable, kind, lo, hi)}: the core's table (cpp/coll/environment.h), by which
# the interposer reads its variables too.
_RULES = _core.setting_rules()


class _Config:
    __slots__ = ()

    def __getattr__(self, name):
        if name == "codec_threads":
            return _core.codec_threads()
        if name not in _FIELDS:
            raise AttributeError(name)
        value = _core.get_config()[_FIELDS.index(name)]
        return _HIERARCHY[value] if name == "hierarchy" else value

    def __setattr__(self, name, value):
        if name not in _SETTINGS:
            raise AttributeError(f"mpicomp.config has no setting {name!r}; settings: {', '.join(_SETTINGS)}")
        if name == "hierarchy":
            if value not in _HIERARCHY:
                raise ArgumentError(f"mpicomp.config.hierarchy must be one of {', '.join(map(repr, _HIERARCHY))}, "
                                    f"got {value!r}")
            value = _HIERARCHY.index(value)
            return self._store(name, value)
        _, kind, lo, hi = _RULES[name]
        if kind == "flag" and isinstance(value, bool):
            value = int(value)
        if kind == "seconds":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise ArgumentError(f"mpicomp.config.{name} must be a number of seconds in [{lo}, {hi:g}], "
                                    f"got {value!r}")
            value = float(value)
        elif not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise ArgumentError(f"mpicomp.config.{name} must be an integer in [{lo}, {hi}], got {value!r}")
        if name == "codec_threads":  # the codecs' own setting (layer 1), not the collectives'
            return _core.set_codec_threads(value)
        self._store(name, value)

    @staticmethod
    def _store(name, value):
        current = list(_core.get_config())
        current[_FIELDS.index(name)] = value
        _core.set_config(*current)

    def __repr__(self):
        return "mpicomp.config(" + ", ".join(f"{f}={getattr(self, f)}" for f in _SETTINGS) + ")"


config = _Config()
# A lost rank raises instead of hanging: torch's default process-group timeout, unless
# MPICOMP_TIMEOUT says otherwise (read below).
DEFAULT_TIMEOUT_S = 1800.0
config.timeout_s = DEFAULT_TIMEOUT_S


def _importer_level():
    """warnings.warn's stacklevel of the first frame outside mpicomp: the program's own import
    line, whichever of mpicomp's modules imported this one (the warnings module skips the
    import machinery's frames itself)."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            if not os.path.abspath(name).startswith(here):
                return level
            level += 1
        frame = frame.f_back
    return 1


# A misspelt variable is reported, not silently ignored (the list: cpp/coll/environment.cpp).
for _unknown in _core.unknown_environment():
    warnings.warn(f"mpicomp: unknown variable {_unknown} ignored (a misspelling? README: Configuration)",
                  stacklevel=_importer_level())

# Every MPICOMP_* setting, checked at import by the core's rules: an invalid one raises
# ArgumentError ("invalid setting MPICOMP_MIN_BYTES=lots: expected a byte count ..."), as
# the interposer refuses it at MPI_Init.
_ENVIRONMENT = _core.environment_settings()
for _name, _value in _ENVIRONMENT.items():
    if _name in _SETTINGS:
        setattr(config, _name, _value)


def from_environment(name, default=None):
    """The value of setting ``name`` ("stats", "error_feedback", or one of config's) that its
    MPICOMP_* variable gives, checked at import; ``default`` when it is not set."""
    return _ENVIRONMENT.get(name, default)


def preload_path():
    """Path of libmpicomp_pmpi.so, the interposer for unmodified MPI programs."""
    return str(Path(__file__).with_name("libmpicomp_pmpi.so"))


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(
        prog="mpicomp-config",
        description="mpicomp's settings and the paths a build or launcher needs. Without an option: the "
                    "settings in force (mpicomp.config, from MPICOMP_* variables).")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preload", action="store_true",
                   help="path of the interposer library, for LD_PRELOAD=... (unmodified MPI programs)")
    g.add_argument("--libs", action="store_true",
                   help="linker flags that link the interposer into a program instead of preloading it")
    g.add_argument("--version", action="store_true", help="mpicomp's version")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.preload:
        print(preload_path())
    elif args.libs:
        lib = Path(preload_path()).parent
        print(f"-L{lib} -Wl,-rpath,{lib} -lmpicomp_pmpi")
    elif args.version:
        print(version("mpicomp"))
    else:
        print(config)
    return 0
