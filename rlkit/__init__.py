"""rlkit: the math of GRPO, GSPO, ASPO, AEPO, SPO and HAPO as plain torch functions, with a tiny trainer,
notebooks and a verl plugin. See README.md."""

__version__ = "0.1.0"
