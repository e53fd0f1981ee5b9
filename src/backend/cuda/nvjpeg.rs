//! nvJPEG: JPEG decoded on the GPU into device memory, the library loaded at run time
//! (like libcuda: no CUDA toolkit at build time), for the CUDA backend's compressed frames.
//!
//! ```text
//! NvJpeg::open(ctx)        dlopen libnvjpeg (VISION_PREPROC_NVJPEG_LIBRARY, .so.13, .so.12, .so),
//!                          resolve the functions below, create the handles:
//!                            hardware  nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE) where the GPU has
//!                                      an NVJPG engine (A100, H100, H200; not the Orin through
//!                                      this API: it answers ARCH_MISMATCH, as GPUs without one)
//!                            hybrid    nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT): Huffman on the
//!                                      host, IDCT and colour on the GPU; always there
//! decode_batch(stream, items)
//!   per item               nvjpegGetImageInfo: size and components against the caller's header
//!                          nvjpegJpegStreamParseHeader + nvjpegDecodeBatchedSupported: which
//!                          decoder (the hardware one takes baseline, not progressive, not 4:1:1)
//!   hardware items         ONE nvjpegDecodeBatched per output format (RGBI, Y) for all of them
//!   the others             nvjpegDecode on the hybrid handle, one by one (said once, counted)
//! ```
//!
//! Output: interleaved RGB (`NVJPEG_OUTPUT_RGBI`, 3 bytes a pixel) for colour JPEG, the
//! luma plane (`NVJPEG_OUTPUT_Y`) for grey ones: the `rgb8` and `mono8` that the CPU
//! decoder (`compressed::decode`) gives, at `dst` with the caller's row pitch, on the
//! caller's stream, where the fused kernel reads them.
//!
//! **What blocks and what is stream-ordered.** Header parsing and the support check are
//! host work. The hybrid `nvjpegDecode` Huffman-decodes on the calling thread (most of its
//! time: milliseconds for a 1080p frame), then queues the coefficients' upload from the
//! state's pinned buffer and its kernels on the stream, and returns. The hardware
//! `nvjpegDecodeBatched` prepares the batch on the host, queues the engine's work on the
//! stream and returns. Neither waits for its GPU work, so (1) the caller keeps the JPEG
//! bytes and the destination alive and untouched until the stream has passed the decode
//! (`decode_batch`'s contract), and (2) a state's internal buffers are reused by the next
//! decode on that state: each state has an event recorded after its last decode, waited
//! for before it is used again (it has long completed at camera rates; a batch in flight
//! behind it waits at most for that decode, not for the whole submission).
//!
//! **Memory.** nvJPEG allocates its device and pinned buffers itself (its default
//! allocators: cudaMalloc, cudaHostAlloc, through its own static CUDA runtime, in the
//! primary context the backend uses), grows them to the largest image seen and keeps
//! them. The hardware decoder needs `nvjpegDecodeBatchedInitialize` with the batch size
//! before `nvjpegDecodeBatched` (which then decodes exactly that many): one state per
//! (batch size, output format), created and initialized on first use and kept (a robot's
//! camera count does not change), initialized again only after a failed batch (the
//! documented way to reset one).
//!
//! **Errors.** A JPEG that nvJPEG refuses (`BAD_JPEG`, `JPEG_NOT_SUPPORTED`,
//! `INCOMPLETE_BITSTREAM`) or whose size disagrees with its header is a bad frame,
//! [`DecodeError::Corrupt`], never a device failure; any other status is
//! [`CudaError::NvJpeg`] naming the call and the status.

