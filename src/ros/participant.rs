//! An input's own DDS participant (`input_participants: per_input`): an rcl context of its
//! own (rmw_fastrtps makes one DDS participant per context, and Fast DDS gives each
//! participant one shared-memory receive thread), a hidden node `_<node>_input<i>` in the
//! node's namespace holding the image subscription, and a thread that waits on that
//! subscription and takes each image as it arrives (the copy out of DDS that the node's
//! spin thread makes for the inputs of the node's own participant).
//!
//! Why: one participant takes ~370-420 1080p frames/s on the H200 whatever the number of
//! cameras (its receive thread copies every frame into the reader's history), four
//! single-camera nodes twice that with four cameras; two nodes with two inputs each took
//! 1.5-1.7x the frames of one node with four (docs/BENCHMARKS.md, *Multi-camera*).
//!
//! r2r makes one rcl context per process (`r2r::Context::create` returns the same one),
//! so this uses rcl directly, as rclcpp does for a second `rclcpp::Context`. The context
//! is made without command-line arguments: the topic it subscribes to is the node's
//! resolved one, and its participant has the environment's domain, discovery range and
//! Fast DDS profile (the same as the node's).

use r2r::sensor_msgs::msg::Image;
use r2r::{QosProfile, WrappedTypesupport};
use r2r_rcl as rcl;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What the participant's thread does with each image it takes (on that thread).
pub(super) type Deliver = Box<dyn FnMut(r2r::NativeMsg<Image>) + Send>;

/// Longest wait for an image before the thread looks at its commands and stop flag again.
const WAIT: Duration = Duration::from_millis(50);

