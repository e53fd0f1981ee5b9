//! The node's input, run on the spin thread: the `image` subscription (native messages,
//! read in place) and `camera_info`, drained right after each `spin_once` into the
//! keep-latest slot; with `input_qos: auto`, the subscriptions follow what the
//! publishers offer (`transport::adapt_to_offers`): made when the first publisher is
//! seen (as `ros2 bag record` subscribes to a topic once it has publishers), so that a
//! reliable camera's first frames already go to a reliable reader; recreated when the
//! answer changes.

use super::native::{NativeCompressed, NativeImage, RosArgs};
use super::shared::{lock, Pixels, RateLimitedLog, Received, Shared};
use super::video::{self, VideoMsg};
use crate::capture::VideoFeed;
use crate::config::{QosPreset, Transport};
use crate::ros::participant::{Deliver, OwnParticipant};
use crate::transport::{
    adapt_to_offers, Adapted, Durability, Offer, Reliability, NO_PUBLISHER_YET,
};
use futures::{FutureExt, Stream, StreamExt};
use r2r::ffmpeg_image_transport_msgs::msg::FFMPEGPacket;
use r2r::foxglove_msgs::msg::CompressedVideo;
use r2r::qos::{DurabilityPolicy, ReliabilityPolicy};
use r2r::sensor_msgs::msg::{CameraInfo, CompressedImage, Image};
use r2r::QosProfile;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often `input_qos: auto` looks at the publishers again.
pub(super) const QOS_CHECK_PERIOD: Duration = Duration::from_millis(250);
/// How often it looks while the image topic has had no publisher yet: at every spin (the
/// spin thread's wait is at most 20 ms), so that the node subscribes within a spin of
/// the camera's discovery, not up to [`QOS_CHECK_PERIOD`] later (the start-up figures in
/// docs/BENCHMARKS.md, *Start-up*). The query reads the middleware's graph cache in
/// this process: no message is sent.
const FIRST_PUBLISHER_CHECK_PERIOD: Duration = Duration::ZERO;

type Images = Box<dyn Stream<Item = Incoming> + Unpin>;

/// A message taken from an input's image subscription.
pub(super) enum Incoming {
    /// `sensor_msgs/Image` (transport `raw`).
    Raw(r2r::NativeMsg<Image>),
    /// `sensor_msgs/CompressedImage` (transport `compressed`).
    Compressed(r2r::NativeMsg<CompressedImage>),
    /// A video packet (transports `foxglove`, `ffmpeg`): to the input's video feed.
    Video(VideoMsg),
}
type CameraInfos = Box<dyn Stream<Item = CameraInfo> + Unpin>;

/// The r2r QoS of an input subscription: the preset, or for `auto` what `adapted` says
/// (best effort, which matches any publisher, without an answer).
pub(super) fn qos_profile(preset: QosPreset, depth: u32, adapted: Option<&Adapted>) -> QosProfile {
    let base = match (preset, adapted) {
        (QosPreset::Auto, Some(a)) => {
            let p = match a.reliability {
                Reliability::Reliable => QosProfile::default(),
                Reliability::BestEffort => QosProfile::sensor_data(),
            };
            match a.durability {
                Durability::TransientLocal => p.transient_local(),
                Durability::Volatile => p.volatile(),
            }
        }
        (QosPreset::Auto | QosPreset::SensorData, _) => QosProfile::sensor_data(),
        (QosPreset::Default, _) => QosProfile::default(),
        (QosPreset::SystemDefault, _) => QosProfile::system_default(),
    };
    base.keep_last(depth as usize)
}

