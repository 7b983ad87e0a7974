"""The teaching-scale engine: a character tokenizer, a tiny RoPE decoder, a batched KV-cached sampler with tool
interception, SFT and the RL loop, small enough to train from scratch on a 2-core CPU. Import the submodules: this
package imports nothing, so ``import rlkit`` stays light."""
