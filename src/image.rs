//! A validated, borrowed view of one input image (`sensor_msgs/Image` without ROS), the
//! encodings we decode, and why an image is rejected ([`ImageError`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Defines [`Encoding`] and everything derived from its one table: the variants and
/// their discriminants (the kernels' `ENC_*` codes, passed to NVRTC as defines by
/// `backend/cuda/kernels.rs`), [`Encoding::ALL`], the ROS names and aliases,
/// [`Encoding::supported_list`], bytes per pixel and [`Encoding::is_packed`].
macro_rules! encodings {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $code:literal, $name:literal $(| $alias:literal)*, bpp $bpp:literal,
        $packing:ident;
    )*) => {
        /// A pixel encoding of `sensor_msgs/Image` that vision_preproc decodes. The
        /// discriminants are the kernels' `ENC_*` codes (generated from this table).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum Encoding {
            $( $(#[$doc])* $variant = $code, )*
        }

        impl Encoding {
            /// Every supported encoding, in discriminant order.
            pub const ALL: [Encoding; [$($name),*].len()] = [$(Encoding::$variant),*];

            /// Parse a `sensor_msgs/Image` encoding string (exact, lower case as in
            /// `sensor_msgs/image_encodings.hpp`; `yuv422_yuy2` and `yuv422` are the older
            /// names of `yuyv` and `uyvy`).
            pub fn parse(s: &str) -> Result<Encoding, ImageError> {
                match s {
                    $( $name $(| $alias)* => Ok(Encoding::$variant), )*
                    other => Err(ImageError::UnknownEncoding(other.to_string())),
                }
            }

            /// The canonical ROS name.
            pub fn name(self) -> &'static str {
                match self {
                    $( Encoding::$variant => $name, )*
                }
            }

            /// The older names ROS also uses for this encoding.
            pub fn aliases(self) -> &'static [&'static str] {
                match self {
                    $( Encoding::$variant => &[$($alias),*], )*
                }
            }

            /// Bytes per pixel in a row of the (first) plane. 4:2:2 formats: 2 (4 bytes
            /// per 2 pixels); NV12/NV21: 1 (the Y plane).
            pub fn bytes_per_pixel(self) -> u32 {
                match self {
                    $( Encoding::$variant => $bpp, )*
                }
            }

            /// True when pixel `x` starts at byte `x * bpp` of its row (4:2:2: its pair at
            /// `(x & !1) * 2`): one plane, no mosaic. The CUDA kernel's staged path handles
            /// these.
            pub(crate) fn is_packed(self) -> bool {
                match self {
                    $( Encoding::$variant => Packing::$packing == Packing::Packed, )*
                }
            }
        }
    };
}

/// How an encoding's pixels lie in its rows (the last column of the table).
#[derive(PartialEq, Eq)]
enum Packing {
    /// Pixel `x` at byte `x * bpp` (4:2:2: its pair), one plane.
    Packed,
    /// A second plane (NV12/NV21) or a colour mosaic (Bayer).
    Planar,
}

