"""Moved to :mod:`rlkit.verl.launch.data` (the datasets in verl's row schema, part of the launcher).

This name is that very module, kept for the callers outside rlkit/verl (the reproduction app, benchmarks, tests,
README and the book) until they import the new path; no module of the plugin imports it
(``tests/test_verl_split.py``)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("rlkit.verl.launch.data")
