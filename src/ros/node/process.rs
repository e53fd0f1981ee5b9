//! The processing and publishing threads, the same for one camera and for N. The
//! processing thread owns the pipeline (and so the backend and its streams): it takes the
//! newest formed set, runs it (`Pipeline::process_frames`: a `Tensor` for one input, a
//! `TensorBatch` for 2+, serialized in place) and hands the message to the publishing
//! thread, which publishes it with the scaled camera_info of each item, one
//! `FrameTiming` and, when someone watches, `debug_image`, while the processing thread
//! computes the next set into a second message buffer. The hand-over waits until the
//! publishing thread is free, so at most one set is being published and one processed;
//! sets formed meanwhile replace each other in the keep-latest slot (counted as dropped).

use super::clock::{self, Throttle};
use super::native::ros_header;
use super::shared::{lock, Outputs, RateLimitedLog, Received, Shared};
use crate::backend::StageTimes;
use crate::pipeline::{
    frame_timing, set_header, slot_reason, FrameInput, Geometry, GpuFailure, OwnedMessage, Pipeline,
};
use crate::transport::batch_sync::Item;
use crate::wire::msgs::Header;
use r2r::sensor_msgs::msg::{CameraInfo, Image, RegionOfInterest};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::{Duration, Instant};

/// One input of a formed set as the processing thread sees it.
struct Slot<'a> {
    frame: Option<&'a Received>,
    repeated: bool,
    header: Header,
}

/// What the publishing thread needs of one item of a processed set.
struct ReadySlot {
    header: Header,
    /// When its frame arrived (`None`: padded because stale).
    arrived: Option<Instant>,
    repeated: bool,
}

/// A processed set handed to the publishing thread.
struct Ready {
    message: OwnedMessage,
    slots: Vec<ReadySlot>,
    geometries: Vec<Option<Geometry>>,
    header: Header,
    times: StageTimes,
    backend: &'static str,
    formed_at: Instant,
    /// Its valid frames not in an earlier set (counted failed if publishing fails).
    new_valid: u64,
}

/// Run the node's processing (this thread) and publishing (a second thread) until the
/// node stops.
pub fn process_loop(pipeline: Pipeline, shared: &Shared, out: Outputs) {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Ready>(0);
    std::thread::scope(|scope| {
        let publisher = std::thread::Builder::new()
            .name("publish".into())
            .spawn_scoped(scope, move || publish_loop(&rx, shared, &out));
        match publisher {
            Ok(_) => process(pipeline, shared, &tx),
            Err(e) => shared.exit_fatal(format!("starting the publishing thread: {e}"), 0),
        }
        drop(tx); // the publishing thread publishes what it has, then ends
    });
}

/// A frame refused (`what`: why, after the kind of refusal `kind` in the log line):
/// logged (rate limited), counted for the node and its camera. The camera's topic is
/// named with 2+ inputs.
fn reject(
    shared: &Shared,
    log: &mut RateLimitedLog,
    topics: &[String],
    slot: usize,
    what: (&str, &str),
) {
    let (kind, why) = what;
    let reason = slot_reason(topics, slot, why);
    log.error(&shared.logger, &format!("frame rejected: {kind}{reason}"));
    shared.stats.rejected(reason);
    lock(&shared.cameras)[slot].rejected += 1;
}

fn process(mut pipeline: Pipeline, shared: &Shared, tx: &SyncSender<Ready>) {
    let logger = shared.logger.as_str();
    let mut generation = 0u64;
    let mut reject_log = RateLimitedLog::new(&shared.clock);
    let topics: Vec<String> = lock(&shared.cameras).iter().map(|c| c.topic.clone()).collect();
    while let Some(formed) = shared.sets.take() {
        // Parameters set at run time apply from this set (validated when set).
        {
            let p = lock(&shared.params);
            if p.generation != generation {
                generation = p.generation;
                if let Err(e) = pipeline.set_config(p.config.clone()) {
                    r2r::log_error!(logger, "new parameters not applied: {e}");
                }
            }
        }
        let slots: Vec<Slot<'_>> = formed
            .batch
            .items
            .iter()
            .map(|item| match item {
                Item::Frame { frame, repeated } => Slot {
                    frame: Some(frame.data.as_ref()),
                    repeated: *repeated,
                    header: frame.data.msg.header(),
                },
                Item::Stale => Slot { frame: None, repeated: false, header: Header::default() },
            })
            .collect();
        // Views of the frames; an invalid frame is rejected (a batch slot is padded).
        let mut views = Vec::with_capacity(slots.len());
        for (i, s) in slots.iter().enumerate() {
            views.push(match s.frame.map(|f| f.msg.view()) {
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => {
                    if !s.repeated {
                        let why = e.to_string();
                        reject(shared, &mut reject_log, &topics, i, ("invalid image: ", &why));
                    }
                    None
                }
                None => None,
            });
        }
        let valid: Vec<bool> = views.iter().map(Option::is_some).collect();
        if topics.len() < 2 && !valid[0] {
            continue; // a single camera's invalid frame: nothing to publish
        }
        let inputs: Vec<FrameInput<'_, '_>> = slots
            .iter()
            .zip(&views)
            .enumerate()
            .map(|(i, (s, v))| FrameInput {
                topic: &topics[i],
                image: v.as_ref(),
                header: &s.header,
                source_encoding: s.frame.map_or("", |f| f.msg.encoding()),
                repeated: s.repeated,
            })
            .collect();
        let header = set_header(&inputs);
        let new_valid = slots.iter().zip(&valid).filter(|(s, &v)| v && !s.repeated).count() as u64;
        let info = match pipeline.process_frames(&inputs, &header) {
            Ok(info) => info,
            Err(crate::Error::Image(e)) => {
                // A single camera's frame that the configuration refuses (its roi).
                let why = e.to_string();
                reject(shared, &mut reject_log, &topics, 0, ("invalid image: ", &why));
                continue;
            }
            Err(e @ crate::Error::GpuFailure { .. }) => {
                shared.exit_fatal(e.to_string(), new_valid);
                break;
            }
            Err(e) => {
                reject_log.error(logger, &format!("frame failed: {e}"));
                for _ in 0..new_valid {
                    shared.stats.failed(e.to_string());
                }
                continue;
            }
        };
        for (i, reason) in &info.rejected {
            if !slots[*i].repeated {
                reject(shared, &mut reject_log, &topics, *i, ("", reason));
            }
        }
        if let Some(failure) = &info.gpu_failure {
            note_gpu_failure(&pipeline, failure, shared);
        }
        let ready = Ready {
            message: pipeline.take_message(),
            slots: slots
                .iter()
                .map(|s| ReadySlot {
                    header: s.header.clone(),
                    arrived: s.frame.map(|f| f.at),
                    repeated: s.repeated,
                })
                .collect(),
            geometries: info.geometries,
            header,
            times: info.times,
            backend: pipeline.backend().name(),
            formed_at: formed.at,
            new_valid,
        };
        if tx.send(ready).is_err() {
            break; // the publishing thread is gone (it panicked): nothing can go out
        }
    }
}

