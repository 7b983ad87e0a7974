"""rlkit: the math of GRPO and the policy-optimization methods that change it as plain torch functions
(``rlkit methods`` lists them), with a tiny trainer, notebooks and a verl plugin. See README.md."""

from rlkit import numerics as _numerics

_numerics.pin()  # before torch loads: the float kernels every machine can share (rlkit/numerics.py)

__version__ = "0.1.0"
