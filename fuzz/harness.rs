//! The fuzz harness over message validation and the CPU pipeline, shared by the cargo-fuzz
//! target (`fuzz/fuzz_targets/frame.rs`) and the corpus test (`test/fuzz_corpus.rs`, which
//! feeds every file of `fuzz/corpus/frame/` through [`run`] on stable Rust, in CI).
//!
//! One input is a small configuration plus one `sensor_msgs/Image` (header fields, encoding
//! string, payload), built in one of four ways. Byte layout:
//!
//! ```text
//! [0] bits 0-1 mode: 0 raw header, 1 consistent header, 2 consistent header with one field
//!                    off by a delta, 3 CDR message (wire::msgs::Image::decode, as `replay` reads)
//!     bit 2 AVX2 (else baseline) | bit 3 one output channel | bit 4 NHWC | bit 5 float16
//!     bit 6 nearest (else linear) | bit 7 bgr channel order
//! [1] network width  1 + b % 24          [2] network height 1 + b % 24
//! [3] b % 3 resize mode (stretch, letterbox, center_crop) | bit 2 top-left anchor
//!     bits 3-4 roi: 0/3 none, 1 inside the image, 2 raw bytes | bits 5-7 conv kernel
//! [4] encoding: b < 0xC0: ENCODINGS[b % len] (valid names, aliases, near misses);
//!     else a string of b & 0x1f bytes, read right after [7] (lossy UTF-8)
//! [5] is_bigendian      [6] pad value      [7] conv border (b % 3)
//! [..] the encoding string, if [4] >= 0xC0
//! [..] roi: 4 bytes x, y, w - 1, h - 1, when bits 3-4 of [3] are 1 or 2
//! then by mode:
//!   raw:        width, height, step as u32 LE; data = the rest, as is
//!   consistent: width 1 + b % 40, height 1 + b % 40 (made even where the encoding needs
//!               it), step padding b % 8; data = the rest repeated to exactly the size
//!   off:        as consistent, then field (b % 5: width, height, step, data length,
//!               is_bigendian) and a delta (i32 LE, data length clamped to +-65536)
//!   cdr:        the rest is a CDR sensor_msgs/Image
//! ```
//!
//! What holds for every input, or [`run`] panics (a finding):
//! - `ImageView::new` accepts the header exactly when an independent predicate written
//!   here ([`faults`], u128 arithmetic, its own encoding table) finds nothing wrong; a
//!   rejection's variant is one of the faults found and its message names that field.
//!   Headers claiming gigabytes are rejected before anything is allocated.
//! - On an accepted image, `Pipeline::process` (CPU backend) succeeds, or rejects a `roi`
//!   that the predicate also finds outside the image, naming `roi`; any other error fails.
//! - A processed tensor has the configured shape and byte length, finite values, within
//!   [0, 1] for the normalization used here (scale 1/255, mean 0, std 1) unless a
//!   derivative conv kernel runs; without conv it equals the reference (one element at a
//!   time, `backend::cpu::reference`) bit for bit; a second run of the same pipeline on the
//!   same frame gives the same bytes.
//!
//! Valid frames stay small (40x40 at most, network 24x24); any size can be claimed by a
//! raw header with a tiny payload, which must be rejected before allocation.

use vision_preproc::backend::cpu::{reference, CpuBackend, Simd};
use vision_preproc::backend::read_elements;
use vision_preproc::config::{
    BackendChoice, Border, ChannelOrder, Config, ConvConfig, ConvKernel, DType, Interpolation,
    Layout, LetterboxAnchor, ResizeMode,
};
use vision_preproc::error::ImageError;
use vision_preproc::pipeline::{preprocess_op, Geometry};
use vision_preproc::wire::msgs::Image as CdrImage;
use vision_preproc::{Error, ImageView, Pipeline};

/// Encoding strings the selector byte picks from: every valid name and alias first, then
/// near misses (case, whitespace, NUL, truncation, extra suffix, other ROS encodings).
pub const ENCODINGS: &[&str] = &[
    "rgb8",
    "bgr8",
    "rgba8",
    "bgra8",
    "mono8",
    "mono16",
    "rgb16",
    "bgr16",
    "yuyv",
    "yuv422_yuy2",
    "uyvy",
    "yuv422",
    "nv12",
    "nv21",
    "bayer_rggb8",
    "bayer_bggr8",
    "bayer_gbrg8",
    "bayer_grbg8",
    "",
    "RGB8",
    "Bgr8",
    "rgb8 ",
    " mono8",
    "mono8\0",
    "bgr8\n",
    "rgb",
    "rgb16be",
    "mono",
    "mono32",
    "yuv422_yuy",
    "yuv422_yuy2 ",
    "NV12",
    "nv1",
    "nv12x",
    "i420",
    "bayer_rggb16",
    "bayer_rggb",
    "8UC3",
    "16UC1",
    "32FC1",
    "rgba8\u{feff}",
];

