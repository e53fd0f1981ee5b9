//! One frame from a GStreamer pipeline ([`Frame`]): a sample's negotiated format mapped to
//! our [`Encoding`] ([`ACCEPTED`]), its plane layout to one step (borrowed in place or
//! copied once: `layout.rs`), its bytes owned (the mapped buffer, kept alive until the frame
//! is dropped) and lent as an [`ImageView`], and its capture time ([`CaptureTime`]: the PTS
//! as a time of the pipeline's clock, [`ClockKind`]).

use std::sync::Arc;

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_video as gst_video;

use super::cuda::{cuda_planes, is_cuda_memory, map_device, DeviceMapping, CUDA_MEMORY_FEATURE};
use super::layout::{self, Plan, Planes};
use super::lend::lend;
use super::time::{CaptureTime, ClockKind};
use super::{accepted_list, ACCEPTED};
use crate::error::CaptureError;
use crate::image::{DeviceMemory, DeviceView, Encoding, ImageView, Lent, LentReads};

/// Where a frame's bytes are: the mapped `GstBuffer` (kept mapped and alive until the
/// frame is dropped), one tight copy of it, or a buffer of CUDA memory mapped for the
/// device (kept mapped likewise; no host bytes at all).
enum Bytes {
    Mapped {
        buffer: gst::MappedBuffer<gst::buffer::Readable>,
        start: usize,
        len: usize,
    },
    Copied(Vec<u8>),
    /// Kept for its drop (unmapping the buffer), never read.
    Device {
        _mapping: DeviceMapping,
    },
}

/// One frame from a [`CaptureSource`]: it owns its bytes (a mapped GStreamer buffer, or one
/// copy of it) and lends them as an [`ImageView`].
///
/// [`CaptureSource`]: super::CaptureSource
pub struct Frame {
    bytes: Bytes,
    width: u32,
    height: u32,
    step: u32,
    encoding: Encoding,
    big_endian: bool,
    capture_time: Option<CaptureTime>,
    /// The buffer's PTS, ns (a video input's: its packet's stamp).
    pts_ns: Option<u64>,
    sequence: u64,
    /// The mapped buffer's memory, lent to the backend ([`lend`]).
    lent: Option<Lent>,
    /// The device memory of a frame in CUDA memory, lent to the backend likewise.
    device: Option<DeviceMemory>,
}

impl Frame {
    /// A frame over `bytes` (system or device memory), unchecked: nothing lent, no PTS.
    fn unchecked(
        bytes: Bytes,
        (width, height, step): (u32, u32, u32),
        (encoding, big_endian): (Encoding, bool),
        capture_time: Option<CaptureTime>,
        sequence: u64,
    ) -> Frame {
        Frame {
            bytes,
            width,
            height,
            step,
            encoding,
            big_endian,
            capture_time,
            pts_ns: None,
            sequence,
            lent: None,
            device: None,
        }
    }

    /// A frame over `bytes`, checked once here as an [`ImageView`] (so `view` is).
    fn new(
        bytes: Bytes,
        geometry: (u32, u32, u32),
        format: (Encoding, bool),
        capture_time: Option<CaptureTime>,
        sequence: u64,
    ) -> std::result::Result<Frame, CaptureError> {
        let frame = Frame::unchecked(bytes, geometry, format, capture_time, sequence);
        let f = &frame;
        ImageView::with_encoding(f.width, f.height, f.step, f.encoding, f.big_endian, f.data())
            .map_err(|e| CaptureError::Frame { message: e.to_string() })?;
        Ok(frame)
    }

