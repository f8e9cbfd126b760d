"""Networks: the deep-image-prior U-net (:mod:`.unet`) and small classifiers (:mod:`.classifiers`)."""

from ctuq.models.unet import (
    PRESETS,
    UNet,
    UNetConfig,
    build_unet,
    count_parameters,
    preset_name_for_size,
    unet_preset,
)

__all__ = ["PRESETS", "UNet", "UNetConfig", "build_unet", "count_parameters",
           "preset_name_for_size", "unet_preset"]
