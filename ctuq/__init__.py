"""ctuq: uncertainty-aware CT reconstruction.

A deep-image-prior U-net fitted with TV regularisation, linearised around its
weights; the linear model's prior is tuned by sample-based evidence and its
posterior gives a per-pixel uncertainty map.
"""

__version__ = "0.1.0"
