//! The CUDA driver's errors as the backend reports them: a leaf module (it imports no
//! other module of the backend), so that the modules calling the driver (device set-up,
//! memory, the ring steps, VMM export and import) depend on it and not on the backend.
//! A logic error found around a driver call is [`crate::Error::Misuse`], never this.

use crate::error::CudaError;

/// A failed driver call `call`: a device failure ([`crate::Error::is_device_failure`]),
/// which starts `gpu_failure_policy`.
pub(crate) fn drv_err(call: impl Into<String>, e: cudarc::driver::DriverError) -> CudaError {
    CudaError::driver(call, e)
}
