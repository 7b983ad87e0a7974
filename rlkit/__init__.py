"""rlkit: the math of GRPO, GSPO, ASPO, AEPO, SPO and HAPO as plain torch functions, with a tiny trainer,
notebooks and a verl plugin. See README.md."""

from rlkit import numerics as _numerics

_numerics.pin()  # before torch loads: the float kernels every machine can share (rlkit/numerics.py)

__version__ = "0.1.0"