/// What the publishers of `topic` offer (none when the graph cannot be read).
fn offers(node: &r2r::Node, topic: &str) -> Vec<Offer> {
    node.get_publishers_info_by_topic(topic, false)
        .map(|infos| {
            infos
                .iter()
                .map(|i| Offer {
                    reliability: if i.qos_profile.reliability == ReliabilityPolicy::Reliable {
                        Reliability::Reliable
                    } else {
                        Reliability::BestEffort
                    },
                    durability: if i.qos_profile.durability == DurabilityPolicy::TransientLocal {
                        Durability::TransientLocal
                    } else {
                        Durability::Volatile
                    },
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One input topic: its names and the QoS its subscription was made with.
struct Topic {
    relative: String,
    resolved: String,
    chosen: Option<Adapted>,
}

/// The input subscriptions, owned by the spin thread.
pub(super) struct Input {
    /// Index of this input in `Shared::inputs` (batch slot).
    index: usize,
    preset: QosPreset,
    depth: u32,
    /// `raw` or `compressed`: what `image` carries.
    transport: Transport,
    image: Topic,
    info: Topic,
    images: Option<Images>,
    infos: Option<CameraInfos>,
    /// With `input_participants: per_input`, the participant whose thread takes this
    /// input's images and delivers them itself (`images` stays `None`).
    own: Option<OwnParticipant>,
    next_check: Instant,
    /// The video feed of a video-capable transport (`foxglove`, `ffmpeg`, `compressed`),
    /// with its refusals' log.
    video: Option<(Arc<VideoFeed>, RateLimitedLog)>,
}

/// An image taken from input `index`'s subscription at `at`: counted by the input's
/// delivery monitor.
pub(super) fn arrived(shared: &Shared, index: usize, image: Pixels, at: Instant) -> Received {
    let bytes = match &image {
        Pixels::Message(m) => m.data().len(),
        Pixels::Compressed(m) => m.data().len(),
        Pixels::Captured(_) => 0,
    };
    let received = Received::new(image, at);
    let stamp_ns = received.stamp_ns;
    let mut input = lock(&shared.inputs[index]);
    input.monitor.image(at, stamp_ns, bytes);
    // Its age on the node's clock tells a live camera from a recording (not under sim
    // time, whose clock is the recording's).
    if let (false, Some(now)) = (shared.clock.sim_time(), shared.clock.now()) {
        input.monitor.image_age(at, now.as_secs_f64() - stamp_ns as f64 * 1e-9);
    }
    drop(input);
    received
}

impl Input {
    /// Subscribe to the image topic `image` (input `index`; `image` for a single
    /// camera; with `transport` compressed, `<image>/compressed`, as image_transport's
    /// subscribers do) and its `camera_info` ([`camera_info_topic`] of `image`); relative
    /// names: namespaces and remaps apply. `args` resolves the names for the graph queries of `auto`. With
    /// `own` (`input_participants: per_input`), the images come through the input's own
    /// DDS participant, whose thread hands each to `own` as it takes it.
    pub(super) fn new(
        node: &mut r2r::Node,
        args: Option<&RosArgs>,
        (index, image, transport): (usize, &str, Transport),
        (preset, depth): (QosPreset, u32),
        shared: &Shared,
        (own, video): (Option<Deliver>, Option<Arc<VideoFeed>>),
    ) -> Result<Input, String> {
        let (name, namespace) =
            (node.name().map_err(|e| e.to_string())?, node.namespace().map_err(|e| e.to_string())?);
        let resolve = |t: &str| {
            args.and_then(|a| a.resolve_topic(t, &name, &namespace)).unwrap_or_else(|| {
                if t.starts_with('/') {
                    t.to_string()
                } else {
                    format!("{}/{t}", namespace.trim_end_matches('/'))
                }
            })
        };
        let info = camera_info_topic(image);
        let image_topic = match transport {
            Transport::Raw => image.to_string(),
            t => format!("{}/{}", image.trim_end_matches('/'), t.name()),
        };
        let mut input = Input {
            index,
            preset,
            depth,
            transport,
            image: Topic { resolved: resolve(&image_topic), relative: image_topic, chosen: None },
            info: Topic { resolved: resolve(&info), relative: info, chosen: None },
            images: None,
            infos: None,
            own: None,
            next_check: Instant::now(),
            video: video.map(|f| (f, RateLimitedLog::new(&shared.clock))),
        };
        if let Some(deliver) = own {
            let own = OwnParticipant::start(
                (&name, &namespace, index),
                &input.image.resolved,
                &shared.logger,
                deliver,
            )?;
            r2r::log_info!(
                &shared.logger,
                "input {index} ({}): taken by its own DDS participant (hidden node {}/{})",
                input.image.resolved,
                namespace.trim_end_matches('/'),
                own.name()
            );
            input.own = Some(own);
        }
        input.subscribe_first(node, shared)?;
        input.adapt(node, shared).map_err(|e| e.to_string())?;
        Ok(input)
    }

    /// Say the input's topic and transport in its state, and subscribe with the preset's
    /// QoS; with `auto`, only once a publisher is seen (`adapt`).
    fn subscribe_first(&mut self, node: &mut r2r::Node, shared: &Shared) -> Result<(), String> {
        let mut st = lock(&shared.inputs[self.index]);
        st.topic = self.image.resolved.clone();
        st.transport = Some(self.transport);
        if self.preset == QosPreset::Auto {
            // Subscribed in `adapt` once a publisher is seen: a subscription made before
            // would be best effort (to match any publisher), and a reliable camera's
            // first frames, sent to it before the node could switch, would be lost.
            for topic in [&self.image.resolved, &self.info.resolved] {
                r2r::log_info!(&shared.logger, "input_qos auto: {topic}: {NO_PUBLISHER_YET}");
            }
            st.qos = format!("auto: {NO_PUBLISHER_YET}");
        } else {
            let qos = qos_profile(self.preset, self.depth, None);
            self.subscribe_images(node, qos.clone()).map_err(|e| e.to_string())?;
            self.infos = Some(Box::new(
                node.subscribe::<CameraInfo>(&self.info.relative, qos)
                    .map_err(|e| e.to_string())?,
            ));
            st.qos = format!("input_qos {}", preset_name(self.preset));
            st.best_effort = self.preset == QosPreset::SensorData;
        }
        Ok(())
    }

    /// (Re)subscribe to the images with `qos`: through the input's own participant, or
    /// the node's (r2r drops a replaced subscription at its next message).
    fn subscribe_images(&mut self, node: &mut r2r::Node, qos: QosProfile) -> r2r::Result<()> {
        match &self.own {
            Some(own) => own.subscribe(qos),
            None => {
                self.images = None;
                let topic = &self.image.relative;
                self.images = Some(match self.transport {
                    Transport::Raw => {
                        Box::new(node.subscribe_native::<Image>(topic, qos)?.map(Incoming::Raw))
                    }
                    Transport::Compressed => Box::new(
                        node.subscribe_native::<CompressedImage>(topic, qos)?
                            .map(Incoming::Compressed),
                    ),
                    Transport::Foxglove => Box::new(
                        node.subscribe::<CompressedVideo>(topic, qos)?
                            .map(|m| Incoming::Video(VideoMsg::Foxglove(m))),
                    ),
                    Transport::Ffmpeg => Box::new(
                        node.subscribe::<FFMPEGPacket>(topic, qos)?
                            .map(|m| Incoming::Video(VideoMsg::Ffmpeg(m))),
                    ),
                });
            }
        }
        Ok(())
    }

    /// Its batch slot.
    pub(super) fn index(&self) -> usize {
        self.index
    }

    /// The resolved image topic.
    pub(super) fn topic(&self) -> &str {
        &self.image.resolved
    }

    /// Hand over what the last `spin_once` delivered: the images (oldest first) to the
    /// caller, the newest camera_info to the processing thread; both to the delivery
    /// monitor.
    pub(super) fn drain(&mut self, shared: &Shared) -> Vec<Received> {
        let at = Instant::now();
        let mut out = Vec::new();
        let state = &shared.inputs[self.index];
        if let Some(images) = self.images.as_mut() {
            while let Some(Some(msg)) = images.next().now_or_never() {
                let image = match msg {
                    Incoming::Raw(m) => Pixels::Message(NativeImage::new(m)),
                    Incoming::Compressed(m) => Pixels::Compressed(NativeCompressed::new(m)),
                    Incoming::Video(m) => {
                        if let Some((feed, log)) = self.video.as_mut() {
                            video::take(shared, self.index, (feed, log), &m.packet(), at);
                        }
                        continue;
                    }
                };
                if let (Pixels::Compressed(c), Some((feed, log))) = (&image, self.video.as_mut()) {
                    let header = c.header();
                    if let Some(p) = video::compressed_packet(c.format(), c.data(), &header) {
                        video::take(shared, self.index, (feed, log), &p, at);
                        continue;
                    }
                }
                out.push(arrived(shared, self.index, image, at));
            }
        }
        if let Some(infos) = self.infos.as_mut() {
            while let Some(Some(info)) = infos.next().now_or_never() {
                lock(state).monitor.camera_info(at);
                *lock(&shared.camera_infos[self.index]) = Some(info);
            }
        }
        out
    }

    /// Every [`QOS_CHECK_PERIOD`] (with `auto`, every spin until the image topic's first
    /// publisher is seen: [`FIRST_PUBLISHER_CHECK_PERIOD`]): count the image publishers
    /// and, with `auto`, choose the QoS again from what they offer; a subscription whose
    /// answer changed is recreated (and the change logged).
    pub(super) fn adapt(&mut self, node: &mut r2r::Node, shared: &Shared) -> r2r::Result<()> {
        let now = Instant::now();
        if now < self.next_check {
            return Ok(());
        }
        let waiting = self.preset == QosPreset::Auto && self.image.chosen.is_none();
        self.next_check =
            now + if waiting { FIRST_PUBLISHER_CHECK_PERIOD } else { QOS_CHECK_PERIOD };
        let image_offers = offers(node, &self.image.resolved);
        let state = &shared.inputs[self.index];
        lock(state).publishers = image_offers.len();
        if self.preset != QosPreset::Auto {
            return Ok(());
        }
        // No publisher: nothing to adapt to; the subscription made so far (if any) stays.
        if let Some(adapted) = adapt_to_offers(&image_offers) {
            let recreate = changed(&self.image.chosen, &adapted);
            if recreate {
                let qos = qos_profile(self.preset, self.depth, Some(&adapted));
                self.subscribe_images(node, qos)?;
                let mut st = lock(state);
                st.best_effort = adapted.reliability == Reliability::BestEffort;
                st.monitor.reset();
            }
            if self.image.chosen.as_ref() != Some(&adapted) {
                log_choice(shared, &self.image.resolved, &adapted, &self.image.chosen, recreate);
                lock(state).qos = format!("auto: {adapted}");
            }
            self.image.chosen = Some(adapted);
        }
        if let Some(adapted) = adapt_to_offers(&offers(node, &self.info.resolved)) {
            let recreate = changed(&self.info.chosen, &adapted);
            if recreate {
                let qos = qos_profile(self.preset, self.depth, Some(&adapted));
                self.infos = None;
                self.infos =
                    Some(Box::new(node.subscribe::<CameraInfo>(&self.info.relative, qos)?));
            }
            if self.info.chosen.as_ref() != Some(&adapted) {
                log_choice(shared, &self.info.resolved, &adapted, &self.info.chosen, recreate);
            }
            self.info.chosen = Some(adapted);
        }
        Ok(())
    }
}

/// The camera_info topic of an image topic, by image_transport's rule: `camera_info` next
/// to the image (`front/image_raw` -> `front/camera_info`, `image` -> `camera_info`).
pub(super) fn camera_info_topic(image: &str) -> String {
    match image.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/camera_info"),
        None => "camera_info".to_string(),
    }
}

fn changed(chosen: &Option<Adapted>, now: &Adapted) -> bool {
    match chosen {
        Some(c) => c.differs(now),
        None => true,
    }
}

fn preset_name(p: QosPreset) -> &'static str {
    match p {
        QosPreset::Auto => "auto",
        QosPreset::SensorData => "sensor_data (best effort)",
        QosPreset::Default => "default (reliable)",
        QosPreset::SystemDefault => "system_default",
    }
}

fn log_choice(
    shared: &Shared,
    topic: &str,
    adapted: &Adapted,
    before: &Option<Adapted>,
    recreated: bool,
) {
    let what = match (before, recreated) {
        (None, _) => "subscribed",
        (Some(_), true) => "subscription recreated",
        (Some(_), false) => "subscription kept",
    };
    r2r::log_info!(&shared.logger, "input_qos auto: {topic} {adapted} ({what})");
}