use super::driver::drv_err;
use crate::compressed::{Codec, DecodeError};
use crate::error::{CudaError, Error, Result};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

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
type Status = c_int;
const STATUS_SUCCESS: Status = 0;
/// `nvjpegStatus_t` by value (0..=10).
const STATUS_NAMES: [&str; 11] = [
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
const STATUS_BAD_JPEG: Status = 3;
const STATUS_JPEG_NOT_SUPPORTED: Status = 4;
const STATUS_INCOMPLETE_BITSTREAM: Status = 10;
/// `nvjpegBackend_t`.
const BACKEND_DEFAULT: c_int = 0;
const BACKEND_HARDWARE: c_int = 3;
/// `nvjpegOutputFormat_t`.
const OUTPUT_Y: c_int = 2;
const OUTPUT_RGBI: c_int = 5;
/// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION`: subsampled chroma interpolated, not
/// replicated (closer to the CPU decoder, which interpolates as libjpeg does).
const FLAGS_UPSAMPLING_WITH_INTERPOLATION: c_uint = 1 << 5;
/// `nvjpegChromaSubsampling_t` by value (0..=7); -1 is unknown.
const SUBSAMPLING_NAMES: [&str; 8] =
    ["4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1", "4:1:0", "grey", "4:1:0 (vertical)"];
/// `nvjpegJpegEncoding_t` of a progressive JPEG (its SOF marker, 0xC2).
const ENCODING_PROGRESSIVE: c_int = 0xC2;
/// `libraryPropertyType`: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL.
const PROPERTIES: [c_int; 3] = [0, 1, 2];
/// `NVJPEG_MAX_COMPONENT`.
const MAX_COMPONENT: usize = 4;

/// `nvjpegImage_t`: per plane, its device address and row pitch in bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct Image {
    channel: [*mut u8; MAX_COMPONENT],
    pitch: [usize; MAX_COMPONENT],
}

// Opaque handles.
type Handle = *mut c_void;
type State = *mut c_void;
type JpegStream = *mut c_void;

/// The functions used, with their C signatures from nvjpeg.h; `SYMBOLS` lists their
/// names (the CI check resolves every one in the set-up's library).
macro_rules! nvjpeg_api {
    ($( $field:ident = $symbol:literal fn($($arg:ty),* $(,)?); )*) => {
        struct Api {
            $( $field: unsafe extern "C" fn($($arg),*) -> Status, )*
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
fn status_name(status: Status) -> String {
    usize::try_from(status)
        .ok()
        .and_then(|s| STATUS_NAMES.get(s))
        .map_or_else(|| format!("nvjpegStatus_t {status}"), |s| s.to_string())
}

/// The error of a failed nvJPEG `call`: the JPEG's fault (a bad frame) or the decoder's.
fn nv_err(call: String, status: Status) -> Error {
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
fn check(status: Status, call: impl FnOnce() -> String) -> Result<()> {
    if status == STATUS_SUCCESS {
        Ok(())
    } else {
        Err(nv_err(call(), status))
    }
}

/// One JPEG to decode: the compressed bytes, the size and kind its header declares (what
/// the CPU decoder gives: `grey` = mono8, else rgb8), and where its pixels go.
#[derive(Debug, Clone, Copy)]
pub struct DecodeItem<'a> {
    /// The JPEG (kept alive and untouched until the stream has passed the decode).
    pub jpeg: &'a [u8],
    /// Width in pixels, from the caller's header check; nvJPEG's must agree.
    pub width: u32,
    /// Height in pixels, likewise.
    pub height: u32,
    /// A one-component JPEG, decoded to its luma plane (mono8); else interleaved RGB.
    pub grey: bool,
    /// Device address of row 0: `pitch * height` bytes the decode may write.
    pub dst: CUdeviceptr,
    /// Bytes from one row to the next, at least `width` (grey) or `3 * width`.
    pub pitch: usize,
}

impl DecodeItem<'_> {
    /// Bytes of a decoded pixel.
    fn bytes_per_pixel(&self) -> usize {
        if self.grey {
            1
        } else {
            3
        }
    }
}

/// Why a JPEG went to the hybrid decoder instead of the hardware one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HybridReason {
    /// There is no hardware decoder (this GPU has none, or nvJPEG refused it).
    NoHardware,
    /// A progressive JPEG (SOF2): the hardware decoder takes baseline only.
    Progressive,
    /// The hardware decoder does not take it for another reason (4:1:1 or 4:1:0 chroma,
    /// several scans, ...): `nvjpegDecodeBatchedSupported` said so.
    Unsupported,
}

impl HybridReason {
    /// What to say once in a log.
    pub fn describe(self) -> &'static str {
        match self {
            HybridReason::NoHardware => {
                "JPEG decoded by nvJPEG's hybrid backend (no hardware decoder)"
            }
            HybridReason::Progressive => {
                "progressive JPEG: decoded by the hybrid backend, the hardware decoder cannot"
            }
            HybridReason::Unsupported => {
                "JPEG the hardware decoder does not take (chroma subsampling or scans): decoded \
                 by the hybrid backend"
            }
        }
    }
}