encodings! {
    /// 3 x u8, R G B.
    Rgb8 = 0, "rgb8", bpp 3, Packed;
    /// 3 x u8, B G R.
    Bgr8 = 1, "bgr8", bpp 3, Packed;
    /// 4 x u8, R G B A (alpha ignored).
    Rgba8 = 2, "rgba8", bpp 4, Packed;
    /// 4 x u8, B G R A (alpha ignored).
    Bgra8 = 3, "bgra8", bpp 4, Packed;
    /// 1 x u8.
    Mono8 = 4, "mono8", bpp 1, Packed;
    /// 1 x u16 (byte order from `is_bigendian`).
    Mono16 = 5, "mono16", bpp 2, Packed;
    /// 3 x u16, R G B.
    Rgb16 = 6, "rgb16", bpp 6, Packed;
    /// 3 x u16, B G R.
    Bgr16 = 7, "bgr16", bpp 6, Packed;
    /// YUV 4:2:2, bytes Y0 U Y1 V (ROS `yuv422_yuy2`).
    Yuyv = 8, "yuyv" | "yuv422_yuy2", bpp 2, Packed;
    /// YUV 4:2:2, bytes U Y0 V Y1 (ROS `yuv422`).
    Uyvy = 9, "uyvy" | "yuv422", bpp 2, Packed;
    /// YUV 4:2:0, a Y plane then interleaved U V rows.
    Nv12 = 10, "nv12", bpp 1, Planar;
    /// YUV 4:2:0, a Y plane then interleaved V U rows.
    Nv21 = 11, "nv21", bpp 1, Planar;
    /// Bayer mosaic, first row R G R G.
    BayerRggb8 = 12, "bayer_rggb8", bpp 1, Planar;
    /// Bayer mosaic, first row B G B G.
    BayerBggr8 = 13, "bayer_bggr8", bpp 1, Planar;
    /// Bayer mosaic, first row G B G B.
    BayerGbrg8 = 14, "bayer_gbrg8", bpp 1, Planar;
    /// Bayer mosaic, first row G R G R.
    BayerGrbg8 = 15, "bayer_grbg8", bpp 1, Planar;
}

impl Encoding {
    /// The accepted `encoding` strings, for error messages: every name, with its aliases
    /// in parentheses (`yuyv (alias yuv422_yuy2)`).
    pub(crate) fn supported_list() -> String {
        let name = |e: Encoding| match e.aliases() {
            [] => e.name().to_string(),
            a => format!("{} (alias {})", e.name(), a.join(", ")),
        };
        Encoding::ALL.iter().map(|&e| name(e)).collect::<Vec<_>>().join(", ")
    }

    /// True for 16-bit samples (byte order matters).
    pub fn is_16bit(self) -> bool {
        matches!(self, Encoding::Mono16 | Encoding::Rgb16 | Encoding::Bgr16)
    }

    /// Rows of `step` bytes in `data`, times 2, for a `height`-row image (NV12/NV21 carry
    /// half as many chroma rows after the Y plane).
    fn rows_x2(self, height: u64) -> u64 {
        match self {
            Encoding::Nv12 | Encoding::Nv21 => height * 3,
            _ => height * 2,
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A borrowed, validated image: every constructor checks the header against the data,
/// so code that takes an `ImageView` never indexes out of bounds.
#[derive(Debug, Clone, Copy)]
pub struct ImageView<'a> {
    width: u32,
    height: u32,
    step: u32,
    encoding: Encoding,
    big_endian: bool,
    data: &'a [u8],
    /// The memory `data` lies in, when its owner lends it ([`Lent`]).
    lent: Option<&'a Lent>,
}

impl<'a> ImageView<'a> {
    /// Validate the fields of a `sensor_msgs/Image` and borrow its data.
    ///
    /// The data must be exactly `step * height` bytes (`step * height * 3 / 2` for
    /// NV12/NV21: a Y plane of `height` rows, then `height / 2` rows of interleaved
    /// chroma, all of `step` bytes).
    pub fn new(
        width: u32,
        height: u32,
        step: u32,
        encoding: &str,
        is_bigendian: bool,
        data: &'a [u8],
    ) -> Result<Self, ImageError> {
        let encoding = Encoding::parse(encoding)?;
        Self::with_encoding(width, height, step, encoding, is_bigendian, data)
    }

    /// [`ImageView::new`] with an already parsed encoding.
    pub fn with_encoding(
        width: u32,
        height: u32,
        step: u32,
        encoding: Encoding,
        is_bigendian: bool,
        data: &'a [u8],
    ) -> Result<Self, ImageError> {
        let expected = expected_len(width, height, step, encoding)?;
        if data.len() as u64 != expected {
            let expected_expr = match encoding {
                Encoding::Nv12 | Encoding::Nv21 => "step*height*3/2",
                _ => "step*height",
            };
            return Err(ImageError::DataSize {
                len: data.len(),
                expected,
                expected_expr,
                encoding,
            });
        }
        Ok(ImageView { width, height, step, encoding, big_endian: is_bigendian, data, lent: None })
    }

    /// A view of parts that [`ImageView::with_encoding`] already accepted over these same
    /// bytes: a frame that owns its bytes (`capture::Frame`) checks them once and then
    /// lends views of them (`compressed::Decoded` likewise). Only for owners whose bytes
    /// never change.
    pub(crate) fn validated(
        width: u32,
        height: u32,
        step: u32,
        encoding: Encoding,
        big_endian: bool,
        data: &'a [u8],
    ) -> Self {
        debug_assert!(Self::with_encoding(width, height, step, encoding, big_endian, data).is_ok());
        ImageView { width, height, step, encoding, big_endian, data, lent: None }
    }

    /// This view, its bytes lying in `lent` (a view whose bytes lie elsewhere ignores
    /// it: a backend reads in place only bytes inside the lent range).
    // Used by the GStreamer capture only (src/capture/, src/ros/node/camera.rs).
    #[cfg_attr(not(feature = "gstreamer"), allow(dead_code))]
    pub(crate) fn lent_from(self, lent: &'a Lent) -> Self {
        ImageView { lent: Some(lent), ..self }
    }

    /// The memory its bytes lie in, when its owner lends it for the submissions that read
    /// them ([`Lent`]): a GStreamer pool's buffer.
    pub fn lent(&self) -> Option<&'a Lent> {
        self.lent
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }
    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }
    /// Row stride in bytes.
    pub fn step(&self) -> u32 {
        self.step
    }
    /// Pixel encoding.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }
    /// Byte order of 16-bit samples (ignored for 8-bit encodings).
    pub fn big_endian(&self) -> bool {
        self.big_endian
    }
    /// The bytes, exactly as long as the header says.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
}