/// An input's own participant and the thread taking its images; stopped when dropped.
pub(super) struct OwnParticipant {
    /// The hidden node's name.
    name: String,
    /// New QoS for the subscription (the first one subscribes).
    qos: Sender<QosProfile>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl OwnParticipant {
    /// Start the participant of input `index` of the node `node_name` in `namespace`, for
    /// the resolved image topic `topic`: the hidden node is made before this returns (an
    /// error says what rcl refused); it subscribes at the first [`OwnParticipant::subscribe`].
    /// `logger` names the node's logger (for errors after the start).
    pub(super) fn start(
        (node_name, namespace, index): (&str, &str, usize),
        topic: &str,
        logger: &str,
        deliver: Deliver,
    ) -> Result<OwnParticipant, String> {
        let name = format!("_{node_name}_input{index}");
        let (qos_tx, qos_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let job = Job {
            name: name.clone(),
            namespace: namespace.to_string(),
            topic: topic.to_string(),
            logger: logger.to_string(),
            deliver,
            qos: qos_rx,
            stop: stop.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("input{index}"))
            .spawn(move || job.run(ready_tx))
            .map_err(|e| format!("starting the thread of {name}: {e}"))?;
        let started = ready_rx.recv().unwrap_or_else(|_| Err("its thread ended".into()));
        let mut p = OwnParticipant { name, qos: qos_tx, stop, thread: Some(thread) };
        match started {
            Ok(()) => Ok(p),
            Err(e) => {
                let name = p.name.clone();
                p.shut();
                Err(format!("the input's own DDS participant ({name}): {e}"))
            }
        }
    }

    /// The hidden node's name (without namespace).
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// (Re)subscribe with `qos` (done by the participant's thread within [`WAIT`]).
    pub(super) fn subscribe(&self, qos: QosProfile) {
        // (The thread only ends when stopped, so the send cannot fail before `shut`.)
        let _ = self.qos.send(qos);
    }

    fn shut(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for OwnParticipant {
    fn drop(&mut self) {
        self.shut();
    }
}

/// What the participant's thread owns.
struct Job {
    name: String,
    namespace: String,
    topic: String,
    logger: String,
    deliver: Deliver,
    qos: Receiver<QosProfile>,
    stop: Arc<AtomicBool>,
}

impl Job {
    fn run(mut self, ready: Sender<Result<(), String>>) {
        let mut rcl = match Rcl::open(&self.name, &self.namespace) {
            Ok(r) => r,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        while !self.stop.load(Ordering::Relaxed) {
            while let Ok(qos) = self.qos.try_recv() {
                if let Err(e) = rcl.subscribe(&self.topic, qos) {
                    r2r::log_error!(
                        &self.logger,
                        "{}: subscribing to {}: {e}",
                        self.name,
                        self.topic
                    );
                }
            }
            if !rcl.subscribed() {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let failed = match rcl.wait(WAIT) {
                Ok(()) => loop {
                    match rcl.take() {
                        Ok(Some(msg)) => {
                            (self.deliver)(msg);
                            if self.stop.load(Ordering::Relaxed) {
                                break None;
                            }
                        }
                        Ok(None) => break None,
                        Err(e) => break Some(format!("taking an image: {e}")),
                    }
                },
                Err(e) => Some(format!("waiting for images: {e}")),
            };
            if let Some(e) = failed {
                r2r::log_error!(&self.logger, "{} ({}): {e}", self.name, self.topic);
                std::thread::sleep(WAIT);
            }
        }
    }
}

/// The rcl objects of one participant, finalized in reverse order when dropped. Boxed:
/// rcl keeps pointers to the context (in the node and the wait set) and to the node.
struct Rcl {
    options: Box<rcl::rcl_init_options_t>,
    context: Box<rcl::rcl_context_t>,
    node: Box<rcl::rcl_node_t>,
    /// The subscription and a wait set for it alone.
    sub: Option<(Box<rcl::rcl_subscription_t>, Box<rcl::rcl_wait_set_t>)>,
}

/// rcl's error string for a failed call `what` returning `ret`, and the error state reset.
fn rcl_error(what: &str, ret: rcl::rcl_ret_t) -> String {
    // SAFETY: rcutils keeps a thread-local error state; reading it and resetting it on the
    // thread that made the failed call is how rcl documents its use.
    let text = unsafe {
        let e = rcl::rcutils_get_error_string();
        let text = CStr::from_ptr(e.str_.as_ptr()).to_string_lossy().into_owned();
        rcl::rcutils_reset_error();
        text
    };
    format!("{what} returned {ret}: {text}")
}

fn check(what: &str, ret: rcl::rcl_ret_t) -> Result<(), String> {
    if ret == rcl::RCL_RET_OK as rcl::rcl_ret_t {
        Ok(())
    } else {
        Err(rcl_error(what, ret))
    }
}

impl Rcl {
    /// A new context (no arguments) and the node `name` in `namespace`.
    fn open(name: &str, namespace: &str) -> Result<Rcl, String> {
        let c_name = CString::new(name).map_err(|_| format!("node name {name:?} holds a NUL"))?;
        let c_ns =
            CString::new(namespace).map_err(|_| format!("namespace {namespace:?} holds a NUL"))?;
        // SAFETY: zero-initialized rcl structs are what rcl's *_init functions take; each
        // is boxed before its address is given to rcl, and finalized in `Drop` only if
        // its init succeeded (the others stay zero-initialized, which fini accepts or
        // which `Drop` skips, see there).
        unsafe {
            let mut r = Rcl {
                options: Box::new(rcl::rcl_get_zero_initialized_init_options()),
                context: Box::new(rcl::rcl_get_zero_initialized_context()),
                node: Box::new(rcl::rcl_get_zero_initialized_node()),
                sub: None,
            };
            let alloc = rcl::rcutils_get_default_allocator();
            check("rcl_init_options_init", rcl::rcl_init_options_init(&mut *r.options, alloc))?;
            check("rcl_init", rcl::rcl_init(0, std::ptr::null(), &*r.options, &mut *r.context))?;
            let mut opts = rcl::rcl_node_get_default_options();
            // The node's /rosout carries the node's log; the hidden node logs nothing.
            opts.enable_rosout = false;
            check(
                "rcl_node_init",
                rcl::rcl_node_init(
                    &mut *r.node,
                    c_name.as_ptr(),
                    c_ns.as_ptr(),
                    &mut *r.context,
                    &opts,
                ),
            )?;
            Ok(r)
        }
    }

    fn subscribed(&self) -> bool {
        self.sub.is_some()
    }

    /// (Re)make the image subscription to `topic` with `qos`, and its wait set.
    fn subscribe(&mut self, topic: &str, qos: QosProfile) -> Result<(), String> {
        self.unsubscribe();
        let c_topic = CString::new(topic).map_err(|_| format!("topic {topic:?} holds a NUL"))?;
        // SAFETY: as in `open`: zero-initialized structs, boxed before rcl sees them; the
        // node and context are initialized (made in `open`, alive as long as `self`); on
        // a failure the subscription made is finalized here, the wait set not made.
        unsafe {
            let mut sub = Box::new(rcl::rcl_get_zero_initialized_subscription());
            let mut opts = rcl::rcl_subscription_get_default_options();
            opts.qos = qos.into();
            check(
                "rcl_subscription_init",
                rcl::rcl_subscription_init(
                    &mut *sub,
                    &*self.node,
                    Image::get_ts(),
                    c_topic.as_ptr(),
                    &opts,
                ),
            )?;
            let mut ws = Box::new(rcl::rcl_get_zero_initialized_wait_set());
            let ret = rcl::rcl_wait_set_init(
                &mut *ws,
                1,
                0,
                0,
                0,
                0,
                0,
                &mut *self.context,
                rcl::rcutils_get_default_allocator(),
            );
            if let Err(e) = check("rcl_wait_set_init", ret) {
                rcl::rcl_subscription_fini(&mut *sub, &mut *self.node);
                return Err(e);
            }
            self.sub = Some((sub, ws));
        }
        Ok(())
    }

    fn unsubscribe(&mut self) {
        if let Some((mut sub, mut ws)) = self.sub.take() {
            // SAFETY: both were initialized by `subscribe` and are finalized once (taken
            // out of `self.sub`); the node they belong to is alive.
            unsafe {
                rcl::rcl_wait_set_fini(&mut *ws);
                rcl::rcl_subscription_fini(&mut *sub, &mut *self.node);
            }
        }
    }

    /// Wait up to `timeout` for an image (Ok also on a timeout).
    fn wait(&mut self, timeout: Duration) -> Result<(), String> {
        let Some((sub, ws)) = self.sub.as_mut() else { return Ok(()) };
        // SAFETY: the wait set and the subscription were initialized together in
        // `subscribe` and are alive; the wait set holds the subscription's address only
        // until the next clear.
        unsafe {
            check("rcl_wait_set_clear", rcl::rcl_wait_set_clear(&mut **ws))?;
            check(
                "rcl_wait_set_add_subscription",
                rcl::rcl_wait_set_add_subscription(&mut **ws, &**sub, std::ptr::null_mut()),
            )?;
            let ns = i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX);
            match rcl::rcl_wait(&mut **ws, ns) {
                r if r == rcl::RCL_RET_OK as rcl::rcl_ret_t
                    || r == rcl::RCL_RET_TIMEOUT as rcl::rcl_ret_t =>
                {
                    // A timeout leaves an error message set; nothing failed.
                    rcl::rcutils_reset_error();
                    Ok(())
                }
                r => Err(rcl_error("rcl_wait", r)),
            }
        }
    }

    /// The next image the subscription holds, if any.
    fn take(&mut self) -> Result<Option<r2r::NativeMsg<Image>>, String> {
        let Some((sub, _)) = self.sub.as_ref() else { return Ok(None) };
        let msg = r2r::NativeMsg::<Image>::new();
        let mut info = rcl::rmw_message_info_t::default();
        // SAFETY: `msg` is an initialized C message of the subscription's type (its type
        // support made it), which rcl_take fills; the subscription is alive.
        let ret = unsafe { rcl::rcl_take(&**sub, msg.msg.cast(), &mut info, std::ptr::null_mut()) };
        if ret == rcl::RCL_RET_OK as rcl::rcl_ret_t {
            Ok(Some(msg))
        } else if ret == rcl::RCL_RET_SUBSCRIPTION_TAKE_FAILED as rcl::rcl_ret_t {
            // SAFETY: resetting the thread-local error state of the take that found nothing.
            unsafe { rcl::rcutils_reset_error() };
            Ok(None)
        } else {
            Err(rcl_error("rcl_take", ret))
        }
    }
}

impl Drop for Rcl {
    fn drop(&mut self) {
        self.unsubscribe();
        // SAFETY: fini of what `open` initialized, in reverse order: the node (only if
        // its init succeeded: rcl_node_is_valid), the context (shut down first if it is
        // valid; rcl_context_fini accepts a zero-initialized context), the init options
        // (fini only if initialized: their impl pointer is set).
        unsafe {
            if rcl::rcl_node_is_valid(&*self.node) {
                rcl::rcl_node_fini(&mut *self.node);
            }
            if rcl::rcl_context_is_valid(&*self.context) {
                rcl::rcl_shutdown(&mut *self.context);
            }
            rcl::rcl_context_fini(&mut *self.context);
            if !self.options.impl_.is_null() {
                rcl::rcl_init_options_fini(&mut *self.options);
            }
            rcl::rcutils_reset_error();
        }
    }
}
