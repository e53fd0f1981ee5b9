//! The spin thread: owns the node while it runs. r2r delivers subscription messages and
//! service requests from `spin_once`; after each, the images that arrived (native C
//! messages, not copied) go to the frame-set former, `input_qos: auto` adapts the
//! subscriptions to the publishers, and `use_sim_time` (re)subscribes to `/clock`. The
//! input subscriptions are made on this thread (their native messages are not `Send`
//! until wrapped) and reported back before anything else starts.

use super::former::Former;
use super::input::{arrived, Input};
use super::native::NativeImage;
use super::native::RosArgs;
use super::shared::Pixels;
use super::shared::{lock, Shared};
use crate::config::{InputParticipants, QosPreset, Transport};
use crate::ros::participant::Deliver;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What the spin thread subscribes to.
pub(super) struct Subscriptions {
    /// The input image topics (pipeline inputs have none).
    pub topics: Vec<TopicInput>,
    /// `input_qos`.
    pub preset: QosPreset,
    /// `input_qos_depth`.
    pub depth: u32,
    /// `input_participants`.
    pub participants: InputParticipants,
    /// The command line (for the remapped input names).
    pub ros_args: Option<RosArgs>,
}

/// An input image topic.
pub(super) struct TopicInput {
    /// Its batch slot.
    pub index: usize,
    /// The image topic, relative (a compressed one's base topic).
    pub topic: String,
    /// Its transport (`<topic>/<transport>` for all but `raw`).
    pub transport: Transport,
    /// The video feed of a transport that carries video (`foxglove`, `ffmpeg`,
    /// `compressed`).
    pub video: Option<std::sync::Arc<crate::capture::VideoFeed>>,
}

/// The spin thread, started: [`spin`] on its own thread, once it has subscribed (its
/// error if it could not, with the node: the thread joined). Joining it gives the node
/// back.
pub(super) fn start(
    node: r2r::Node,
    subs: Subscriptions,
    former: Arc<Mutex<Former>>,
    shared: &Arc<Shared>,
) -> Result<std::thread::JoinHandle<r2r::Node>, Box<(crate::Error, Option<r2r::Node>)>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let spin_shared = shared.clone();
    let spinner = std::thread::Builder::new()
        .name("spin".into())
        .spawn(move || spin(node, subs, former, spin_shared, ready_tx))
        .map_err(|e| Box::new((crate::Error::io("starting the spin thread", e), None)))?;
    if let Ok(Err(e)) | Err(e) = ready_rx.recv().map_err(|e| e.to_string()) {
        shared.stop();
        let node = spinner.join().ok();
        let e = crate::Error::Ros { context: "subscribing to the inputs".into(), message: e };
        return Err(Box::new((e, node)));
    }
    Ok(spinner)
}

/// The spin thread's body: subscribe, say so on `ready`, then spin until the node stops.
/// Returns the node (kept until the end: dropping it invalidates every publisher).
///
/// The former is shared with the threads of the inputs' own participants
/// (`input_participants: per_input`) and of the pipeline inputs, which push their frames
/// into it as they take them; the spin thread pushes the images of the node's own
/// subscriptions and polls it. What it still holds at the end is counted by the caller
/// once every thread that pushes has stopped.
pub(super) fn spin(
    mut node: r2r::Node,
    subs: Subscriptions,
    former: Arc<Mutex<Former>>,
    shared: Arc<Shared>,
    ready: Sender<Result<(), String>>,
) -> r2r::Node {
    let deliver = |i: usize| -> Option<Deliver> {
        (subs.participants == InputParticipants::PerInput).then(|| {
            let (former, shared) = (former.clone(), shared.clone());
            Box::new(move |msg: r2r::NativeMsg<r2r::sensor_msgs::msg::Image>| {
                let image = Pixels::Message(NativeImage::new(msg));
                let r = arrived(&shared, i, image, Instant::now());
                let mut former = lock(&former);
                former.push(i, r, &shared);
                // A deadline set by an earlier push (latest's batch_timeout_ms) is checked
                // at each arrival too: the spin thread's wait was computed before it.
                former.poll(&shared);
            }) as Deliver
        })
    };
    let mut inputs = Vec::with_capacity(subs.topics.len());
    for t in &subs.topics {
        let (i, topic) = (t.index, &t.topic);
        // Compressed frames are small: the node's participant takes them.
        let own = if t.transport == Transport::Raw { deliver(i) } else { None };
        match Input::new(
            &mut node,
            subs.ros_args.as_ref(),
            (i, topic, t.transport),
            (subs.preset, subs.depth),
            &shared,
            (own, t.video.clone()),
        ) {
            Ok(input) => inputs.push(input),
            Err(e) => {
                let _ = ready.send(Err(format!("subscribing to the input {topic}: {e}")));
                return node;
            }
        }
    }
    for input in &inputs {
        lock(&shared.cameras)[input.index()].topic = input.topic().to_string();
    }
    let _ = ready.send(Ok(()));
    let mut sim_time = false;
    while !shared.is_stopped() {
        // use_sim_time as set (start-up, `ros2 param set`): the /clock subscription
        // belongs to the node, so it is made here.
        if let Err(e) = shared.clock.apply(&mut node, &mut sim_time) {
            r2r::log_error!(&shared.logger, "use_sim_time: {e}");
            sim_time = shared.clock.sim_time();
        }
        let timeout = lock(&former).spin_timeout();
        node.spin_once(timeout);
        for input in &mut inputs {
            let i = input.index();
            for r in input.drain(&shared) {
                lock(&former).push(i, r, &shared);
            }
        }
        lock(&former).poll(&shared);
        for input in &mut inputs {
            if let Err(e) = input.adapt(&mut node, &shared) {
                r2r::log_error!(&shared.logger, "input_qos auto: resubscribing: {e}");
            }
        }
    }
    // The inputs' own participants stop (their threads joined) before the caller lets
    // the former count what it still holds.
    drop(inputs);
    node
}