/// The bytes of an image of this header (`step * height`, `* 3 / 2` for NV12/NV21), after
/// the header's own checks: size, even sizes where chroma is subsampled, a step of at
/// least one row, and at most 2 GiB (every index on the GPU is 32-bit).
fn expected_len(width: u32, height: u32, step: u32, encoding: Encoding) -> Result<u64, ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::ZeroSize { width, height });
    }
    match encoding {
        Encoding::Yuyv | Encoding::Uyvy if !width.is_multiple_of(2) => {
            return Err(ImageError::OddWidth { width, encoding });
        }
        Encoding::Nv12 | Encoding::Nv21
            if !width.is_multiple_of(2) || !height.is_multiple_of(2) =>
        {
            return Err(ImageError::OddSize { width, height, encoding });
        }
        _ => {}
    }
    let bpp = encoding.bytes_per_pixel();
    let min = u64::from(width) * u64::from(bpp);
    if u64::from(step) < min {
        return Err(ImageError::StepTooSmall { step, bpp, min, encoding });
    }
    // step * height * 2 (* 3 / 2 for NV12/NV21) can exceed 64 bits: checked, else it
    // wraps in release builds to a small size that a tiny payload matches (found while
    // writing the fuzz harness; regression cases in test/fuzz_corpus.rs).
    // Every index we compute is an i32/u32 on the GPU: keep the buffer under 2 GiB.
    u64::from(step)
        .checked_mul(encoding.rows_x2(u64::from(height)))
        .map(|x2| x2 / 2)
        .filter(|&bytes| bytes <= i32::MAX as u64)
        .ok_or(ImageError::Overflow { width, height, step, encoding })
}

