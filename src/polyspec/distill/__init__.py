"""Drafters cut from the verifier and distilled from it.

build       the model surgery: first L layers, reduced-vocabulary head
vocab       which tokens a reduced head keeps
init        `distill init`: the untrained drafter, written to disk
checkpoint  a drafter on disk (transformers checkpoint + reduced head) and back
data        training sequences and the verifier's targets, cached
losses      forward KL, reverse KL, total variation (top-k or full targets)
trainer     the accelerate training loop, checkpoints, resume
store       per-language drafters under $POLYSPEC_HOME and the benchmark's names for them
"""