/// Bytes per pixel of the first plane and the subsampling rule of each valid name: the
/// specification (docs/SPEC.md, `sensor_msgs/image_encodings.hpp`), written
/// here independently of `vision_preproc::Encoding`.
fn spec(name: &str) -> Option<(u64, Subsampling)> {
    use Subsampling::*;
    Some(match name {
        "rgb8" | "bgr8" => (3, Full),
        "rgba8" | "bgra8" => (4, Full),
        "mono8" => (1, Full),
        "mono16" => (2, Full),
        "rgb16" | "bgr16" => (6, Full),
        "yuyv" | "yuv422_yuy2" | "uyvy" | "yuv422" => (2, Yuv422),
        "nv12" | "nv21" => (1, Yuv420),
        "bayer_rggb8" | "bayer_bggr8" | "bayer_gbrg8" | "bayer_grbg8" => (1, Full),
        _ => return None,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subsampling {
    Full,
    /// Width must be even.
    Yuv422,
    /// Width and height must be even; height * 3 / 2 rows of `step` bytes.
    Yuv420,
}

/// The largest accepted image, in bytes (GPU indices are 32-bit signed).
const MAX_IMAGE_BYTES: u128 = i32::MAX as u128;

/// What [`run`] did with an input.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A tensor of this shape was produced (and checked).
    Processed {
        /// Tensor shape, layout order, batch first.
        shape: [u32; 4],
    },
    /// The frame (or the CDR message, or the roi) was rejected.
    Rejected {
        /// The field the error names: `width`, `height`, `step`, `data`, `encoding`,
        /// `roi`, or a CDR field such as `header.frame_id`.
        field: &'static str,
        /// The error message.
        message: String,
    },
}

/// The image fields of a `sensor_msgs/Image`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// `width`.
    pub width: u32,
    /// `height`.
    pub height: u32,
    /// `step`.
    pub step: u32,
    /// `encoding`.
    pub encoding: String,
    /// `is_bigendian`.
    pub is_bigendian: u8,
    /// `data`.
    pub data: Vec<u8>,
}

/// Reads the input front to back; past the end it yields zeros.
struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = self.pos.saturating_add(n).min(self.data.len());
        self.pos = self.pos.saturating_add(n);
        &self.data[start..end]
    }
    fn rest(&mut self) -> &'a [u8] {
        self.take(usize::MAX)
    }
}

/// How the input asks for a region of interest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoiRequest {
    None,
    /// `[x, y, w, h]` folded into the image (valid).
    Inside([u8; 4]),
    /// `[x, y, w, h]` as given (often outside the image).
    Raw([u8; 4]),
}