/// Host memory a frame's bytes lie in, lent by their owner (a GStreamer pool's buffer,
/// `capture::Frame`) to the submissions that read them, so that a GPU backend may read
/// them where they are instead of copying them into its staging buffer: it registers the
/// memory with the driver the first time it sees it and keeps the registration until the
/// memory is freed ([`LentMemory::freed`]).
///
/// The promise, made by the unsafe `Lent::new`: the `len` bytes at `base` are one
/// allocation that stays allocated until its [`LentMemory`] says it was freed (told
/// before the memory is released), and a frame's bytes in it do not change while a
/// submission that reads them is in flight (the pipeline keeps a set's frames until it is
/// finished: `pipeline::InFlight`).
#[derive(Debug)]
pub struct Lent {
    base: usize,
    len: usize,
    memory: Arc<LentMemory>,
    reads: Arc<LentReads>,
    /// Its frame was counted in `reads` (a batch reads a camera's frame again while the
    /// camera has no newer one: counted once).
    counted: AtomicBool,
}

impl Lent {
    /// The `len` bytes at `base`, the allocation `memory` stands for; what backends do
    /// with it is counted in `reads`.
    ///
    /// # Safety
    /// The promise in [`Lent`]'s description.
    // Used by the GStreamer capture only (src/capture/, src/ros/node/camera.rs).
    #[cfg_attr(not(feature = "gstreamer"), allow(dead_code))]
    pub(crate) unsafe fn new(
        base: *const u8,
        len: usize,
        memory: Arc<LentMemory>,
        reads: Arc<LentReads>,
    ) -> Lent {
        Lent { base: base as usize, len, memory, reads, counted: AtomicBool::new(false) }
    }

    /// The allocation: its first byte's address and its length.
    pub fn range(&self) -> (*const u8, usize) {
        (self.base as *const u8, self.len)
    }

    /// The offset of `data` in the allocation, when all of `data` and `slack` bytes after
    /// it lie inside it.
    pub fn offset_of(&self, data: &[u8], slack: usize) -> Option<usize> {
        let at = (data.as_ptr() as usize).checked_sub(self.base)?;
        (at.checked_add(data.len())?.checked_add(slack)? <= self.len).then_some(at)
    }

    /// The allocation's identity and whether it was freed.
    pub fn memory(&self) -> &Arc<LentMemory> {
        &self.memory
    }

