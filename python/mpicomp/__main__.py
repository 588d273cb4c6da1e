"""python -m mpicomp [--preload]: the settings, or the path of the LD_PRELOAD interposer."""
import sys

from .config import main

sys.exit(main())
