"""pace: an offline compiler for the gradient communication of data-parallel DNN training."""

__version__ = "0.1.0"
