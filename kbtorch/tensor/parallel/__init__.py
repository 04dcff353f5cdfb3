"""Parallelism plans over the chips and PEs of a machine: tensor (``tensor_parallel``),
pipeline (``pipeline_parallel``) and expert (``expert_parallel``) parallelism."""
