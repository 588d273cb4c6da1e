"""python -m mpicomp [--preload | --libs | --version]: the settings, the interposer's path or link flags, the version."""
import sys

from .config import main

sys.exit(main())
