"""The model-error terms' names (``[uncertainty] model_error``): the one module that
spells them. The terms themselves and their registry: :mod:`ctuq.recon.model_error.terms`.
"""

NONE = "none"
HELDOUT = "heldout"
CALIBRATED = "calibrated"
CONFORMAL = "conformal"
