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
//!
//! [`DecodeError::Corrupt`]: crate::compressed::DecodeError::Corrupt
//! [`CudaError::NvJpeg`]: crate::error::CudaError::NvJpeg

mod api;
mod decoder;

use crate::compressed::Codec;
pub use api::{probe_library, DEFAULT_LIBRARIES, LIBRARY_ENV, SYMBOLS};
use api::{Api, Handle, JpegStream, State};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaEvent};
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::Arc;

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

/// Where the backend decodes JPEG frames.
pub(crate) enum JpegDecoder {
    /// nvJPEG, into the device buffer the fused kernel reads (`steps.rs`, decode).
    Gpu(Box<NvJpeg>),
    /// On the host, as PNG (the CPU decoder, then staged and uploaded): nvJPEG could not
    /// be opened, and why.
    Host(String),
}

impl JpegDecoder {
    /// nvJPEG on `ctx`, else the host and why.
    pub(crate) fn open(ctx: &Arc<CudaContext>) -> Self {
        match NvJpeg::open(ctx) {
            Ok(nv) => JpegDecoder::Gpu(Box::new(nv)),
            Err(e) => JpegDecoder::Host(e.to_string()),
        }
    }

    /// nvJPEG, `Misuse` when it is not available (the frame should have been decoded on
    /// the host: [`JpegDecoder::takes`] said no).
    pub(crate) fn gpu(&mut self) -> crate::error::Result<&mut NvJpeg> {
        match self {
            JpegDecoder::Gpu(nv) => Ok(nv),
            JpegDecoder::Host(why) => Err(crate::error::Error::misuse(
                "decoding a JPEG on the device",
                format!("nvJPEG is not available ({why}): the frame is decoded on the host"),
            )),
        }
    }

    /// Whether `c` is decoded on the device: a JPEG whose header nvJPEG reads as the
    /// header check did (else the host decodes it, or refuses it with the CPU decoder's
    /// reason). An MJPEG frame without Huffman tables is read, and staged, with the
    /// standard ones (`compressed::jpeg_pieces`).
    pub(crate) fn takes(&self, c: &crate::compressed::Compressed<'_>) -> bool {
        match self {
            JpegDecoder::Gpu(nv) => {
                c.codec() == Codec::Jpeg && {
                    let jpeg = crate::compressed::with_standard_huffman_tables(c.data());
                    let grey = c.encoding() == crate::image::Encoding::Mono8;
                    nv.accepts(&jpeg, c.width(), c.height(), grey)
                }
            }
            JpegDecoder::Host(_) => false,
        }
    }

    /// Where compressed frames are decoded, and the JPEG frames nvJPEG decoded so far by
    /// each of its decoders (`/diagnostics`, `vision_preproc info`).
    pub(crate) fn describe(&self) -> String {
        let host = crate::backend::HOST_DECODERS;
        match self {
            JpegDecoder::Gpu(nv) => {
                let c = nv.counts();
                let hybrid: Vec<String> =
                    c.hybrid.iter().map(|(why, n)| format!("{n} {}", why.describe())).collect();
                format!(
                    "JPEG on the GPU: {} (decoded: {} by the hardware decoder{}{}); PNG, and a \
                     JPEG whose header nvJPEG does not read, on the host ({host}), then staged \
                     and uploaded like raw frames",
                    nv.describe(),
                    c.hardware,
                    if hybrid.is_empty() { "" } else { "; " },
                    hybrid.join("; ")
                )
            }
            JpegDecoder::Host(why) => format!(
                "on the host ({host}), then staged and uploaded like raw frames; no JPEG \
                 decoding on the GPU: {why}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoding on the device when nvJPEG did not open: a misuse (the frame should have
    /// been decoded on the host), never a device failure; reachable without a GPU.
    #[test]
    fn the_device_decoder_without_nvjpeg_is_a_misuse() {
        let mut host = JpegDecoder::Host("no libnvjpeg here".into());
        let e = host.gpu().err().map(|e| (e.is_device_failure(), e.to_string()));
        let why = "decoding a JPEG on the device: nvJPEG is not available (no libnvjpeg here): \
                   the frame is decoded on the host";
        assert_eq!(e, Some((false, why.to_string())));
        assert!(matches!(host.gpu(), Err(crate::Error::Misuse { .. })));
        assert!(host.describe().contains("no JPEG decoding on the GPU: no libnvjpeg here"));
    }
}
