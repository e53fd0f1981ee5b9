//! nvJPEG's C API as the decoder calls it: the library loaded at run time (like libcuda),
//! the functions resolved into one table, the status codes and the errors they become,
//! the handles' creation.

use crate::compressed::{Codec, DecodeError};
use crate::error::{CudaError, Error, Result};
use cudarc::driver::sys;
use std::ffi::{c_int, c_uint, c_void};

use super::ChromaUpsampling;

/// The environment variable naming the nvJPEG library to load instead of the usual names.
pub const LIBRARY_ENV: &str = "VISION_PREPROC_NVJPEG_LIBRARY";

/// The names tried, in order: CUDA 13, CUDA 12 (JetPack 6), the development link, and
/// the toolkit's own folder where it is not on the loader's path.
pub const DEFAULT_LIBRARIES: [&str; 5] = [
    "libnvjpeg.so.13",
    "libnvjpeg.so.12",
    "libnvjpeg.so",
    "/usr/local/cuda/lib64/libnvjpeg.so.13",
    "/usr/local/cuda/lib64/libnvjpeg.so.12",
];

// Values from NVIDIA's nvjpeg.h (identical in 12.4 and 13.2).
pub(super) type Status = c_int;
pub(super) const STATUS_SUCCESS: Status = 0;
/// `nvjpegStatus_t` by value (0..=10).
pub(super) const STATUS_NAMES: [&str; 11] = [
    "NVJPEG_STATUS_SUCCESS",
    "NVJPEG_STATUS_NOT_INITIALIZED",
    "NVJPEG_STATUS_INVALID_PARAMETER",
    "NVJPEG_STATUS_BAD_JPEG",
    "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
    "NVJPEG_STATUS_ALLOCATOR_FAILURE",
    "NVJPEG_STATUS_EXECUTION_FAILED",
    "NVJPEG_STATUS_ARCH_MISMATCH",
    "NVJPEG_STATUS_INTERNAL_ERROR",
    "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
    "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
];
pub(super) const STATUS_BAD_JPEG: Status = 3;
pub(super) const STATUS_JPEG_NOT_SUPPORTED: Status = 4;
pub(super) const STATUS_INCOMPLETE_BITSTREAM: Status = 10;
/// `nvjpegBackend_t`.
pub(super) const BACKEND_DEFAULT: c_int = 0;
pub(super) const BACKEND_HARDWARE: c_int = 3;
/// `nvjpegOutputFormat_t`.
pub(super) const OUTPUT_Y: c_int = 2;
pub(super) const OUTPUT_RGBI: c_int = 5;
/// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION`: subsampled chroma interpolated, not
/// replicated (closer to the CPU decoder, which interpolates as libjpeg does).
pub(super) const FLAGS_UPSAMPLING_WITH_INTERPOLATION: c_uint = 1 << 5;
/// `nvjpegChromaSubsampling_t` by value (0..=7); -1 is unknown.
pub(super) const SUBSAMPLING_NAMES: [&str; 8] =
    ["4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1", "4:1:0", "grey", "4:1:0 (vertical)"];
/// `nvjpegJpegEncoding_t` of a progressive JPEG (its SOF marker, 0xC2).
pub(super) const ENCODING_PROGRESSIVE: c_int = 0xC2;
/// `libraryPropertyType`: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL.
pub(super) const PROPERTIES: [c_int; 3] = [0, 1, 2];
/// `NVJPEG_MAX_COMPONENT`.
pub(super) const MAX_COMPONENT: usize = 4;

/// `nvjpegImage_t`: per plane, its device address and row pitch in bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Image {
    pub(super) channel: [*mut u8; MAX_COMPONENT],
    pub(super) pitch: [usize; MAX_COMPONENT],
}

// Opaque handles.
pub(super) type Handle = *mut c_void;
pub(super) type State = *mut c_void;
pub(super) type JpegStream = *mut c_void;

/// The functions used, with their C signatures from nvjpeg.h; `SYMBOLS` lists their
/// names (the CI check resolves every one in the set-up's library).
macro_rules! nvjpeg_api {
    ($( $field:ident = $symbol:literal fn($($arg:ty),* $(,)?); )*) => {
        pub(super) struct Api {
            $( pub(super) $field: unsafe extern "C" fn($($arg),*) -> Status, )*
            /// Kept loaded while the function pointers above are used.
            _lib: libloading::Library,
        }

        /// Every nvJPEG function the backend calls.
        pub const SYMBOLS: &[&str] = &[$($symbol),*];

        impl Api {
            fn resolve(lib: libloading::Library) -> Result<Api, String> {
                $(
                    // SAFETY: the symbol has this C signature in nvjpeg.h (CUDA 12 and 13);
                    // the pointer is copied out and used only while `lib`, moved into the
                    // returned value, stays loaded.
                    let $field = unsafe {
                        *lib.get::<unsafe extern "C" fn($($arg),*) -> Status>(
                            concat!($symbol, "\0").as_bytes(),
                        )
                        .map_err(|e| format!("{}: {e}", $symbol))?
                    };
                )*
                Ok(Api { $($field,)* _lib: lib })
            }
        }
    };
}