    /// A sample as a frame: its format mapped to our encoding, its layout to one step, its
    /// memory lent where it can be ([`lend`]); number `sequence` of its source.
    pub(super) fn from_sample(
        sample: &gst::Sample,
        capture_time: Option<CaptureTime>,
        sequence: u64,
        reads: &Arc<LentReads>,
    ) -> std::result::Result<Frame, CaptureError> {
        let bad = |message: String| CaptureError::Frame { message };
        let caps = sample.caps().ok_or_else(|| bad("a sample without caps".into()))?;
        let s = caps.structure(0).ok_or_else(|| bad("empty caps".into()))?;
        let format = s.get::<&str>("format").unwrap_or("");
        let &(_, _, encoding, big_endian) = ACCEPTED
            .iter()
            .find(|a| a.0 == s.name().as_str() && a.1 == format)
            .ok_or_else(|| bad(format!("caps {caps} are none of ours ({})", accepted_list())))?;
        let buffer =
            sample.buffer_owned().ok_or_else(|| bad("a sample without a buffer".into()))?;
        let pts_ns = buffer.pts().map(|t| t.nseconds());
        if caps.features(0).is_some_and(|f| f.contains(CUDA_MEMORY_FEATURE)) {
            let time_seq = (capture_time, sequence);
            return Frame::on_device(buffer, caps, (encoding, big_endian), time_seq, reads);
        }
        let (width, height, planes) = geometry(caps, &buffer).map_err(bad)?;
        if matches!(encoding, Encoding::Yuyv | Encoding::Uyvy) && !width.is_multiple_of(2) {
            return Err(bad(format!(
                "{format} at odd width {width}: 4:2:2 pixels come in pairs; set an even width in the description's caps (or `videoscale ! video/x-raw,width=<even>`)"
            )));
        }
        let mapped = buffer
            .into_mapped_buffer_readable()
            .map_err(|_| bad("the buffer cannot be mapped for reading".into()))?;
        let plan = layout::plan(encoding, width, height, &planes, mapped.size()).map_err(bad)?;
        let mut lent = None;
        let (bytes, step) = match plan {
            Plan::Borrow { start, len, step } => {
                lent = lend(&mapped, reads);
                (Bytes::Mapped { buffer: mapped, start, len }, step)
            }
            Plan::Copy { step } => (
                Bytes::Copied(layout::copy_tight(
                    encoding,
                    width,
                    height,
                    &planes,
                    mapped.as_slice(),
                )),
                step,
            ),
        };
        let step = u32::try_from(step).map_err(|_| bad(format!("row stride {step} over 4 GiB")))?;
        let frame = Frame::new(
            bytes,
            (width, height, step),
            (encoding, big_endian),
            capture_time,
            sequence,
        )?;
        Ok(Frame { lent, pts_ns, ..frame })
    }

    /// A sample in GStreamer's CUDA memory as a frame: one block of it, mapped for the
    /// device, its planes one step apart (NV12 as GStreamer's CUDA allocator lays it out),
    /// lent to the backend as [`DeviceMemory`]. Anything else is refused by name.
    fn on_device(
        buffer: gst::Buffer,
        caps: &gst::CapsRef,
        (encoding, big_endian): (Encoding, bool),
        (capture_time, sequence): (Option<CaptureTime>, u64),
        reads: &Arc<LentReads>,
    ) -> std::result::Result<Frame, CaptureError> {
        let bad = |message: String| CaptureError::Frame { message };
        let pts_ns = buffer.pts().map(|t| t.nseconds());
        if !is_cuda_memory(&buffer) {
            return Err(bad(format!(
                "caps {caps} say CUDA memory, but the buffer is not one block of GStreamer's \
                 CUDA memory"
            )));
        }
        let info =
            gst_video::VideoInfo::from_caps(caps).map_err(|e| bad(format!("caps {caps}: {e}")))?;
        let planes = match buffer.meta::<gst_video::VideoMeta>() {
            Some(meta) => Planes::new(meta.stride(), meta.offset()),
            None => {
                let (stride, offset) = cuda_planes(&buffer);
                Planes::new(&stride, &offset)
            }
        }
        .map_err(bad)?;
        let mapped = map_device(buffer).map_err(bad)?;
        let (width, height) = (info.width(), info.height());
        let Plan::Borrow { start, step, .. } =
            layout::plan(encoding, width, height, &planes, mapped.size()).map_err(bad)?
        else {
            return Err(bad(format!(
                "{caps}: the planes of this CUDA memory are not one row stride apart, which \
                 the kernels cannot read in place; end the description with `! cudadownload` \
                 (system memory)"
            )));
        };
        let step = u32::try_from(step).map_err(|_| bad(format!("row stride {step} over 4 GiB")))?;
        // SAFETY: the mapping (kept by the frame, unmapped when it is dropped) holds the
        // buffer and so its memory, `size - start` bytes from `ptr + start` in the context
        // `mapped.context`; the decoder finished writing it before pushing it (and
        // `map_device` waited for any work queued on its stream); nobody writes a buffer
        // mapped for reading.
        let memory = unsafe {
            DeviceMemory::new(
                mapped.ptr() + start as u64,
                mapped.size() - start,
                mapped.context,
                reads.clone(),
            )
        };
        DeviceView::new(width, height, step, encoding, &memory)
            .map_err(|e| CaptureError::Frame { message: e.to_string() })?;
        let bytes = Bytes::Device { _mapping: mapped };
        let frame = Frame::unchecked(
            bytes,
            (width, height, step),
            (encoding, big_endian),
            capture_time,
            sequence,
        );
        Ok(Frame { pts_ns, device: Some(memory), ..frame })
    }

    fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped { buffer, start, len } => &buffer.as_slice()[*start..*start + *len],
            Bytes::Copied(v) => v,
            Bytes::Device { .. } => &[],
        }
    }

    /// The frame as an image (borrowed from the frame: no copy), with the buffer's memory
    /// lent when it can be: one block of GStreamer's system memory ([`ImageView::lent`]).
    /// `None` for a frame in CUDA memory ([`Frame::device`]): it has no host bytes.
    pub fn view(&self) -> Option<ImageView<'_>> {
        if self.device.is_some() {
            return None;
        }
        // The header and these same bytes were validated in `Frame::new`; the bytes are
        // owned and never change.
        let view = ImageView::validated(
            self.width,
            self.height,
            self.step,
            self.encoding,
            self.big_endian,
            self.data(),
        );
        Some(match &self.lent {
            Some(lent) => view.lent_from(lent),
            None => view,
        })
    }

    /// The frame in CUDA memory as an image on the device (read in place by the CUDA
    /// backend's kernels); `None` for a frame in system memory ([`Frame::view`]).
    pub fn device(&self) -> Option<DeviceView<'_>> {
        let memory = self.device.as_ref()?;
        // Checked in `Frame::on_device` with these same parts.
        DeviceView::new(self.width, self.height, self.step, self.encoding, memory).ok()
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }
    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }
    /// The pixels' encoding.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// Whether its bytes lie in a GStreamer buffer's memory lent to the backend, which a
    /// GPU backend may then read in place: one block of GStreamer's system memory.
    pub fn is_lent(&self) -> bool {
        self.lent.is_some()
    }

    /// The buffer's capture time, when it has a PTS and the pipeline a clock.
    pub fn capture_time(&self) -> Option<&CaptureTime> {
        self.capture_time.as_ref()
    }
    /// The buffer's PTS in ns (a video input's frame: the stamp of the packet that carried
    /// it), as the stream gave it.
    pub fn pts_ns(&self) -> Option<u64> {
        self.pts_ns
    }
    /// This frame's number among the frames its source delivered (0, 1, ...).
    pub fn sequence(&self) -> u64 {
        self.sequence
    }
    /// True when the buffer's layout differed from an `ImageView`'s and the frame is one
    /// copy of it in tight rows; false when the view reads the mapped buffer in place.
    pub fn copied(&self) -> bool {
        matches!(self.bytes, Bytes::Copied(_))
    }
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("step", &self.step)
            .field("encoding", &self.encoding)
            .field("big_endian", &self.big_endian)
            .field("capture_time", &self.capture_time)
            .field("sequence", &self.sequence)
            .field("copied", &self.copied())
            .field("on_device", &self.device.is_some())
            .finish()
    }
}

/// A buffer's size and planes: for `video/x-raw`, from its `GstVideoMeta` (where its
/// source wrote one) or else the caps' default layout; for Bayer (no `GstVideoInfo`), the
/// caps' size and the buffer's.
fn geometry(caps: &gst::CapsRef, buffer: &gst::Buffer) -> Result<(u32, u32, Planes), String> {
    let s = caps.structure(0).ok_or_else(|| "empty caps".to_string())?;
    if s.name() == "video/x-raw" {
        let info =
            gst_video::VideoInfo::from_caps(caps).map_err(|e| format!("caps {caps}: {e}"))?;
        let planes = match buffer.meta::<gst_video::VideoMeta>() {
            Some(meta) => Planes::new(meta.stride(), meta.offset()),
            None => Planes::new(info.stride(), info.offset()),
        };
        Ok((info.width(), info.height(), planes?))
    } else {
        let width = s.get::<i32>("width").map_err(|e| format!("caps {caps}: {e}"))?;
        let height = s.get::<i32>("height").map_err(|e| format!("caps {caps}: {e}"))?;
        let (width, height) = (width.max(0) as u32, height.max(0) as u32);
        Ok((width, height, Planes::bayer(width, height, buffer.size())?))
    }
}

/// Which clock `clock` is.
pub(super) fn clock_kind(clock: &gst::Clock) -> ClockKind {
    if clock.is::<gst::SystemClock>() {
        match clock.property::<gst::ClockType>("clock-type") {
            gst::ClockType::Monotonic => return ClockKind::Monotonic,
            gst::ClockType::Realtime => return ClockKind::Realtime,
            gst::ClockType::Tai => return ClockKind::Tai,
            _ => {}
        }
    }
    ClockKind::Other(clock.type_().name().to_string())
}