/// The publishing thread: each processed set's message (with a batch's ages at publish
/// time), camera_info per item, `FrameTiming` and `debug_image`.
fn publish_loop(rx: &Receiver<Ready>, shared: &Shared, out: &Outputs) {
    let logger = shared.logger.as_str();
    let mut sequence = 0u64;
    let mut dropped_reported = 0u64;
    let mut error_log = RateLimitedLog::new(&shared.clock);
    let mut debug_throttle = Throttle::new(Duration::ZERO);
    for mut ready in rx {
        let _range = crate::nvtx::stage(crate::nvtx::Stage::Publish);
        let now = shared.clock.now();
        let ages: Vec<f32> =
            ready.slots.iter().map(|s| clock::age_us(now, &ros_header(&s.header).stamp)).collect();
        if let Err(e) = ready.message.set_ages(&ages) {
            r2r::log_warn!(logger, "TensorBatch ages: {e}");
        }
        let published = out.tensor.publish_raw(ready.message.bytes());
        if let Err(e) = published {
            error_log.error(logger, &format!("publishing tensor: {e}"));
            for _ in 0..ready.new_valid {
                shared.stats.failed(format!("publishing tensor: {e}"));
            }
            continue;
        }
        shared.sets_published.fetch_add(1, Ordering::Relaxed);
        for (i, g) in ready.geometries.iter().enumerate() {
            let (Some(g), Some(publisher)) = (g, out.camera_info.get(i)) else {
                continue;
            };
            if let Some(info_msg) = lock(&shared.camera_infos[i]).as_ref() {
                let scaled = scaled_camera_info(info_msg, g, &ros_header(&ready.slots[i].header));
                if let Err(e) = publisher.publish(&scaled) {
                    r2r::log_warn!(logger, "publishing camera_info of input {i}: {e}");
                }
            }
        }
        let mut oldest_age = 0.0f32;
        {
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
        }
        let dropped = shared.stats.dropped.load(Ordering::Relaxed);
        let timing = frame_timing(
            &ready.header,
            sequence,
            ready.backend,
            &ready.times,
            ready.formed_at.elapsed().as_secs_f32() * 1e6,
            oldest_age,
            u32::try_from(dropped.saturating_sub(dropped_reported)).unwrap_or(u32::MAX),
        );
        dropped_reported = dropped;
        if let Err(e) = out.timing.publish_raw(&timing.encode()) {
            r2r::log_warn!(logger, "publishing timing: {e}");
        }
        sequence += 1;
        // After the timing, so that total_us does not count it (it is made only while
        // someone watches).
        let stamp = ros_header(&ready.header);
        publish_debug_image(&ready.message, &stamp, &out.debug_image, &mut debug_throttle, shared);
        // The message's buffer goes back to the pipeline when `ready` is dropped here.
    }
}

/// A GPU failure the pipeline recovered from: logged, counted, and the backend as it is
/// now shown in diagnostics.
fn note_gpu_failure(pipeline: &Pipeline, failure: &GpuFailure, shared: &Shared) {
    let logger = shared.logger.as_str();
    r2r::log_error!(logger, "GPU failure: {}", failure.reason);
    r2r::log_warn!(logger, "{failure}");
    if failure.unreturned_messages > 0 {
        r2r::log_warn!(
            logger,
            "{} message(s) of the failed backend were still being published when it was \
             replaced (after waiting {} s)",
            failure.unreturned_messages,
            crate::pipeline::OUTSTANDING_WAIT.as_secs()
        );
    }
    shared.stats.gpu_failures.fetch_add(1, Ordering::Relaxed);
    let backend = pipeline.backend();
    let mut b = lock(&shared.backend);
    b.name = backend.name().to_string();
    b.device = backend.device_description();
    b.details = backend.diagnostics();
    b.gpu_failure = Some((failure.reason.clone(), failure.to_string()));
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
