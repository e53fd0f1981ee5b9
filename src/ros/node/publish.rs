//! The publishing thread: publishes each set the processing thread hands over (its
//! `Tensor` or `TensorBatch` with the ages at publish time, and/or its `TensorRef`), the
//! scaled camera_info of each item, one `FrameTiming` and, when someone watches,
//! `debug_image`; then counts the set's frames published.

use super::clock::{self, Throttle};
use super::native::ros_header;
use super::shared::{lock, Outputs, RateLimitedLog, Shared};
use crate::backend::StageTimes;
use crate::pipeline::{frame_timing, Geometry, OwnedMessage};
use crate::wire::msgs::{FrameTiming, Header, OUTPUT_TENSOR, OUTPUT_TENSOR_REF};
use r2r::sensor_msgs::msg::{CameraInfo, Image, RegionOfInterest};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// What the publishing thread needs of one item of a processed set.
pub(super) struct ReadySlot {
    pub(super) header: Header,
    /// When its frame arrived (`None`: padded because stale).
    pub(super) arrived: Option<Instant>,
    pub(super) repeated: bool,
}

/// A processed set handed to the publishing thread.
pub(super) struct Ready {
    pub(super) message: OwnedMessage,
    pub(super) slots: Vec<ReadySlot>,
    pub(super) geometries: Vec<Option<Geometry>>,
    pub(super) header: Header,
    pub(super) times: StageTimes,
    pub(super) backend: &'static str,
    pub(super) formed_at: Instant,
    /// When its `TensorRef` went out, if before its work ended ([`crate::pipeline::Announce::send`]).
    pub(super) announced_at: Option<Instant>,
    /// Its valid frames not in an earlier set (counted failed if publishing fails).
    pub(super) new_valid: u64,
}

/// Each item's age now on the node's clock (`TensorBatch`'s and `TensorRef`'s items).
pub(super) fn ages<'h>(shared: &Shared, headers: impl Iterator<Item = &'h Header>) -> Vec<f32> {
    let now = shared.clock.now();
    headers.map(|h| clock::age_us(now, &ros_header(h).stamp)).collect()
}

/// The publishing thread: each processed set's message (with a batch's ages at publish
/// time), camera_info per item, `FrameTiming` and `debug_image`.
pub(super) fn publish_loop(rx: &Receiver<Ready>, shared: &Shared, out: &Outputs) {
    let logger = shared.logger.as_str();
    let mut sequence = 0u64;
    let mut dropped_reported = 0u64;
    let mut error_log = RateLimitedLog::new(&shared.clock);
    let mut debug_throttle = Throttle::new(Duration::ZERO);
    for mut ready in rx {
        let _range = crate::nvtx::stage(crate::nvtx::Stage::Publish);
        let ages = ages(shared, ready.slots.iter().map(|s| &s.header));
        if let Err(e) = ready.message.set_ages(&ages) {
            r2r::log_warn!(logger, "TensorBatch ages: {e}");
        }
        let outputs = publish_tensor(&ready, &ages, out, (&mut error_log, logger));
        if outputs == 0 {
            for _ in 0..ready.new_valid {
                shared.stats.failed("publishing tensor and tensor_ref failed".into());
            }
            continue;
        }
        shared.sets_published.fetch_add(1, Ordering::Relaxed);
        greenwave(&ready, outputs, shared);
        publish_camera_infos(&ready, shared, out);
        let oldest_age = count_published(&ready, &ages, shared);
        let dropped = shared.stats.dropped.load(Ordering::Relaxed);
        // Until its outputs went out: the `TensorRef` alone when it was announced and
        // no `tensor` was published.
        let handed_over = match ready.announced_at {
            Some(at) if outputs & OUTPUT_TENSOR == 0 => at,
            _ => Instant::now(),
        };
        let timing = frame_timing(
            &ready.header,
            sequence,
            ready.backend,
            &ready.times,
            handed_over.saturating_duration_since(ready.formed_at).as_secs_f32() * 1e6,
            oldest_age,
            u32::try_from(dropped.saturating_sub(dropped_reported)).unwrap_or(u32::MAX),
        );
        let timing = FrameTiming { outputs, ..timing };
        dropped_reported = dropped;
        if let Err(e) = out.timing.publish_raw(&timing.encode()) {
            r2r::log_warn!(logger, "publishing timing: {e}");
        }
        sequence += 1;
        // After the timing, so that total_us does not count it (it is made only while
        // someone watches).
        let stamp = ros_header(&ready.header);
        publish_debug_image(&ready.message, &stamp, &out.debug_image, &mut debug_throttle, shared);
        // Its descriptor is out: the block is reusable once no consumer holds it.
        if let (Some(block), true) = (ready.message.take_block(), outputs & OUTPUT_TENSOR_REF != 0)
        {
            block.published();
        }
        // The message's buffer goes back to the pipeline when `ready` is dropped here.
    }
}

/// The outputs' publication in the greenwave statuses (a `TensorRef` announced before
/// its set's work ended, at its announcement).
fn greenwave(ready: &Ready, outputs: u8, shared: &Shared) {
    let h = &ready.header;
    let stamp = Duration::new(u64::try_from(h.sec).unwrap_or(0), h.nanosec);
    let now = shared.clock.now();
    if outputs & OUTPUT_TENSOR != 0 {
        shared.greenwave.published(0, stamp, now);
    }
    if outputs & OUTPUT_TENSOR_REF != 0 {
        let ago = ready.announced_at.map_or(Duration::ZERO, |at| at.elapsed());
        shared.greenwave.published(1, stamp, now.map(|n| n.saturating_sub(ago)));
    }
}