/// Which decoder decoded a JPEG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The hardware decoder (NVJPG engine), in the batched call.
    Hardware,
    /// The hybrid backend (CPU Huffman + GPU), one `nvjpegDecode` per JPEG.
    Hybrid(HybridReason),
}

/// How a [`NvJpeg::decode_batch`] call went: the route of each item, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecodeReport {
    /// Per item.
    pub routes: Vec<Route>,
}

/// JPEGs decoded so far by each decoder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecodeCounts {
    /// By the hardware decoder.
    pub hardware: u64,
    /// By the hybrid backend, by reason.
    pub hybrid: BTreeMap<HybridReason, u64>,
}

/// How nvJPEG upsamples subsampled chroma (4:2:0, 4:2:2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChromaUpsampling {
    /// Interpolated (`NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION`): the CPU decoder's kind.
    Interpolated,
    /// nvJPEG's default: each chroma sample replicated.
    Replicated,
}

/// How to open nvJPEG ([`NvJpeg::open_with`]); the default is what the backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvJpegOptions {
    /// Chroma upsampling asked for (default: interpolated).
    pub upsampling: ChromaUpsampling,
    /// Use the hardware decoder where there is one (default); `false`: the hybrid backend
    /// alone, as on a GPU without one (the benchmark's and the tests' comparison).
    pub hardware: bool,
}

impl Default for NvJpegOptions {
    fn default() -> Self {
        NvJpegOptions { upsampling: ChromaUpsampling::Interpolated, hardware: true }
    }
}

/// A decode state for the hardware decoder's batches of one size and format.
struct BatchState {
    state: State,
    size: usize,
    format: c_int,
    /// `nvjpegDecodeBatchedInitialize` done since creation or the last failed batch.
    ready: bool,
    /// Recorded after the last decode on this state.
    guard: CudaEvent,
}

/// The hardware decoder: its handle, the parsed stream of the support check, its states.
struct Hardware {
    handle: Handle,
    stream: JpegStream,
    states: Vec<BatchState>,
    /// Engines and cores per engine (`nvjpegGetHardwareDecoderInfo`), when it answers.
    engines: Option<(u32, u32)>,
    upsampling: ChromaUpsampling,
    /// [`NvJpeg::warm_up`]'s largest set and how long it took, once it ran.
    warmed: Option<(usize, std::time::Duration)>,
}

/// The hybrid backend: one handle and state.
struct Hybrid {
    handle: Handle,
    state: State,
    guard: CudaEvent,
    upsampling: ChromaUpsampling,
}

/// nvJPEG on one CUDA context: the library, its hardware decoder where there is one, its
/// hybrid backend always. Create once ([`NvJpeg::open`]); handles and states live as long
/// as it does.
pub struct NvJpeg {
    ctx: Arc<CudaContext>,
    library: String,
    version: (i32, i32, i32),
    hardware: Option<Hardware>,
    /// Why there is no hardware decoder.
    no_hardware: Option<String>,
    hybrid: Hybrid,
    counts: DecodeCounts,
    /// Declared last: dropped after the handles are destroyed (in `Drop`).
    api: Api,
}

// SAFETY: the raw handles and states belong to this value alone and are used only through
// `&mut self` (one thread at a time), which nvJPEG's thread-safety rules allow (a state is
// used by one thread at a time; the handles are thread safe); the context is Send + Sync.
unsafe impl Send for NvJpeg {}

/// Load the nvJPEG library: [`LIBRARY_ENV`] when set, else [`DEFAULT_LIBRARIES`] in order,
/// the first that loads AND has every function of [`SYMBOLS`] (a Jetson's multimedia
/// `libnvjpeg.so`, a libjpeg look-alike, has none of them). Returns its name.
fn load() -> Result<(Api, String), String> {
    let candidates: Vec<String> = match std::env::var(LIBRARY_ENV) {
        Ok(name) if !name.is_empty() => vec![name],
        _ => DEFAULT_LIBRARIES.iter().map(|s| s.to_string()).collect(),
    };
    load_from(&candidates)
}

