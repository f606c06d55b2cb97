"""The trainer's internals, and what a scorer shares with it: the learner's step on one
rank, a rank of a group and its orders, groups of ranks (gang.py), the state staged after
each step and its slot files, resuming, host copies of the weights, scoring under a model."""
