"""ctuq: uncertainty-aware CT reconstruction.

A deep-image-prior U-net fitted with TV regularisation, linearised around its
weights; the linear model's prior is tuned by sample-based evidence and its
posterior gives a per-pixel uncertainty map.

    >>> result = ctuq.reconstruct(sinogram_array, angles=angles_deg, image_size=128)
    >>> result.save("scan.ctuq.h5"); result.posterior.sample(16)     # doctest: +SKIP

Images and sinograms follow ASTRA's axis and angle convention
(``docs/conventions.md``).
"""

__version__ = "0.1.0"

__all__ = ["reconstruct", "reconstruct_file", "ReconstructionConfig", "Result", "Sinogram",
           "Geometry", "read_sinogram", "read_result", "__version__"]

_LAZY = {
    "reconstruct": "ctuq.recon.pipeline",
    "reconstruct_file": "ctuq.recon.pipeline",
    "ReconstructionConfig": "ctuq.recon.config",
    "Result": "ctuq.data.io",
    "Sinogram": "ctuq.data.io",
    "Geometry": "ctuq.data.geometry",
    "read_sinogram": "ctuq.data.io",
    "read_result": "ctuq.data.io",
}


def __getattr__(name):
    # torch, ODL and ASTRA load only when the pipeline is first used
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ctuq' has no attribute {name!r}")


def __dir__():
    # the lazily imported API is not in the module's namespace until first used
    return sorted(set(__all__) | {k for k in globals() if k.startswith("__")})