/// The configuration bytes [1..=3] select (always valid), the roi request and the CPU
/// build; `mode` is byte [0].
fn config_of(b: &mut Bytes<'_>, mode: u8) -> (Config, RoiRequest, Simd) {
    let (w, h, geo) = (b.u8(), b.u8(), b.u8());
    let kernel = match geo >> 5 {
        0..=2 => ConvKernel::None,
        3 => ConvKernel::Box,
        4 => ConvKernel::Gaussian,
        5 => ConvKernel::SobelX,
        6 => ConvKernel::Laplacian,
        _ => ConvKernel::Custom,
    };
    let size = match kernel {
        ConvKernel::Gaussian => 5,
        ConvKernel::Laplacian => 1,
        _ => 3,
    };
    // Custom: a 4-neighbour mean (weights >= 0, sum 1), so values stay in [0, 1].
    let weights = if kernel == ConvKernel::Custom {
        vec![0.0, 0.25, 0.0, 0.25, 0.0, 0.25, 0.0, 0.25, 0.0]
    } else {
        Vec::new()
    };
    let config = Config {
        network_image_width: 1 + u32::from(w) % 24,
        network_image_height: 1 + u32::from(h) % 24,
        resize_mode: [ResizeMode::Stretch, ResizeMode::Letterbox, ResizeMode::CenterCrop]
            [usize::from(geo % 3)],
        letterbox_anchor: if geo & 4 != 0 {
            LetterboxAnchor::TopLeft
        } else {
            LetterboxAnchor::Center
        },
        interpolation: if mode & 0x40 != 0 {
            Interpolation::Nearest
        } else {
            Interpolation::Linear
        },
        channel_order: if mode & 0x80 != 0 { ChannelOrder::Bgr } else { ChannelOrder::Rgb },
        output_channels: if mode & 0x08 != 0 { 1 } else { 3 },
        output_layout: if mode & 0x10 != 0 { Layout::Nhwc } else { Layout::Nchw },
        output_dtype: if mode & 0x20 != 0 { DType::Float16 } else { DType::Float32 },
        pixel_scale: 1.0 / 255.0,
        image_mean: vec![0.0],
        image_stddev: vec![1.0],
        conv: ConvConfig { kernel, size, sigma: 0.0, weights, border: Border::Replicate },
        backend: BackendChoice::Cpu,
        ..Config::default()
    };
    let roi = match (geo >> 3) & 3 {
        1 => RoiRequest::Inside([0; 4]),
        2 => RoiRequest::Raw([0; 4]),
        _ => RoiRequest::None,
    };
    let simd = if mode & 0x04 != 0 { Simd::Avx2 } else { Simd::Baseline };
    (config, roi, simd)
}

impl RoiRequest {
    fn with_bytes(self, v: [u8; 4]) -> Self {
        match self {
            RoiRequest::Inside(_) => RoiRequest::Inside(v),
            RoiRequest::Raw(_) => RoiRequest::Raw(v),
            RoiRequest::None => RoiRequest::None,
        }
    }
    /// The `roi` parameter for a `width` x `height` image.
    fn resolve(self, width: u32, height: u32) -> Vec<i64> {
        match self {
            RoiRequest::None => Vec::new(),
            RoiRequest::Raw([x, y, w, h]) => {
                vec![i64::from(x), i64::from(y), i64::from(w) + 1, i64::from(h) + 1]
            }
            RoiRequest::Inside([x, y, w, h]) => {
                let (width, height) = (i64::from(width.max(1)), i64::from(height.max(1)));
                let x = i64::from(x) % width;
                let y = i64::from(y) % height;
                let w = 1 + i64::from(w) % (width - x);
                let h = 1 + i64::from(h) % (height - y);
                vec![x, y, w, h]
            }
        }
    }
}

/// Decode an input into the configuration and the frame (or a CDR rejection).
fn parse(input: &[u8]) -> (Config, Simd, Result<Frame, Outcome>) {
    let mut b = Bytes { data: input, pos: 0 };
    let mode = b.u8();
    let (mut config, roi, simd) = config_of(&mut b, mode);
    let enc_sel = b.u8();
    let is_bigendian = b.u8();
    let pad = b.u8();
    let border = b.u8();
    config.pad_value = vec![f64::from(pad)];
    config.conv.border =
        [Border::Replicate, Border::Constant, Border::Reflect101][usize::from(border % 3)];
    let encoding = if enc_sel < 0xC0 {
        ENCODINGS[usize::from(enc_sel) % ENCODINGS.len()].to_string()
    } else {
        String::from_utf8_lossy(b.take(usize::from(enc_sel & 0x1f))).into_owned()
    };
    let roi = if roi == RoiRequest::None {
        roi
    } else {
        roi.with_bytes([b.u8(), b.u8(), b.u8(), b.u8()])
    };
    let frame = match mode & 3 {
        0 => {
            let (width, height, step) = (b.u32(), b.u32(), b.u32());
            Ok(Frame { width, height, step, encoding, is_bigendian, data: b.rest().to_vec() })
        }
        1 | 2 => {
            let mut f = consistent_frame(&mut b, encoding, is_bigendian);
            if mode & 3 == 2 {
                let field = b.u8() % 5;
                let delta = b.u32() as i32;
                perturb(&mut f, field, delta);
            }
            let rest = b.rest();
            fill(&mut f.data, rest);
            Ok(f)
        }
        _ => match CdrImage::decode(b.rest()) {
            Ok(m) => Ok(Frame {
                width: m.width,
                height: m.height,
                step: m.step,
                encoding: m.encoding,
                is_bigendian: m.is_bigendian,
                data: m.data.to_vec(),
            }),
            Err(e) => {
                let message = e.to_string();
                Err(Outcome::Rejected { field: e.field, message })
            }
        },
    };
    if let Ok(f) = &frame {
        config.roi = roi.resolve(f.width, f.height);
    }
    (config, simd, frame)
}

