"""One module per method: its ``Config``, its functions, its hooks (:mod:`rlkit.hooks`) and their registration in
:mod:`rlkit.registry`, which importing this package does. A method module imports only :mod:`rlkit.core`,
:mod:`rlkit.hooks` and :mod:`rlkit.registry`; adding a method is one module here (the registry imports every module
of this folder: :func:`rlkit.registry.import_method_modules`; the imports below are the methods that came first) and
its tests (README: "Adding a method"). A method's policy loss is its paper's math, and the code every run trains
with."""

from rlkit.methods import aepo, aspo, cispo, dapo, dr_grpo, grpo, gspo, hapo, spo

__all__ = ["aepo", "aspo", "cispo", "dapo", "dr_grpo", "grpo", "gspo", "hapo", "spo"]