nvjpeg_api! {
    get_property = "nvjpegGetProperty" fn(c_int, *mut c_int);
    create_ex = "nvjpegCreateEx" fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle);
    destroy = "nvjpegDestroy" fn(Handle);
    hardware_info = "nvjpegGetHardwareDecoderInfo" fn(Handle, *mut c_uint, *mut c_uint);
    state_create = "nvjpegJpegStateCreate" fn(Handle, *mut State);
    state_destroy = "nvjpegJpegStateDestroy" fn(State);
    image_info = "nvjpegGetImageInfo"
        fn(Handle, *const u8, usize, *mut c_int, *mut c_int, *mut c_int, *mut c_int);
    decode = "nvjpegDecode" fn(Handle, State, *const u8, usize, c_int, *mut Image, sys::CUstream);
    batched_initialize = "nvjpegDecodeBatchedInitialize" fn(Handle, State, c_int, c_int, c_int);
    batched = "nvjpegDecodeBatched"
        fn(Handle, State, *const *const u8, *const usize, *mut Image, sys::CUstream);
    stream_create = "nvjpegJpegStreamCreate" fn(Handle, *mut JpegStream);
    stream_destroy = "nvjpegJpegStreamDestroy" fn(JpegStream);
    parse_header = "nvjpegJpegStreamParseHeader" fn(Handle, *const u8, usize, JpegStream);
    jpeg_encoding = "nvjpegJpegStreamGetJpegEncoding" fn(JpegStream, *mut c_int);
    batched_supported = "nvjpegDecodeBatchedSupported" fn(Handle, JpegStream, *mut c_int);
}

/// An nvJPEG status by name.
pub(super) fn status_name(status: Status) -> String {
    usize::try_from(status)
        .ok()
        .and_then(|s| STATUS_NAMES.get(s))
        .map_or_else(|| format!("nvjpegStatus_t {status}"), |s| s.to_string())
}

/// The error of a failed nvJPEG `call`: the JPEG's fault (a bad frame) or the decoder's.
pub(super) fn nv_err(call: String, status: Status) -> Error {
    match status {
        STATUS_BAD_JPEG | STATUS_JPEG_NOT_SUPPORTED | STATUS_INCOMPLETE_BITSTREAM => {
            Error::Decode(DecodeError::Corrupt {
                codec: Codec::Jpeg,
                message: format!("nvJPEG refuses it ({call}: {})", status_name(status)),
            })
        }
        _ => Error::Cuda(CudaError::NvJpeg { call, status: status_name(status) }),
    }
}

/// `Ok` for success, else the error of `call`.
pub(super) fn check(status: Status, call: impl FnOnce() -> String) -> Result<()> {
    if status == STATUS_SUCCESS {
        Ok(())
    } else {
        Err(nv_err(call(), status))
    }
}

/// Load the nvJPEG library: [`LIBRARY_ENV`] when set, else [`DEFAULT_LIBRARIES`] in order,
/// the first that loads AND has every function of [`SYMBOLS`] (a Jetson's multimedia
/// `libnvjpeg.so`, a libjpeg look-alike, has none of them). Returns its name.
pub(super) fn load() -> Result<(Api, String), String> {
    let candidates: Vec<String> = match std::env::var(LIBRARY_ENV) {
        Ok(name) if !name.is_empty() => vec![name],
        _ => DEFAULT_LIBRARIES.iter().map(|s| s.to_string()).collect(),
    };
    load_from(&candidates)
}

/// The first of `candidates` that loads and has every function of [`SYMBOLS`].
pub(super) fn load_from(candidates: &[String]) -> Result<(Api, String), String> {
    let mut errors = Vec::new();
    for name in candidates {
        // SAFETY: loading nvJPEG runs its initializers, which set up its own static CUDA
        // runtime; it calls nothing on the GPU until a function is called.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => match Api::resolve(lib) {
                Ok(api) => return Ok((api, name.clone())),
                Err(e) => errors.push(format!("{name}: not CUDA's nvJPEG ({e})")),
            },
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    Err(errors.join("; "))
}

/// Check that an nvJPEG library loads and has every function the backend calls, without
/// a GPU: `path`, or what [`NvJpeg::open`](super::NvJpeg::open) would load; its name and
/// version.
pub fn probe_library(path: Option<&str>) -> Result<(String, (i32, i32, i32))> {
    let (api, name) = match path {
        Some(p) => load_from(&[p.to_string()]),
        None => load(),
    }
    .map_err(CudaError::Unavailable)?;
    Ok((name, version(&api)?))
}

