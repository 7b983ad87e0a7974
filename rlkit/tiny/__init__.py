"""The teaching-scale engine: a character tokenizer, a tiny RoPE decoder, a batched KV-cached sampler with tool
interception, SFT and the RL loop (``rl``; its settings ``config``, its state and checkpoints ``checkpoint``) — small
enough to train from scratch on a 2-core CPU.

Import the submodules (``rlkit.tiny.model``, ``rlkit.tiny.sampler``, ...); this package imports nothing, so
``import rlkit`` stays light.
"""