/// The set's descriptor first (small: consumers of the shared block get it sooner),
/// unless it went out already, before the set's GPU work ended; then its tensor. The
/// outputs that went out (`FrameTiming::outputs`).
fn publish_tensor(
    ready: &Ready,
    ages: &[f32],
    out: &Outputs,
    (error_log, logger): (&mut RateLimitedLog, &str),
) -> u8 {
    let mut outputs = if ready.message.announced() { OUTPUT_TENSOR_REF } else { 0 };
    if let Some(cdr) = ready.message.tensor_ref(ages) {
        match out.tensor_ref.publish_raw(&cdr) {
            Ok(()) => {
                ready.message.signal(&cdr);
                outputs |= OUTPUT_TENSOR_REF;
            }
            Err(e) => error_log.error(logger, &format!("publishing tensor_ref: {e}")),
        }
    }
    if ready.message.has_bytes() {
        match out.tensor.publish_raw(ready.message.bytes()) {
            Ok(()) => outputs |= OUTPUT_TENSOR,
            Err(e) => error_log.error(logger, &format!("publishing tensor: {e}")),
        }
    }
    outputs
}

/// Each processed item's camera_info (the newest of its input), scaled to the network
/// input.
fn publish_camera_infos(ready: &Ready, shared: &Shared, out: &Outputs) {
    for (i, g) in ready.geometries.iter().enumerate() {
        let (Some(g), Some(publisher)) = (g, out.camera_info.get(i)) else {
            continue;
        };
        if let Some(info_msg) = lock(&shared.camera_infos[i]).as_ref() {
            let scaled = scaled_camera_info(info_msg, g, &ros_header(&ready.slots[i].header));
            if let Err(e) = publisher.publish(&scaled) {
                r2r::log_warn!(shared.logger.as_str(), "publishing camera_info of input {i}: {e}");
            }
        }
    }
}

/// Count the set's new frames published (with their latency) per camera; returns the
/// oldest processed item's age.
fn count_published(ready: &Ready, ages: &[f32], shared: &Shared) -> f32 {
    let mut oldest_age = 0.0f32;
    let mut cams = lock(&shared.cameras);
    for (i, (s, g)) in ready.slots.iter().zip(&ready.geometries).enumerate() {
        let (Some(arrived), Some(_)) = (s.arrived, g) else {
            continue;
        };
        oldest_age = oldest_age.max(ages[i]);
        if !s.repeated {
            shared.stats.published(arrived.elapsed().as_secs_f32() * 1e3);
            cams[i].published += 1;
        }
    }
    oldest_age
}

/// `debug_image`: what the network sees, de-normalized to rgb8 (grey tensors as mono8; a
/// batch's items stacked top to bottom), computed only while someone subscribes and at
/// most `debug_image_rate` times a second of the node's clock.
fn publish_debug_image(
    message: &OwnedMessage,
    header: &r2r::std_msgs::msg::Header,
    publisher: &r2r::Publisher<Image>,
    throttle: &mut Throttle,
    shared: &Shared,
) {
    let logger = shared.logger.as_str();
    let rate = lock(&shared.params).config.debug_image_rate;
    if rate <= 0.0 || publisher.get_inter_process_subscription_count().unwrap_or(0) == 0 {
        return;
    }
    throttle.set_period(Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::MAX));
    if !throttle.ready(shared.clock.now()) {
        return;
    }
    let preview = match message.preview() {
        Ok(p) => p,
        Err(e) => {
            r2r::log_warn!(logger, "debug_image: {e}");
            return;
        }
    };
    let msg = Image {
        header: header.clone(),
        height: preview.height,
        width: preview.width,
        encoding: if preview.channels == 3 { "rgb8" } else { "mono8" }.to_string(),
        is_bigendian: 0,
        step: preview.width * preview.channels,
        data: preview.data,
    };
    if let Err(e) = publisher.publish(&msg) {
        r2r::log_warn!(logger, "publishing debug_image: {e}");
    }
}

/// The camera_info of the network image: the source's, scaled and offset exactly like
/// the image (see [`Geometry::scale_intrinsics`]), stamped like the tensor.
fn scaled_camera_info(
    src: &CameraInfo,
    g: &Geometry,
    image: &r2r::std_msgs::msg::Header,
) -> CameraInfo {
    let mut out = src.clone();
    out.header = image.clone();
    if !src.header.frame_id.is_empty() {
        out.header.frame_id = src.header.frame_id.clone();
    }
    out.width = g.network_width;
    out.height = g.network_height;
    let mut k = [0.0; 9];
    let mut p = [0.0; 12];
    let kn = src.k.len().min(9);
    let pn = src.p.len().min(12);
    k[..kn].copy_from_slice(&src.k[..kn]);
    p[..pn].copy_from_slice(&src.p[..pn]);
    g.scale_intrinsics(&mut k, &mut p);
    out.k = k.to_vec();
    out.p = p.to_vec();
    // The network image is the whole output: no further binning or roi applies.
    out.binning_x = 0;
    out.binning_y = 0;
    out.roi = RegionOfInterest::default();
    out
}