/// A small frame whose header matches its (zero-filled, filled later) data.
fn consistent_frame(b: &mut Bytes<'_>, encoding: String, is_bigendian: u8) -> Frame {
    let (bpp, sub) = spec(&encoding).unwrap_or((1, Subsampling::Full));
    let mut width = 1 + u32::from(b.u8()) % 40;
    let mut height = 1 + u32::from(b.u8()) % 40;
    if sub != Subsampling::Full {
        width += width % 2;
    }
    if sub == Subsampling::Yuv420 {
        height += height % 2;
    }
    let step = width * bpp as u32 + u32::from(b.u8() % 8);
    let rows = if sub == Subsampling::Yuv420 { height * 3 / 2 } else { height };
    let data = vec![0u8; (step * rows) as usize];
    Frame { width, height, step, encoding, is_bigendian, data }
}

/// Put one field off by `delta` (the data length by at most 65536 bytes).
fn perturb(f: &mut Frame, field: u8, delta: i32) {
    match field {
        0 => f.width = f.width.wrapping_add_signed(delta),
        1 => f.height = f.height.wrapping_add_signed(delta),
        2 => f.step = f.step.wrapping_add_signed(delta),
        3 => {
            let d = delta.clamp(-65536, 65536);
            let len = (f.data.len() as i64 + i64::from(d)).max(0) as usize;
            f.data.resize(len, 0);
        }
        _ => f.is_bigendian = f.is_bigendian.wrapping_add(delta as u8),
    }
}

/// `data` filled with `src` repeated (left zero when `src` is empty).
fn fill(data: &mut [u8], src: &[u8]) {
    if src.is_empty() {
        return;
    }
    for (d, s) in data.iter_mut().zip(src.iter().cycle()) {
        *d = *s;
    }
}

/// Everything wrong with a header, by field, as the specification says (docs/SPEC.md:
/// `data` is exactly `step * height` bytes, `step * height * 3 / 2` for NV12/NV21; step
/// at least width * bytes per pixel; no zero size; even width for 4:2:2 and even size for
/// 4:2:0; at most 2^31 - 1 bytes). Empty: the frame is valid.
pub fn faults(f: &Frame) -> Vec<&'static str> {
    let Some((bpp, sub)) = spec(&f.encoding) else {
        return vec!["encoding"];
    };
    let (w, h, step) = (u128::from(f.width), u128::from(f.height), u128::from(f.step));
    let mut out = Vec::new();
    if w == 0 {
        out.push("width");
    }
    if h == 0 {
        out.push("height");
    }
    if sub != Subsampling::Full && w % 2 == 1 {
        out.push("width");
    }
    if sub == Subsampling::Yuv420 && h % 2 == 1 {
        out.push("height");
    }
    if step < w * u128::from(bpp) {
        out.push("step");
    }
    let bytes = if sub == Subsampling::Yuv420 { step * h * 3 / 2 } else { step * h };
    if bytes > MAX_IMAGE_BYTES {
        out.extend(["step", "height", "width"]);
    }
    if f.data.len() as u128 != bytes {
        out.push("data");
    }
    out
}

/// The field an `ImageError` names, checked against its message.
fn field_of(e: &ImageError) -> &'static str {
    let field = match e {
        ImageError::UnknownEncoding(_) => "encoding",
        ImageError::ZeroSize { width: 0, .. } => "width",
        ImageError::ZeroSize { .. } => "height",
        ImageError::Overflow { .. } | ImageError::StepTooSmall { .. } => "step",
        ImageError::DataSize { .. } => "data",
        ImageError::OddWidth { .. } => "width",
        ImageError::OddSize { width, .. } if width % 2 == 1 => "width",
        ImageError::OddSize { .. } => "height",
        ImageError::RoiOutside { .. } => "roi",
    };
    let message = e.to_string();
    assert!(message.contains(field), "rejection does not name `{field}`: {message}");
    field
}

