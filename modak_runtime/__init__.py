"""MODAK's runtime: applies a plan's knobs to an unmodified training script and measures it.

    python3 -m modak_runtime -- train.py ARGS...
    python3 -m modak_runtime -- -m package.module ARGS...

It reads the plan from the environment the job script exports (``MODAK_THREADS``,
``MODAK_TORCH_COMPILE``, ``MODAK_PRECISION``, ``MODAK_CHANNELS_LAST``, ``MODAK_JIT_COMPILE``,
``MODAK_ALLOCATOR`` with ``LD_PRELOAD``, ``MODAK_MAX_STEPS``, a trial's ``MODAK_SEED``,
...), installs post-import hooks for the frameworks, runs the script as ``python3 train.py
ARGS`` would, and prints one figure-of-merit record (``{"modak": "fom", ...}``, see
:mod:`modak_runtime.record`).

Standard library and the user's own framework only: a training image carries this package
(or the run directory does), never the planner.  With no ``MODAK_*`` knob set it changes
nothing the script computes.
"""
__version__ = "0.2.0"
