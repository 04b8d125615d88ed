//! NVML's errors in the layer's terms.

use std::fmt;

use nvml_wrapper::error::NvmlError;

use super::ARGUMENT_VERSION_MISMATCH;

/// Why NVML, or a GPU, cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    LibraryNotFound,
    DriverNotLoaded,
    NoPermission,
    DriverLibraryMismatch,
    MissingSymbol,
    GpuLost,
    ResetRequired,
    Uninitialized,
    DriverTimeout,
    IrqIssue,
    InsufficientPower,
    CorruptedInforom,
    OutOfMemory,
    OperatingSystem,
    Unknown,
}

impl Failure {
    pub(crate) fn of(error: &NvmlError) -> Failure {
        match error {
            NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => Failure::LibraryNotFound,
            NvmlError::DriverNotLoaded => Failure::DriverNotLoaded,
            NvmlError::NoPermission => Failure::NoPermission,
            NvmlError::LibRmVersionMismatch => Failure::DriverLibraryMismatch,
            NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound => {
                Failure::MissingSymbol
            }
            NvmlError::GpuLost => Failure::GpuLost,
            NvmlError::ResetRequired => Failure::ResetRequired,
            NvmlError::Uninitialized => Failure::Uninitialized,
            NvmlError::Timeout => Failure::DriverTimeout,
            NvmlError::IrqIssue => Failure::IrqIssue,
            NvmlError::InsufficientPower => Failure::InsufficientPower,
            NvmlError::CorruptedInfoROM => Failure::CorruptedInforom,
            NvmlError::InsufficientMemory => Failure::OutOfMemory,
            NvmlError::OperatingSystem => Failure::OperatingSystem,
            _ => Failure::Unknown,
        }
    }
}

/// The return codes a caller tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    NotSupported,
    InvalidArgument,
    NoPermission,
    /// NVML_ERROR_IN_USE, and code 23 where nvml-wrapper does not name it.
    InUse,
    /// The driver lacks the function or the struct version asked for.
    NotInDriver,
    Other,
}

#[derive(Debug)]
pub struct Error {
    pub(crate) call: &'static str,
    pub(crate) nvml: NvmlError,
}

impl Error {
    pub(crate) fn new(call: &'static str, nvml: NvmlError) -> Error {
        Error { call, nvml }
    }

    /// Every other code, one newer than nvml-wrapper included, is a read error.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self.nvml,
            NvmlError::NotSupported
                | NvmlError::FailedToLoadSymbol(_)
                | NvmlError::FunctionNotFound
                | NvmlError::NoData
        )
    }

    /// Nothing more can be read from the GPU: it is down.
    pub fn is_device_fatal(&self) -> bool {
        matches!(
            self.nvml,
            NvmlError::GpuLost
                | NvmlError::ResetRequired
                | NvmlError::DriverNotLoaded
                | NvmlError::Uninitialized
                | NvmlError::LibRmVersionMismatch
        )
    }

    pub fn failure(&self) -> Failure {
        Failure::of(&self.nvml)
    }

    pub fn code(&self) -> Code {
        match self.nvml {
            NvmlError::NotSupported => Code::NotSupported,
            NvmlError::InvalidArg => Code::InvalidArgument,
            NvmlError::NoPermission => Code::NoPermission,
            NvmlError::InUse | NvmlError::UnexpectedVariant(23) => Code::InUse,
            NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound
            | NvmlError::UnexpectedVariant(ARGUMENT_VERSION_MISMATCH) => Code::NotInDriver,
            _ => Code::Other,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.nvml.fmt(f)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_callers_act_on() {
        let error = |nvml| Error::new("nvmlDeviceGetPowerUsage", nvml);
        let code = |nvml| error(nvml).code();
        assert_eq!(code(NvmlError::NoPermission), Code::NoPermission);
        // INSUFFICIENT_RESOURCES (23): newer drivers, a profiler holding GPM.
        assert_eq!(code(NvmlError::InUse), Code::InUse);
        assert_eq!(code(NvmlError::UnexpectedVariant(23)), Code::InUse);
        assert_eq!(code(NvmlError::Unknown), Code::Other);
        assert!(error(NvmlError::NoData).is_unsupported());
        assert!(error(NvmlError::GpuLost).is_device_fatal());
        assert_eq!(error(NvmlError::GpuLost).failure(), Failure::GpuLost);
    }
}
