"""NVML error codes mapped once to what the GPU sources do about them, and XID error events.

Works on the numeric code (`err.value`) so it holds for the real `pynvml`
exception classes and for anything else carrying an NVML return code.
"""
from __future__ import annotations

import ctypes

import pynvml

UNSUPPORTED = "unsupported"  # remember, never ask again, leave the metric out
LOST = "lost"                # the device is gone: mark it failed, stop reading it
TRANSIENT = "transient"      # skip this time, count a partial error, retry next read

_UNSUPPORTED_CODES = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,  # the driver predates the call
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,    # e.g. a whole-GPU query on a MIG handle
}
_LOST_CODES = {
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_RESET_REQUIRED,
    getattr(pynvml, "NVML_ERROR_GPU_NOT_FOUND", 28),
}

_INIT_MESSAGES = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "NVIDIA driver not found (libnvidia-ml.so.1)",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver is not loaded (no /dev/nvidia* devices)",
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "NVIDIA driver and libnvidia-ml.so versions differ (reload the driver or reboot)",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "libnvidia-ml.so is too old for nvidia-ml-py",
}


def code_of(err: BaseException) -> int | None:
    """The NVML return code carried by `err`, or None when it is not an NVML error."""
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def classify(err: BaseException) -> str:
    """UNSUPPORTED, LOST or TRANSIENT for an NVML error."""
    code = code_of(err)
    if code in _UNSUPPORTED_CODES:
        return UNSUPPORTED
    if code in _LOST_CODES:
        return LOST
    return TRANSIENT


def describe_error(err: BaseException) -> str:
    """A short human reason such as 'Not Supported' (no library call needed)."""
    code = code_of(err)
    text = pynvml.NVMLError._errcode_to_string.get(code) if code is not None else None
    if text:
        return text
    name = type(err).__name__
    return name.replace("NVMLError_", "") if name.startswith("NVMLError_") else f"{name}: {err}"


def init_error_line(err: BaseException) -> str:
    """One line for a failed `nvmlInit`, ending in what it means for the user."""
    code = code_of(err)
    what = _INIT_MESSAGES.get(code) if code is not None else None
    if what is None:
        what = f"NVML could not start ({describe_error(err)})"
    return f"{what}: GPU metrics are off"


def handle_key(handle):
    """A hashable identity for a device handle (the ctypes pointer's address, else the object's id)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class XidEvents:
    """XID critical errors through one NVML event set, polled without blocking.

    `register()` answers None when the device's XIDs will be seen, else the reason;
    an error meaning the GPU is lost propagates. `drain()` returns the waiting events
    as (handle_key, xid code) pairs; `errors` counts failed waits.
    """

    MAX_PER_DRAIN = 256

    def __init__(self, nvml):
        self._nvml = nvml
        self._set = None
        self.errors = 0

    def register(self, handle) -> str | None:
        nvml = self._nvml
        bit = nvml.nvmlEventTypeXidCriticalError
        try:
            if not nvml.nvmlDeviceGetSupportedEventTypes(handle) & bit:
                return "XID events not supported"
            if self._set is None:
                self._set = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(handle, bit, self._set)
        except pynvml.NVMLError as err:
            if classify(err) == LOST:
                raise
            return describe_error(err)
        except AttributeError as err:   # a binding without the event API
            return str(err)
        return None

    def drain(self) -> list[tuple[object, int]]:
        """Events waiting now (NVML timeout 0 ms), at most MAX_PER_DRAIN."""
        if self._set is None:
            return []
        nvml, out = self._nvml, []
        for _ in range(self.MAX_PER_DRAIN):
            try:
                data = nvml.nvmlEventSetWait(self._set, 0)
            except pynvml.NVMLError as err:
                if code_of(err) != pynvml.NVML_ERROR_TIMEOUT:
                    self.errors += 1
                break
            if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                out.append((handle_key(data.device), int(data.eventData)))
        return out

    def close(self) -> None:
        if self._set is not None:
            self._nvml.nvmlEventSetFree(self._set)
            self._set = None