pub(super) fn version(api: &Api) -> Result<(i32, i32, i32)> {
    let mut v = [0; 3];
    for (p, out) in PROPERTIES.iter().zip(&mut v) {
        // SAFETY: a valid out pointer for the call; no GPU or handle involved.
        check(unsafe { (api.get_property)(*p, out) }, || format!("nvjpegGetProperty({p})"))?;
    }
    Ok((v[0], v[1], v[2]))
}

/// A handle on `backend` with the chroma upsampling asked for, or nvJPEG's default when the
/// handle refuses the flag; the status of the plain creation when that fails too.
pub(super) fn create(
    api: &Api,
    backend: c_int,
    upsampling: ChromaUpsampling,
) -> Result<(Handle, ChromaUpsampling), Status> {
    let attempt = |flags: c_uint| {
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: default allocators (null), a valid out pointer.
        let s = unsafe {
            (api.create_ex)(backend, std::ptr::null_mut(), std::ptr::null_mut(), flags, &mut handle)
        };
        if s == STATUS_SUCCESS {
            Ok(handle)
        } else {
            Err(s)
        }
    };
    if upsampling == ChromaUpsampling::Interpolated {
        if let Ok(h) = attempt(FLAGS_UPSAMPLING_WITH_INTERPOLATION) {
            return Ok((h, ChromaUpsampling::Interpolated));
        }
    }
    attempt(0).map(|h| (h, ChromaUpsampling::Replicated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_follow_nvjpeg_h() {
        assert_eq!(status_name(0), "NVJPEG_STATUS_SUCCESS");
        assert_eq!(status_name(7), "NVJPEG_STATUS_ARCH_MISMATCH");
        assert_eq!(status_name(10), "NVJPEG_STATUS_INCOMPLETE_BITSTREAM");
        assert_eq!(status_name(11), "nvjpegStatus_t 11");
        assert_eq!(status_name(-1), "nvjpegStatus_t -1");
    }

    #[test]
    fn a_refused_jpeg_is_a_bad_frame_and_a_failed_decoder_a_device_failure() {
        for s in [STATUS_BAD_JPEG, STATUS_JPEG_NOT_SUPPORTED, STATUS_INCOMPLETE_BITSTREAM] {
            let e = nv_err("nvjpegDecodeBatched".into(), s);
            assert!(matches!(e, Error::Decode(DecodeError::Corrupt { .. })), "{e:?}");
            assert!(!e.is_device_failure());
            assert!(e.to_string().contains(&status_name(s)), "{e}");
        }
        let e = nv_err("nvjpegDecode (hybrid, item 2)".into(), 6);
        assert!(e.is_device_failure());
        assert_eq!(
            e.to_string(),
            "CUDA: nvjpegDecode (hybrid, item 2): NVJPEG_STATUS_EXECUTION_FAILED"
        );
    }

    #[test]
    fn image_struct_matches_nvjpeg_h() {
        // nvjpegImage_t: unsigned char *channel[4]; size_t pitch[4].
        assert_eq!(std::mem::size_of::<Image>(), 64);
        assert_eq!(std::mem::offset_of!(Image, pitch), 32);
    }

    /// The CI check without a GPU: the library the set-up installs (the PyPI wheel
    /// nvidia-nvjpeg-cu12, named by VISION_PREPROC_NVJPEG_WHEEL in .ros/env.sh) loads and
    /// has every function the backend calls. Fails, never skips, without it.
    #[test]
    #[cfg_attr(
        not(target_arch = "x86_64"),
        ignore = "the set-up's nvJPEG is the x86-64 wheel; on aarch64 (a Jetson) it is JetPack's"
    )]
    fn the_setup_s_nvjpeg_library_loads_and_every_symbol_resolves() {
        let wheel = std::env::var("VISION_PREPROC_NVJPEG_WHEEL").unwrap_or_default();
        assert!(
            !wheel.is_empty(),
            "VISION_PREPROC_NVJPEG_WHEEL is not set: scripts/setup/setup.sh installs the \
             nvidia-nvjpeg-cu12 wheel and .ros/env.sh names its libnvjpeg.so.12; run the set-up \
             and source it"
        );
        let (loaded, (major, _, _)) = probe_library(Some(&wheel)).unwrap();
        assert_eq!(loaded, wheel);
        assert!(major >= 12, "nvJPEG {major}: CUDA 12 or newer");
        assert_eq!(SYMBOLS.len(), 15);
        let e = probe_library(Some("libz.so.1")).unwrap_err().to_string();
        assert!(e.contains("not CUDA's nvJPEG") && e.contains("nvjpegGetProperty"), "{e}");
    }
}
