"""How ctuq's result layers look in napari: colour bars, panel names, scale bar,
units, the metrics line and the notifications of the real-scan checks."""

from __future__ import annotations

import logging

from ctuq.app._reader import ROLE

log = logging.getLogger(__name__)


def grid_of(viewer):
    """The viewer's grid settings: ``viewer.canvas.grid`` (napari >= 0.9) or ``viewer.grid``."""
    canvas = getattr(viewer, "canvas", None)
    grid = getattr(canvas, "grid", None)
    return grid if grid is not None else viewer.grid


#: Roles of layers that get a colorbar (images with a value scale worth reading).
COLORBAR_ROLES = ("reconstruction", "std", "posterior_std", "model_error_std", "error", "fbp",
                  "ground_truth")


def in_mm(layer) -> bool:
    """Whether a layer's displayed axes are in mm (result images are; sinograms are not)."""
    units = getattr(layer, "units", ()) or ()
    return len(units) >= 2 and all(str(u) in ("mm", "millimeter") for u in units[-2:])


def style_result_layer(viewer, layer) -> None:
    """Colorbar, panel name and scale bar for a ctuq layer (best effort: napari >= 0.6)."""
    role = getattr(layer, "metadata", {}).get(ROLE)
    if role is None:
        return
    try:
        layer.name_overlay.visible = True  # the layer's name in its grid panel
        if role in COLORBAR_ROLES:
            layer.colorbar.visible = True
            value_unit = layer.metadata.get("units")
            if value_unit:  # napari's colour bars have no title: one caption says the unit
                text = _canvas_text(viewer)
                text.text = f"colour bars in {value_unit}"
                text.position = "bottom_right"
                text.visible = True
        if in_mm(layer):
            viewer.scale_bar.visible = True
    except (AttributeError, ValueError) as err:  # an older napari: plain layers
        log.debug("cannot style layer %s: %s", layer.name, err)


def _canvas_text(viewer):
    """The viewer's canvas text overlay (``viewer.canvas.overlays.text`` in napari >= 0.9)."""
    canvas = getattr(viewer, "canvas", None)
    overlays = getattr(canvas, "overlays", None)
    text = getattr(overlays, "text", None)
    return text if text is not None else viewer.text_overlay


def set_layer(viewer, data, kwargs) -> None:
    """Add the image layer ``kwargs['name']`` to ``viewer``, or update the one there."""
    name = kwargs["name"]
    if name in viewer.layers:
        layer = viewer.layers[name]
        layer.data = data
        layer.metadata = kwargs["metadata"]
        layer.contrast_limits_range = kwargs["contrast_limits"]
        layer.contrast_limits = kwargs["contrast_limits"]
        layer.colormap = kwargs["colormap"]
        for key in ("scale", "translate", "units"):
            if key in kwargs:
                setattr(layer, key, kwargs[key])
        style_result_layer(viewer, layer)
    else:
        viewer.add_image(data, **kwargs)


def notify_checks(result, name: str) -> None:
    """A napari warning for a misfit (the data-consistency check) and each data warning,
    and a note when the image shown is not the DIP output."""
    from napari.utils.notifications import show_info, show_warning

    from ctuq.app.batch import shown_image_note

    image = shown_image_note(result.config)
    if image:
        show_info(f"ctuq: {name}: the image shown is {image}")
    d = result.diagnostics or {}
    if d.get("verdict") == "misfit":
        show_warning(f"ctuq: {name}: misfit, the model of the scan does not explain the "
                     f"data ({d.get('reason', '')}); the std does not cover this")
    for w in d.get("warnings") or []:
        show_warning(f"ctuq: {name}: {w}")


#: Metrics shown under the buttons (all of them are in the label's tooltip).
SHOWN_METRICS = (("psnr", "PSNR {:.2f} dB"), ("psnr_fbp", "(FBP {:.2f} dB)"),
                 ("ssim", "SSIM {:.3f}"), ("coverage_1sigma", "coverage ±1σ {:.0%}"),
                 ("coverage_2sigma", "±2σ {:.0%}"),
                 ("spearman_std_abs_error", "Spearman(std, |error|) {:.2f}"))

def metrics_text(result) -> tuple[str, str]:
    m = result.metrics
    shown = " · ".join(fmt.format(m[key]) for key, fmt in SHOWN_METRICS if key in m)
    full = "\n".join(f"{k}: {v:.6g}" for k, v in sorted(m.items()))
    return shown, full