/// Run one fuzz input (see the module docs); panics on a finding.
pub fn run(input: &[u8]) -> Outcome {
    let (config, simd, frame) = parse(input);
    let frame = match frame {
        Ok(f) => f,
        Err(outcome) => return outcome,
    };
    let found = faults(&frame);
    let view = ImageView::new(
        frame.width,
        frame.height,
        frame.step,
        &frame.encoding,
        frame.is_bigendian != 0,
        &frame.data,
    );
    let view = match view {
        Ok(v) => {
            assert!(
                found.is_empty(),
                "accepted an invalid frame ({found:?}): {}",
                describe(&frame)
            );
            v
        }
        Err(e) => {
            let field = field_of(&e);
            assert!(
                found.contains(&field),
                "rejected on `{field}` ({e}), but the faults are {found:?}: {}",
                describe(&frame)
            );
            return Outcome::Rejected { field, message: e.to_string() };
        }
    };
    process(&config, simd, &view)
}

fn describe(f: &Frame) -> String {
    format!(
        "width {} height {} step {} encoding {:?} is_bigendian {} data {} bytes",
        f.width,
        f.height,
        f.step,
        f.encoding,
        f.is_bigendian,
        f.data.len()
    )
}

/// The CPU pipeline on a valid view, with every check of the module docs.
fn process(config: &Config, simd: Simd, view: &ImageView<'_>) -> Outcome {
    let mut backend = CpuBackend::new();
    backend.set_simd(simd);
    let pipeline = Pipeline::new(config.clone(), Box::new(backend));
    let mut pipeline = match pipeline {
        Ok(p) => p,
        Err(e) => panic!("the harness built an invalid configuration: {e}"),
    };
    let roi_outside = !config.roi.is_empty() && {
        let r = &config.roi;
        r[0] + r[2] > i64::from(view.width()) || r[1] + r[3] > i64::from(view.height())
    };
    let info = match pipeline.process(view) {
        Ok(info) => info,
        Err(Error::Image(e @ ImageError::RoiOutside { .. })) if roi_outside => {
            let field = field_of(&e);
            return Outcome::Rejected { field, message: e.to_string() };
        }
        Err(e) => panic!("pipeline failed on a valid frame (roi {:?}): {e}", config.roi),
    };
    assert!(
        !roi_outside,
        "roi {:?} outside the {}x{} image was accepted",
        config.roi,
        view.width(),
        view.height()
    );
    let (c, h, w) =
        (config.output_channels, config.network_image_height, config.network_image_width);
    let shape = match config.output_layout {
        Layout::Nchw => [1, c, h, w],
        Layout::Nhwc => [1, h, w, c],
    };
    assert_eq!(info.desc.shape(), shape, "tensor shape");
    let bytes = pipeline.tensor_bytes().to_vec();
    assert_eq!(bytes.len(), info.desc.byte_len(), "tensor byte length");
    let values = read_elements(config.output_dtype, &bytes);
    let bounded = matches!(
        config.conv.kernel,
        ConvKernel::None | ConvKernel::Box | ConvKernel::Gaussian | ConvKernel::Custom
    );
    for (i, v) in values.iter().enumerate() {
        assert!(v.is_finite(), "element {i} is {v}");
        // Pixels and padding are in 0..=255 source units, scaled by 1/255 with mean 0 and
        // std 1; box, gaussian and the custom kernel (weights >= 0, sum 1) keep the range.
        assert!(!bounded || (-1e-3..=1.0 + 1e-3).contains(v), "element {i} is {v}, outside [0, 1]");
    }
    if config.conv.kernel == ConvKernel::None {
        let reference = reference_tensor(config, view);
        if let Some(i) = (0..bytes.len()).find(|&i| bytes[i] != reference[i]) {
            panic!("byte {i} differs from the reference: {} vs {}", bytes[i], reference[i]);
        }
    }
    // The cached operation of the second frame of the same size gives the same bytes.
    if let Err(e) = pipeline.process(view) {
        panic!("second run of the same frame failed: {e}");
    }
    assert!(pipeline.tensor_bytes() == &bytes[..], "second run of the same frame differs");
    Outcome::Processed { shape }
}