/// The first of `candidates` that loads and has every function of [`SYMBOLS`].
fn load_from(candidates: &[String]) -> Result<(Api, String), String> {
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

/// The JPEG [`NvJpeg::warm_up`] decodes and its side: 64x64 colour (the `image` crate's
/// baseline encoder), a gradient.
fn warm_up_jpeg() -> Result<(Vec<u8>, u32)> {
    const SIDE: u32 = 64;
    let pixels: Vec<u8> = (0..SIDE * SIDE * 3).map(|i| ((i % 251) as u8).wrapping_mul(7)).collect();
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
        .encode(&pixels, SIDE, SIDE, image::ExtendedColorType::Rgb8)
        .map_err(|e| Error::misuse("nvJPEG's warm-up JPEG", e.to_string()))?;
    Ok((jpeg, SIDE))
}

/// Check that an nvJPEG library loads and has every function the backend calls, without
/// a GPU: `path`, or what [`NvJpeg::open`] would load; its name and version.
pub fn probe_library(path: Option<&str>) -> Result<(String, (i32, i32, i32))> {
    let (api, name) = match path {
        Some(p) => load_from(&[p.to_string()]),
        None => load(),
    }
    .map_err(CudaError::Unavailable)?;
    Ok((name, version(&api)?))
}

fn version(api: &Api) -> Result<(i32, i32, i32)> {
    let mut v = [0; 3];
    for (p, out) in PROPERTIES.iter().zip(&mut v) {
        // SAFETY: a valid out pointer for the call; no GPU or handle involved.
        check(unsafe { (api.get_property)(*p, out) }, || format!("nvjpegGetProperty({p})"))?;
    }
    Ok((v[0], v[1], v[2]))
}

impl NvJpeg {
    /// Load nvJPEG and create its handles on `ctx` (the backend's), chroma interpolated.
    /// Fails with [`CudaError::Unavailable`] when the library cannot be loaded (the caller
    /// decodes on the host instead), or the error of the call that failed.
    pub fn open(ctx: &Arc<CudaContext>) -> Result<NvJpeg> {
        Self::open_with(ctx, NvJpegOptions::default())
    }

    /// [`NvJpeg::open`] with `options` (a handle that refuses chroma interpolation gets
    /// nvJPEG's default; [`NvJpeg::describe`] says which it has).
    pub fn open_with(ctx: &Arc<CudaContext>, options: NvJpegOptions) -> Result<NvJpeg> {
        let upsampling = options.upsampling;
        let (api, library) = load().map_err(|e| {
            CudaError::Unavailable(format!(
                "the nvJPEG library cannot be loaded ({e}); set {LIBRARY_ENV} to its path"
            ))
        })?;
        let version = version(&api)?;
        ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let event = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(|e| drv_err("cuEventCreate(nvJPEG state guard)", e))
        };
        let (handle, hybrid_upsampling) = create(&api, BACKEND_DEFAULT, upsampling)
            .map_err(|s| nv_err("nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT)".into(), s))?;
        let mut state: State = std::ptr::null_mut();
        // SAFETY: a handle just created; a valid out pointer.
        let s = unsafe { (api.state_create)(handle, &mut state) };
        if s != STATUS_SUCCESS {
            // SAFETY: the handle was created above and is not used after this.
            unsafe { (api.destroy)(handle) };
            return Err(nv_err("nvjpegJpegStateCreate (hybrid)".into(), s));
        }
        let guard = match event() {
            Ok(g) => g,
            Err(e) => {
                // SAFETY: created above, not used after this.
                unsafe {
                    (api.state_destroy)(state);
                    (api.destroy)(handle);
                }
                return Err(e.into());
            }
        };
        let hybrid = Hybrid { handle, state, guard, upsampling: hybrid_upsampling };
        // From here on `Drop` releases what exists.
        let mut nv = NvJpeg {
            ctx: ctx.clone(),
            library,
            version,
            hardware: None,
            no_hardware: None,
            hybrid,
            counts: DecodeCounts::default(),
            api,
        };
        if !options.hardware {
            nv.no_hardware = Some("not asked for (NvJpegOptions::hardware false)".into());
            return Ok(nv);
        }
        match create(&nv.api, BACKEND_HARDWARE, upsampling) {
            Ok((handle, upsampling)) => {
                let mut stream: JpegStream = std::ptr::null_mut();
                // SAFETY: a handle just created; a valid out pointer.
                let s = unsafe { (nv.api.stream_create)(handle, &mut stream) };
                if s != STATUS_SUCCESS {
                    // SAFETY: created above, not used after this.
                    unsafe { (nv.api.destroy)(handle) };
                    return Err(nv_err("nvjpegJpegStreamCreate (hardware)".into(), s));
                }
                let (mut engines, mut cores) = (0, 0);
                // SAFETY: a live handle and valid out pointers.
                let info = unsafe { (nv.api.hardware_info)(handle, &mut engines, &mut cores) };
                let engines = (info == STATUS_SUCCESS).then_some((engines, cores));
                nv.hardware = Some(Hardware {
                    handle,
                    stream,
                    states: Vec::new(),
                    engines,
                    upsampling,
                    warmed: None,
                });
            }
            Err(s) => {
                nv.no_hardware =
                    Some(format!("nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE): {}", status_name(s)));
            }
        }
        Ok(nv)
    }

    /// The library, its version, the decoders and the chroma upsampling, for `info` and
    /// the diagnostics: `nvJPEG 13.0.1 (libnvjpeg.so.13), hardware decoder (1 engine x 5
    /// cores; hybrid for progressive and what it cannot), chroma interpolated`.
    pub fn describe(&self) -> String {
        let (major, minor, patch) = self.version;
        let upsampling = |u: ChromaUpsampling| match u {
            ChromaUpsampling::Interpolated => "chroma interpolated",
            ChromaUpsampling::Replicated => "chroma replicated",
        };
        let decoders = match (&self.hardware, &self.no_hardware) {
            (Some(h), _) => format!(
                "hardware decoder ({}{}; hybrid backend for progressive and what it cannot, {})",
                h.engines.map_or_else(String::new, |(e, c)| format!(
                    "{e} engine{} x {c} cores, ",
                    if e == 1 { "" } else { "s" }
                )),
                upsampling(h.upsampling),
                upsampling(self.hybrid.upsampling),
            ),
            (None, why) => format!(
                "hybrid backend, {} (no hardware decoder: {})",
                upsampling(self.hybrid.upsampling),
                why.as_deref().unwrap_or("none")
            ),
        };
        format!("nvJPEG {major}.{minor}.{patch} ({}), {decoders}", self.library)
    }

    /// The library's version (major, minor, patch).
    pub fn version(&self) -> (i32, i32, i32) {
        self.version
    }

    /// Whether the hardware decoder is in use.
    pub fn has_hardware(&self) -> bool {
        self.hardware.is_some()
    }

    /// JPEGs decoded so far, by decoder.
    pub fn counts(&self) -> &DecodeCounts {
        &self.counts
    }

    /// Decode `items` into their device destinations on `stream`: the checks of every
    /// item first (nothing is queued if one fails: a size or kind that disagrees with the
    /// caller's header is [`DecodeError::Corrupt`]), then every item the hardware decoder
    /// takes in one batched call per output format, then the others on the hybrid
    /// backend. Returns which decoder took each item. On an error after the checks, some
    /// items may have been queued: wait for the stream before reusing their destinations.
    ///
    /// # Safety
    /// Each item's `dst` holds `pitch * height` bytes of device memory of this context that
    /// nothing else reads or writes until the stream has passed this decode, and its
    /// `jpeg` bytes stay alive and untouched until then; `stream` belongs to this
    /// context.
    pub unsafe fn decode_batch(
        &mut self,
        stream: &CudaStream,
        items: &[DecodeItem<'_>],
    ) -> Result<DecodeReport> {
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let mut routes = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            self.check_item(i, item)?;
            routes.push(self.route(i, item)?);
        }
        for grey in [false, true] {
            let batch: Vec<usize> = (0..items.len())
                .filter(|&i| routes[i] == Route::Hardware && items[i].grey == grey)
                .collect();
            if !batch.is_empty() {
                // SAFETY: the caller's contract for every item.
                unsafe { self.decode_hardware(stream, items, &batch, grey) }?;
            }
        }
        for (i, item) in items.iter().enumerate() {
            if let Route::Hybrid(reason) = routes[i] {
                // SAFETY: the caller's contract.
                unsafe { self.decode_hybrid(stream, i, item) }?;
                *self.counts.hybrid.entry(reason).or_default() += 1;
            }
        }
        self.counts.hardware += routes.iter().filter(|r| **r == Route::Hardware).count() as u64;
        Ok(DecodeReport { routes })
    }

    /// Whether nvJPEG reads `jpeg`'s header as `width` x `height` with 1 (`grey`) or 3
    /// components: host work only (microseconds), for choosing where a frame is decoded.
    pub fn accepts(&self, jpeg: &[u8], width: u32, height: u32, grey: bool) -> bool {
        self.check_header(0, jpeg, width, height, grey).is_ok()
    }

    /// The library's version and the decoder JPEGs go to, in a few words (`nvJPEG 13.0.1,
    /// hardware decoder`), for a device description.
    pub fn summary(&self) -> String {
        let (major, minor, patch) = self.version;
        let decoder = match &self.hardware {
            Some(Hardware { warmed: Some((n, took)), .. }) => format!(
                "hardware decoder, ready for sets of {} ({:.0} ms)",
                if *n == 1 { "1".to_string() } else { format!("1 to {n}") },
                took.as_secs_f64() * 1e3
            ),
            Some(_) => "hardware decoder".to_string(),
            None => "hybrid backend".to_string(),
        };
        format!("nvJPEG {major}.{minor}.{patch}, {decoder}")
    }

    /// Ready the hardware decoder for sets of 1 to `max_set` colour JPEGs before the first
    /// frame comes: the state of each set size created and initialized, and a small JPEG
    /// decoded through it (nvJPEG sets up its buffers at a state's first decode), on
    /// `stream`, waited for. Without it the first set of each size waits ~100 ms for this
    /// (an H100), and a camera's frames queued behind it are dropped. Not counted as
    /// decoded frames. Nothing to do without a hardware decoder (the hybrid backend's one
    /// state is ready at [`NvJpeg::open`]) or with `max_set` 0.
    pub fn warm_up(&mut self, stream: &Arc<CudaStream>, max_set: usize) -> Result<()> {
        if self.hardware.is_none() || max_set == 0 {
            return Ok(());
        }
        let start = std::time::Instant::now();
        let (jpeg, side) = warm_up_jpeg()?;
        let pitch = side as usize * 3;
        let frame = pitch * side as usize;
        let mut dst = super::memory::DeviceBuffer::default();
        let base = dst.ensure(stream, frame * max_set, "nvJPEG's warm-up")?;
        let counts = self.counts.clone();
        let mut warm = || -> Result<()> {
            for n in 1..=max_set {
                let items: Vec<DecodeItem> = (0..n)
                    .map(|i| DecodeItem {
                        jpeg: &jpeg,
                        width: side,
                        height: side,
                        grey: false,
                        dst: base + (i * frame) as CUdeviceptr,
                        pitch,
                    })
                    .collect();
                // SAFETY: `dst` holds `max_set` frames of pitch * side bytes that nothing
                // else uses, and it and `jpeg` live until the stream is synchronized below.
                let decoded = unsafe { self.decode_batch(stream, &items) };
                stream.synchronize().map_err(|e| drv_err("waiting for nvJPEG's warm-up", e))?;
                decoded?;
            }
            Ok(())
        };
        let warmed = warm();
        self.counts = counts;
        warmed?;
        if let Some(hw) = &mut self.hardware {
            hw.warmed = Some((max_set, start.elapsed()));
        }
        Ok(())
    }

    /// The item's own fields, then nvJPEG's reading of its header against them.
    fn check_item(&self, i: usize, item: &DecodeItem<'_>) -> Result<()> {
        let row = item.width as usize * item.bytes_per_pixel();
        if item.width == 0 || item.height == 0 || item.dst == 0 || item.pitch < row {
            return Err(Error::misuse(
                "NvJpeg::decode_batch",
                format!(
                    "item {i}: {}x{} into {:#x} with pitch {} (at least {row}): give the header's \
                     size and a destination of pitch * height bytes",
                    item.width, item.height, item.dst, item.pitch
                ),
            ));
        }
        self.check_header(i, item.jpeg, item.width, item.height, item.grey)
    }

    /// nvJPEG's reading of a JPEG's header (item `i`) against the size and kind the
    /// caller's header check found.
    fn check_header(
        &self,
        i: usize,
        jpeg: &[u8],
        width: u32,
        height: u32,
        grey: bool,
    ) -> Result<()> {
        let (mut components, mut subsampling) = (0, 0);
        let (mut widths, mut heights) = ([0; MAX_COMPONENT], [0; MAX_COMPONENT]);
        // SAFETY: the JPEG's bytes for the call; out pointers valid, the arrays hold
        // NVJPEG_MAX_COMPONENT entries as the function writes.
        let s = unsafe {
            (self.api.image_info)(
                self.hybrid.handle,
                jpeg.as_ptr(),
                jpeg.len(),
                &mut components,
                &mut subsampling,
                widths.as_mut_ptr(),
                heights.as_mut_ptr(),
            )
        };
        check(s, || format!("nvjpegGetImageInfo (item {i}, {} bytes)", jpeg.len()))?;
        let expected_components = if grey { 1 } else { 3 };
        if (widths[0], heights[0], components)
            != (width as c_int, height as c_int, expected_components)
        {
            return Err(Error::Decode(DecodeError::Corrupt {
                codec: Codec::Jpeg,
                message: format!(
                    "nvJPEG reads {}x{} with {components} components ({}), the header check \
                     {}x{} with {expected_components}",
                    widths[0],
                    heights[0],
                    usize::try_from(subsampling)
                        .ok()
                        .and_then(|s| SUBSAMPLING_NAMES.get(s))
                        .unwrap_or(&"unknown chroma subsampling"),
                    width,
                    height
                ),
            }));
        }
        Ok(())
    }

    /// Which decoder takes `item`: the hardware one when there is one and it says it can.
    fn route(&mut self, i: usize, item: &DecodeItem<'_>) -> Result<Route> {
        let Some(hw) = &self.hardware else {
            return Ok(Route::Hybrid(HybridReason::NoHardware));
        };
        // SAFETY: the JPEG's bytes for the call; the hardware handle and its parse stream
        // are live and used by this thread only (`&mut self`).
        let s = unsafe {
            (self.api.parse_header)(hw.handle, item.jpeg.as_ptr(), item.jpeg.len(), hw.stream)
        };
        check(s, || format!("nvjpegJpegStreamParseHeader (item {i})"))?;
        let mut unsupported = 0;
        // SAFETY: the stream was parsed just above; a valid out pointer.
        let s = unsafe { (self.api.batched_supported)(hw.handle, hw.stream, &mut unsupported) };
        check(s, || format!("nvjpegDecodeBatchedSupported (item {i})"))?;
        if unsupported == 0 {
            return Ok(Route::Hardware);
        }
        let mut encoding = 0;
        // SAFETY: as above.
        let s = unsafe { (self.api.jpeg_encoding)(hw.stream, &mut encoding) };
        check(s, || format!("nvjpegJpegStreamGetJpegEncoding (item {i})"))?;
        Ok(Route::Hybrid(if encoding == ENCODING_PROGRESSIVE {
            HybridReason::Progressive
        } else {
            HybridReason::Unsupported
        }))
    }

    /// The items `batch` of `items` in one hardware `nvjpegDecodeBatched` (RGBI, or Y when
    /// `grey`), on the state of that batch size and format.
    ///
    /// # Safety
    /// `decode_batch`'s contract.
    unsafe fn decode_hardware(
        &mut self,
        stream: &CudaStream,
        items: &[DecodeItem<'_>],
        batch: &[usize],
        grey: bool,
    ) -> Result<()> {
        let format = if grey { OUTPUT_Y } else { OUTPUT_RGBI };
        let (api, ctx) = (&self.api, &self.ctx);
        let hw = self.hardware.as_mut().ok_or_else(|| {
            Error::misuse("NvJpeg::decode_hardware", "no hardware decoder: route the items first")
        })?;
        let n = batch.len();
        let k = match hw.states.iter().position(|s| s.size == n && s.format == format) {
            Some(k) => k,
            None => {
                let mut state: State = std::ptr::null_mut();
                // SAFETY: a live handle; a valid out pointer.
                let s = unsafe { (api.state_create)(hw.handle, &mut state) };
                check(s, || format!("nvjpegJpegStateCreate (hardware, batches of {n})"))?;
                let guard = ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(|e| drv_err("cuEventCreate(nvJPEG state guard)", e));
                let guard = match guard {
                    Ok(g) => g,
                    Err(e) => {
                        // SAFETY: created above, not used after this.
                        unsafe { (api.state_destroy)(state) };
                        return Err(e.into());
                    }
                };
                hw.states.push(BatchState { state, size: n, format, ready: false, guard });
                hw.states.len() - 1
            }
        };
        let st = &mut hw.states[k];
        // The state's buffers may still be read by its previous decode.
        st.guard.synchronize().map_err(|e| drv_err("waiting for the previous JPEG batch", e))?;
        if !st.ready {
            // SAFETY: a live handle and state, no decode on it pending (waited above).
            let s = unsafe { (api.batched_initialize)(hw.handle, st.state, n as c_int, 1, format) };
            check(s, || format!("nvjpegDecodeBatchedInitialize(batch size {n})"))?;
            st.ready = true;
        }
        let data: Vec<*const u8> = batch.iter().map(|&i| items[i].jpeg.as_ptr()).collect();
        let lengths: Vec<usize> = batch.iter().map(|&i| items[i].jpeg.len()).collect();
        let mut images: Vec<Image> = batch.iter().map(|&i| output(&items[i])).collect();
        // SAFETY: `n` JPEGs (pointers and lengths of live slices) and `n` destinations of
        // `pitch * height` device bytes each (the caller's contract), the batch size the
        // state was initialized with; the arrays outlive the call (nvJPEG reads them
        // during it).
        let s = unsafe {
            (api.batched)(
                hw.handle,
                st.state,
                data.as_ptr(),
                lengths.as_ptr(),
                images.as_mut_ptr(),
                stream.cu_stream(),
            )
        };
        if s != STATUS_SUCCESS {
            // A failed batch leaves the state to be initialized again.
            st.ready = false;
            return Err(nv_err(format!("nvjpegDecodeBatched (hardware, items {batch:?})"), s));
        }
        st.guard.record(stream).map_err(|e| drv_err("cuEventRecord(nvJPEG state guard)", e))?;
        Ok(())
    }

    /// Item `i` on the hybrid backend (`nvjpegDecode`).
    ///
    /// # Safety
    /// `decode_batch`'s contract.
    unsafe fn decode_hybrid(
        &mut self,
        stream: &CudaStream,
        i: usize,
        item: &DecodeItem<'_>,
    ) -> Result<()> {
        let h = &self.hybrid;
        h.guard.synchronize().map_err(|e| drv_err("waiting for the previous hybrid JPEG", e))?;
        let format = if item.grey { OUTPUT_Y } else { OUTPUT_RGBI };
        let mut image = output(item);
        // SAFETY: a live handle and state with no decode pending (waited above); the
        // JPEG's live bytes; a destination of `pitch * height` device bytes (the caller's
        // contract).
        let s = unsafe {
            (self.api.decode)(
                h.handle,
                h.state,
                item.jpeg.as_ptr(),
                item.jpeg.len(),
                format,
                &mut image,
                stream.cu_stream(),
            )
        };
        check(s, || format!("nvjpegDecode (hybrid, item {i})"))?;
        h.guard.record(stream).map_err(|e| drv_err("cuEventRecord(nvJPEG state guard)", e))?;
        Ok(())
    }
}

/// The `nvjpegImage_t` of an item: plane 0 only (interleaved RGB or luma).
fn output(item: &DecodeItem<'_>) -> Image {
    let mut image =
        Image { channel: [std::ptr::null_mut(); MAX_COMPONENT], pitch: [0; MAX_COMPONENT] };
    image.channel[0] = item.dst as *mut u8;
    image.pitch[0] = item.pitch;
    image
}

/// A handle on `backend` with the chroma upsampling asked for, or nvJPEG's default when the
/// handle refuses the flag; the status of the plain creation when that fails too.
fn create(
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

impl Drop for NvJpeg {
    fn drop(&mut self) {
        // Every state's last decode completes before its buffers are freed; errors while
        // tearing down have nowhere to go.
        let _ = self.ctx.bind_to_thread();
        let api = &self.api;
        if let Some(hw) = self.hardware.take() {
            for st in &hw.states {
                let _ = st.guard.synchronize();
                // SAFETY: created by this value, no decode pending, not used again.
                unsafe { (api.state_destroy)(st.state) };
            }
            // SAFETY: as above; the handle last.
            unsafe {
                (api.stream_destroy)(hw.stream);
                (api.destroy)(hw.handle);
            }
        }
        let _ = self.hybrid.guard.synchronize();
        // SAFETY: created by this value, no decode pending, not used again; the handle last.
        unsafe {
            (api.state_destroy)(self.hybrid.state);
            (api.destroy)(self.hybrid.handle);
        }
    }
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
