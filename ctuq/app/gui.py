"""``ctuq gui [FILE]``: napari with the ctuq widget docked and the file loaded."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

WIDGET_NAME = "CT reconstruction"


def check_display() -> None:
    """Raise :class:`~ctuq.errors.InputError` on Linux without an X or Wayland display.

    Qt would otherwise abort the process; napari also needs OpenGL, which
    Qt's ``offscreen`` platform lacks.
    """
    from ctuq.errors import InputError

    if os.environ.get("QT_QPA_PLATFORM") == "offscreen":
        raise InputError("napari cannot draw on Qt's offscreen platform (no OpenGL); unset "
                         "QT_QPA_PLATFORM and run under a display or xvfb-run",
                         field="QT_QPA_PLATFORM")
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY")
                                                 or os.environ.get("WAYLAND_DISPLAY")):
        raise InputError("no display: napari needs one (on a headless machine: "
                         "xvfb-run -a ctuq gui ...)", field="DISPLAY")


def dock_widget(viewer):
    """Dock the ctuq widget in ``viewer`` and return it.

    Uses the plugin's manifest contribution (so the Plugins menu shows the
    same widget); falls back to docking :class:`~ctuq.app._widget.CtuqWidget`
    directly when the plugin is not registered (a source checkout that was
    not installed).
    """
    try:
        _, widget = viewer.window.add_plugin_dock_widget("ctuq", WIDGET_NAME)
        return widget
    except KeyError:  # plugin not registered with napari
        from ctuq.app._widget import CtuqWidget

        log.warning("the ctuq napari plugin is not registered; docking its widget directly")
        widget = CtuqWidget(viewer)
        viewer.window.add_dock_widget(widget, name=WIDGET_NAME, area="right")
        return widget


def open_gui(path=None, *, show: bool = True):
    """Open a napari viewer with the ctuq widget docked and ``path`` loaded.

    Parameters
    ----------
    path : path-like, optional
        A sinogram or ctuq result file, opened with the ctuq reader.
    show : bool
        Show the window. Default True.

    Returns
    -------
    napari.Viewer

    Raises
    ------
    InputError
        ``path`` does not exist or is not a file ctuq can read, or there is
        no display (checked before any window opens).
    """
    check_display()
    if path is not None:
        from ctuq.data.io import detect_format_isolated

        # a clear error now rather than a window without data (in a child process:
        # a corrupt HDF5 file must not crash the command)
        detect_format_isolated(path, timeout=120.0)
    import napari

    viewer = napari.Viewer(title="ctuq", show=show)
    dock_widget(viewer)
    if path is not None:
        viewer.open(str(Path(path)), plugin="ctuq")
    return viewer


def run_gui(path=None) -> None:
    """Open the viewer (see :func:`open_gui`) and run the Qt event loop until it closes."""
    import napari

    open_gui(path)
    napari.run()