/// The tensor of `backend::cpu::reference`, one element at a time.
fn reference_tensor(config: &Config, view: &ImageView<'_>) -> Vec<u8> {
    let g = match Geometry::resolve(config, view.width(), view.height()) {
        Ok(g) => g,
        Err(e) => panic!("geometry of a processed frame: {e}"),
    };
    let mut op = preprocess_op(config, &g);
    op.params.src_step = view.step();
    op.params.encoding = view.encoding() as u32;
    op.params.big_endian = u32::from(view.big_endian());
    let mut out = Vec::new();
    if let Err(e) = reference::preprocess(view, &op, &mut out) {
        panic!("reference rejected the operation: {e}");
    }
    out
}

// ---------------------------------------------------------------------------------
// Building inputs (the seed corpus and the regression tests).
// ---------------------------------------------------------------------------------

/// The settings bytes of an input (see the module docs): byte [0] bits 2-7 (`flags`),
/// network size, geometry/roi/conv byte, pad value, conv border, and the roi bytes (written
/// only when `geo` asks for a roi).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Byte [0] bits 2-7: AVX2, one channel, NHWC, float16, nearest, bgr.
    pub flags: u8,
    /// Network width - 1 (mod 24).
    pub net_w: u8,
    /// Network height - 1 (mod 24).
    pub net_h: u8,
    /// Resize mode, anchor, roi kind, conv kernel.
    pub geo: u8,
    /// Pad value.
    pub pad: u8,
    /// Conv border.
    pub border: u8,
    /// x, y, w - 1, h - 1.
    pub roi: [u8; 4],
}

impl Default for Settings {
    /// Network 16x12, letterbox centred, linear, NCHW, float32, rgb, no roi, no conv.
    fn default() -> Self {
        Settings { flags: 0, net_w: 15, net_h: 11, geo: 1, pad: 0, border: 0, roi: [0; 4] }
    }
}

/// Bytes up to the mode-specific part: settings, encoding selector (an index into
/// [`ENCODINGS`], or the string itself when it is not there), is_bigendian, roi.
fn head(mode: u8, s: &Settings, encoding: &str, is_bigendian: u8) -> Vec<u8> {
    let mut v = vec![(s.flags & !3) | (mode & 3), s.net_w, s.net_h, s.geo];
    let own = match ENCODINGS.iter().position(|e| *e == encoding) {
        Some(i) => {
            v.push(i as u8);
            None
        }
        None => {
            let bytes = &encoding.as_bytes()[..encoding.len().min(31)];
            v.push(0xC0 | bytes.len() as u8);
            Some(bytes)
        }
    };
    v.extend([is_bigendian, s.pad, s.border]);
    v.extend(own.unwrap_or_default());
    if matches!((s.geo >> 3) & 3, 1 | 2) {
        v.extend(s.roi);
    }
    v
}

/// A raw-header input: exactly these fields and this data.
pub fn raw(
    s: &Settings,
    (width, height, step): (u32, u32, u32),
    encoding: &str,
    is_bigendian: u8,
    data: &[u8],
) -> Vec<u8> {
    let mut v = head(0, s, encoding, is_bigendian);
    for x in [width, height, step] {
        v.extend(x.to_le_bytes());
    }
    v.extend(data);
    v
}

/// A consistent-header input: width 1 + `w` % 40, height 1 + `h` % 40 (even where the
/// encoding needs it), `pad` extra bytes per row, data `pixels` repeated to the size.
pub fn consistent(
    s: &Settings,
    (w, h, pad): (u8, u8, u8),
    encoding: &str,
    is_bigendian: u8,
    pixels: &[u8],
) -> Vec<u8> {
    let mut v = head(1, s, encoding, is_bigendian);
    v.extend([w, h, pad]);
    v.extend(pixels);
    v
}

/// A consistent-header input with one field off (mode 2): `field` 0 width, 1 height,
/// 2 step, 3 data length, 4 is_bigendian, changed by `delta`.
pub fn off(
    s: &Settings,
    (w, h, pad): (u8, u8, u8),
    encoding: &str,
    is_bigendian: u8,
    (field, delta): (u8, i32),
    pixels: &[u8],
) -> Vec<u8> {
    let mut v = head(2, s, encoding, is_bigendian);
    v.extend([w, h, pad, field]);
    v.extend(delta.to_le_bytes());
    v.extend(pixels);
    v
}

/// A CDR-message input (`wire::msgs::Image::encode` bytes, or a damaged copy).
pub fn cdr(s: &Settings, message: &[u8]) -> Vec<u8> {
    let mut v = head(3, s, "rgb8", 0);
    v.extend(message);
    v
}