    /// Count its frame read in place (`Ok`), or copied into a staging buffer and why (the
    /// reason's short stable name, counted by name, and its message): the first read only
    /// (a frame read again is the same frame).
    pub fn count_read(&self, read: std::result::Result<(), (&'static str, String)>) {
        if self.counted.swap(true, Ordering::Relaxed) {
            return;
        }
        match read {
            Ok(()) => self.reads.in_place.fetch_add(1, Ordering::Relaxed),
            Err((kind, why)) => {
                let mut by = self.reads.staged_by.lock().unwrap_or_else(|p| p.into_inner());
                *by.entry(kind).or_default() += 1;
                drop(by);
                *self.reads.why_staged.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                self.reads.staged.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// The identity of a lent allocation (compare with [`Arc::ptr_eq`]) and whether it was
/// freed: its owner calls [`LentMemory::free`] before it releases the memory.
#[derive(Debug, Default)]
pub struct LentMemory {
    freed: AtomicBool,
}

impl LentMemory {
    /// Say that the memory is being released: registrations of it must go.
    pub fn free(&self) {
        self.freed.store(true, Ordering::SeqCst);
    }
    /// Whether [`LentMemory::free`] was called.
    pub fn freed(&self) -> bool {
        self.freed.load(Ordering::SeqCst)
    }
}

/// What backends did with a source's lent frames: read in place (a GPU backend from the
/// registered memory), or copied once into a staging buffer. A backend that reads host
/// memory directly (the CPU backend) counts neither.
#[derive(Debug, Default)]
pub struct LentReads {
    /// Frames read in place.
    pub in_place: AtomicU64,
    /// Frames copied into a staging buffer.
    pub staged: AtomicU64,
    /// Why the last of those was not read in place.
    pub why_staged: std::sync::Mutex<Option<String>>,
    /// Those frames by the short name of why they were not read in place (the CUDA
    /// backend's `NotInPlace::kind`: `unsupported`, `too_many`, `refused`, ...).
    pub staged_by: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Frames that lay in device memory ([`DeviceMemory`]: a decoder's CUDA memory), read
    /// there by the GPU: no upload, no host copy.
    pub on_device: AtomicU64,
}

/// Device memory a frame's pixels lie in (GStreamer's CUDA memory, written by a hardware
/// decoder such as `nvh264dec`), lent by its owner (`capture::Frame`) to the submissions
/// that read it: the CUDA backend's kernels read it in place, and a backend that reads
/// host memory refuses it ([`DeviceView`]).
///
/// The promise, made by the unsafe `DeviceMemory::new`: the `len` bytes at device address
/// `ptr` belong to the CUDA context `context`, stay allocated and unchanged while the owner
/// lives (it keeps the buffer mapped), and were completely written when it was made (the
/// decoder's copy finished).
#[derive(Debug)]
pub struct DeviceMemory {
    ptr: u64,
    len: usize,
    context: usize,
    reads: Arc<LentReads>,
    /// Its frame was counted in `reads` (a batch may read a frame again: counted once).
    counted: AtomicBool,
}

impl DeviceMemory {
    /// The `len` bytes at device address `ptr` of CUDA context `context` (a `CUcontext`
    /// as an address); what backends do with it is counted in `reads`.
    ///
    /// # Safety
    /// The promise in [`DeviceMemory`]'s description.
    // Used by the GStreamer capture only (src/capture/).
    #[cfg_attr(not(feature = "gstreamer"), allow(dead_code))]
    pub(crate) unsafe fn new(
        ptr: u64,
        len: usize,
        context: usize,
        reads: Arc<LentReads>,
    ) -> DeviceMemory {
        DeviceMemory { ptr, len, context, reads, counted: AtomicBool::new(false) }
    }

    /// Its device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The CUDA context it belongs to (a `CUcontext` as an address).
    pub fn context(&self) -> usize {
        self.context
    }
    /// Count its frame read in place on the device (the first read only).
    pub fn count_read(&self) {
        if !self.counted.swap(true, Ordering::Relaxed) {
            self.reads.on_device.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A GPU backend's CUDA context as the GStreamer capture shares it (`capture::GpuShare`):
/// the `CUcontext` and `CUdevice` as numbers, and what keeps the context alive while
/// GStreamer's elements allocate in it.
#[derive(Clone)]
pub struct DeviceContext {
    /// The `CUcontext`, as an address.
    pub handle: usize,
    /// The `CUdevice` (the device's ordinal).
    pub device: i32,
    /// Keeps the context alive (the backend's own handle on it).
    pub keep: Arc<dyn std::any::Any + Send + Sync>,
}

impl fmt::Debug for DeviceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceContext")
            .field("handle", &format_args!("{:#x}", self.handle))
            .field("device", &self.device)
            .finish()
    }
}

/// A validated image whose pixels lie in device memory ([`DeviceMemory`]), in the layout of
/// an [`ImageView`]: rows of `step` bytes from the memory's first byte, for NV12/NV21 the
/// chroma plane right after `height` rows (GStreamer's CUDA memory lays NV12 out so: one
/// pitch for both planes, chroma at `pitch * height`).
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    width: u32,
    height: u32,
    step: u32,
    encoding: Encoding,
    memory: &'a DeviceMemory,
}

impl<'a> DeviceView<'a> {
    /// A view of `memory` with this header: refused as an [`ImageView`] of the same header
    /// would be, and when the memory is shorter than the header says.
    pub fn new(
        width: u32,
        height: u32,
        step: u32,
        encoding: Encoding,
        memory: &'a DeviceMemory,
    ) -> Result<Self, ImageError> {
        let expected = expected_len(width, height, step, encoding)?;
        if (memory.len as u64) < expected {
            let expected_expr = match encoding {
                Encoding::Nv12 | Encoding::Nv21 => "step*height*3/2",
                _ => "step*height",
            };
            return Err(ImageError::DataSize {
                len: memory.len,
                expected,
                expected_expr,
                encoding,
            });
        }
        Ok(DeviceView { width, height, step, encoding, memory })
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }
    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }
    /// Row stride in bytes (the memory's pitch).
    pub fn step(&self) -> u32 {
        self.step
    }
    /// Pixel encoding.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }
    /// The device memory holding the pixels.
    pub fn memory(&self) -> &'a DeviceMemory {
        self.memory
    }
    /// Bytes of the image (`step * height`, `* 3 / 2` for NV12/NV21).
    pub fn len(&self) -> usize {
        (u64::from(self.step) * self.encoding.rows_x2(u64::from(self.height)) / 2) as usize
    }
    /// Whether the image has no bytes (never: its sizes are at least 1).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why an input image was rejected. Each variant names the `sensor_msgs/Image` field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// `encoding` is not one we decode.
    #[error("encoding `{0}` is not supported; use one of: {list}", list = Encoding::supported_list())]
    UnknownEncoding(String),
    /// `width` or `height` is zero.
    #[error("width {width} x height {height}: both must be at least 1")]
    ZeroSize {
        /// `width` field.
        width: u32,
        /// `height` field.
        height: u32,
    },
    /// `width` * bytes per pixel (or step * height) does not fit in memory arithmetic.
    #[error("width {width} x height {height} with step {step} overflows the byte count for encoding {encoding}")]
    Overflow {
        /// `width` field.
        width: u32,
        /// `height` field.
        height: u32,
        /// `step` field.
        step: u32,
        /// Parsed encoding.
        encoding: Encoding,
    },
    /// `step` is smaller than one row of pixels.
    #[error("step {step} < width*{bpp} ({min}) for encoding {encoding}; step is the row length in bytes")]
    StepTooSmall {
        /// `step` field.
        step: u32,
        /// Bytes per pixel of the encoding (for 4:2:2, 2).
        bpp: u32,
        /// width * bytes per pixel.
        min: u64,
        /// Parsed encoding.
        encoding: Encoding,
    },
    /// `data` is not exactly the size the header describes.
    #[error("data is {len} bytes but {expected_expr} = {expected} for encoding {encoding}")]
    DataSize {
        /// `data.len()`.
        len: usize,
        /// The size the header implies.
        expected: u64,
        /// How `expected` was computed (e.g. "step*height").
        expected_expr: &'static str,
        /// Parsed encoding.
        encoding: Encoding,
    },
    /// 4:2:2 encodings pack two pixels in four bytes: width must be even.
    #[error("width {width} is odd; {encoding} packs 2 pixels per 4 bytes, so width must be even")]
    OddWidth {
        /// `width` field.
        width: u32,
        /// Parsed encoding.
        encoding: Encoding,
    },
    /// 4:2:0 encodings subsample both axes: width and height must be even.
    #[error(
        "width {width} x height {height}: {encoding} subsamples chroma 2x2, so both must be even"
    )]
    OddSize {
        /// `width` field.
        width: u32,
        /// `height` field.
        height: u32,
        /// Parsed encoding.
        encoding: Encoding,
    },
    /// The configured `roi` does not lie inside the image.
    #[error("roi [x {x}, y {y}, width {w}, height {h}] is not inside the {width}x{height} image; shrink `roi` or set it to [] for the whole image")]
    RoiOutside {
        /// roi x.
        x: u32,
        /// roi y.
        y: u32,
        /// roi width.
        w: u32,
        /// roi height.
        h: u32,
        /// Image width.
        width: u32,
        /// Image height.
        height: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_name_and_alias() {
        for e in Encoding::ALL {
            assert_eq!(Encoding::parse(e.name()), Ok(e));
        }
        assert_eq!(Encoding::parse("yuv422_yuy2"), Ok(Encoding::Yuyv));
        assert_eq!(Encoding::parse("yuv422"), Ok(Encoding::Uyvy));
        let err = Encoding::parse("8UC3").unwrap_err();
        assert_eq!(err, ImageError::UnknownEncoding("8UC3".into()));
        assert!(err.to_string().contains("encoding `8UC3` is not supported"), "{err}");
    }

    #[test]
    fn discriminants_follow_all() {
        for (i, e) in Encoding::ALL.iter().enumerate() {
            assert_eq!(*e as u32, i as u32);
        }
    }

    #[test]
    fn rejects_bad_headers_with_the_field_named() {
        let d = vec![0u8; 12];
        let e = ImageView::new(4, 1, 11, "rgb8", false, &d).unwrap_err();
        assert_eq!(
            e.to_string(),
            "step 11 < width*3 (12) for encoding rgb8; step is the row length in bytes"
        );
        let e = ImageView::new(4, 2, 12, "rgb8", false, &d).unwrap_err();
        assert_eq!(e.to_string(), "data is 12 bytes but step*height = 24 for encoding rgb8");
        let e = ImageView::new(0, 2, 12, "rgb8", false, &d).unwrap_err();
        assert!(matches!(e, ImageError::ZeroSize { width: 0, height: 2 }));
        let e = ImageView::new(3, 2, 6, "yuyv", false, &d).unwrap_err();
        assert!(matches!(e, ImageError::OddWidth { width: 3, .. }));
        let e = ImageView::new(4, 3, 4, "nv12", false, &d).unwrap_err();
        assert!(matches!(e, ImageError::OddSize { width: 4, height: 3, .. }));
        let e = ImageView::new(u32::MAX, u32::MAX, u32::MAX, "rgb16", false, &d).unwrap_err();
        assert!(matches!(e, ImageError::StepTooSmall { .. }), "{e:?}");
        let e = ImageView::new(65536, 65536, 196608, "rgb8", false, &d).unwrap_err();
        assert!(matches!(e, ImageError::Overflow { .. }), "{e:?}");
    }

    #[test]
    fn byte_counts_beyond_64_bits_are_rejected_not_wrapped() {
        // step * height * 2 = 2154230017 * 4281516813 * 2 = 2^64 + 26: it used to wrap to
        // 26 / 2 = 13 bytes in release builds, accept this 13-byte payload as a 4-billion-row
        // image, and panic the node's processing thread reading row 2^31 (debug builds
        // panicked on the multiplication itself).
        let d = [7u8; 13];
        let e = ImageView::new(1, 4_281_516_813, 2_154_230_017, "mono8", false, &d).unwrap_err();
        assert_eq!(
            e,
            ImageError::Overflow {
                width: 1,
                height: 4_281_516_813,
                step: 2_154_230_017,
                encoding: Encoding::Mono8
            }
        );
        // NV12: step * height * 3 = 2^64 + 2 * 5968.
        let d = vec![0x80u8; 5968];
        let e = ImageView::new(2, 2_863_173_372, 2_147_587_272, "nv12", false, &d).unwrap_err();
        assert!(matches!(e, ImageError::Overflow { .. }), "{e:?}");
        // u32::MAX rows of u32::MAX bytes: 2 * (2^32 - 1)^2 > 2^64 too.
        let e = ImageView::new(1, u32::MAX, u32::MAX, "mono8", false, &d).unwrap_err();
        assert!(matches!(e, ImageError::Overflow { .. }), "{e:?}");
    }

    #[test]
    fn nv12_size_includes_the_chroma_rows() {
        let d = vec![0u8; 4 * 2 * 3 / 2];
        assert!(ImageView::new(4, 2, 4, "nv12", false, &d).is_ok());
        let e = ImageView::new(4, 2, 4, "nv12", false, &d[..8]).unwrap_err();
        assert_eq!(e.to_string(), "data is 8 bytes but step*height*3/2 = 12 for encoding nv12");
    }
}
