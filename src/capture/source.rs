//! The life cycle of a GStreamer pipeline ([`CaptureSource`]): the user's description parsed
//! and ended by our appsink, set PLAYING (its start-up faults returned), its frames pulled
//! while its bus is watched for an error or the end of the stream (named by cause:
//! `fault.rs`), and set to NULL on stop or drop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer::prelude::*;
use gstreamer_app as gst_app;

use super::cuda::{GpuShare, CUDA_CONTEXT_TYPE};
use super::fault::{error_fault, offered_caps, parse_fault};
use super::frame::{clock_kind, Frame};
use super::time::{CaptureTime, ClockKind};
use super::{accepted_caps, accepted_list};
use crate::error::{CaptureError, Error, Result};
use crate::image::LentReads;

/// The name of our appsink in the pipeline.
const SINK_NAME: &str = "vision_preproc_sink";
/// Buffers the appsink keeps for a caller that is late. A live source's older ones are
/// dropped (the newest frame wins, as in the node's keep-latest slot); a source that is not
/// live (a file) waits for the caller instead: every frame is delivered.
const SINK_MAX_BUFFERS: u32 = 2;
/// How long [`CaptureSource::start`] waits for the pipeline to reach PLAYING (a source
/// that is still prerolling after it is not a fault: its errors come from `next`).
const START_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `start` waits for the error message behind a failed state change.
const ERROR_GRACE_MS: u64 = 1000;
/// How long an end of stream waits for an error message behind it.
const ERROR_AFTER_EOS_MS: u64 = 100;
/// The RTSP source, whose stream is opened before PLAYING ([`CaptureSource::open_rtsp`]).
const RTSP_SOURCE: &str = "rtspsrc";
/// How often `next` looks at the bus while no frame arrives: an error or end of stream
/// is reported within this time (a frame is returned as soon as it arrives).
const BUS_POLL: Duration = Duration::from_millis(20);

/// A running GStreamer pipeline: the user's description ended by our appsink. Stopped (to
/// NULL: threads joined, devices and files closed) by [`CaptureSource::stop`] or on drop.
pub struct CaptureSource {
    description: String,
    pipeline: gst::Pipeline,
    sink: gst_app::AppSink,
    bus: gst::Bus,
    clock: Option<ClockKind>,
    delivered: u64,
    stopped: bool,
    live: bool,
    /// What backends did with this source's lent frames.
    reads: Arc<LentReads>,
    /// The GPU backend's CUDA context, shared with the pipeline's CUDA elements: its
    /// frames may then come in CUDA memory.
    gpu: Option<Arc<GpuShare>>,
}

impl CaptureSource {
    /// Parse `description` (the source part of a `gst-launch-1.0` line, e.g.
    /// `v4l2src device=/dev/video0 ! video/x-raw,format=YUY2`), end it with our appsink
    /// and set it PLAYING. Errors at parse time (syntax, a missing element, a property)
    /// and those posted while it starts (a missing device; caps that cannot be negotiated,
    /// for a source that is not live) are returned here; a live source's negotiation
    /// fails on the first [`CaptureSource::next`].
    pub fn start(description: &str) -> Result<CaptureSource> {
        CaptureSource::start_on(description, None)
    }

    /// [`CaptureSource::start`], with the GPU backend's CUDA context shared with the
    /// pipeline's CUDA elements when `gpu` is given (set on the pipeline as the
    /// `gst.cuda.context` context, and the answer to their `need-context` messages): our
    /// appsink then also accepts NV12 in CUDA memory ([`super::ACCEPTED_CUDA`]), which
    /// the backend reads in place ([`Frame::device`]).
    pub fn start_on(description: &str, gpu: Option<Arc<GpuShare>>) -> Result<CaptureSource> {
        let mut source = Self::parsed(description, gpu, false)?;
        source.open_rtsp().map_err(|fault| source.fail(fault))?;
        source.play().map_err(|fault| source.fail(fault))?;
        Ok(source)
    }

    /// `description` parsed (GStreamer initialized first), with `gpu`'s CUDA context given
    /// to its elements; not started. `live`: a video input's decode pipeline.
    fn parsed(description: &str, gpu: Option<Arc<GpuShare>>, live: bool) -> Result<CaptureSource> {
        let fail = |fault| Error::Capture { description: description.to_string(), fault };
        gst::init().map_err(|e| fail(CaptureError::Init(e.to_string())))?;
        let (pipeline, sink, bus) = parse(description, gpu.is_some()).map_err(fail)?;
        if let Some(share) = &gpu {
            share_context(&pipeline, &bus, share);
        }
        Ok(CaptureSource {
            description: description.to_string(),
            pipeline,
            sink,
            bus,
            clock: None,
            delivered: 0,
            stopped: false,
            live,
            reads: Arc::default(),
            gpu,
        })
    }

    /// Parse `description` (a video input's decode pipeline: a live appsrc at its head)
    /// and set it PLAYING without waiting: its sink completes the change with the first
    /// buffer, which the caller pushes next. Its faults come from
    /// [`CaptureSource::next`]; every frame is kept (no older frame dropped by the sink).
    /// `gpu` as for [`CaptureSource::start_on`].
    pub(super) fn start_fed(
        description: &str,
        gpu: Option<Arc<GpuShare>>,
    ) -> Result<CaptureSource> {
        let source = Self::parsed(description, gpu, true)?;
        if let Err(e) = source.pipeline.set_state(gst::State::Playing) {
            let fault = source.bus_fault(gst::ClockTime::ZERO);
            return Err(source.fail(fault.unwrap_or_else(|| CaptureError::State {
                state: "PLAYING".into(),
                message: e.to_string(),
            })));
        }
        Ok(source)
    }

    /// An `rtspsrc` opens its stream (DESCRIBE, SETUP) on its own thread once PAUSED;
    /// PLAYING at once cancels that open and makes it again, and now and then the stream
    /// then neither fails nor delivers (GStreamer 1.22: in about half the runs of
    /// test/ros/test_rtsp.py, one restart while the server came up). So a pipeline that
    /// holds one is set PAUSED first and waits, up to [`START_TIMEOUT`], for the open to
    /// end (its progress message `open`: complete, error or canceled); an error or end of
    /// stream meanwhile is the fault.
    fn open_rtsp(&self) -> std::result::Result<(), CaptureError> {
        let rtsp = self
            .pipeline
            .iterate_recurse()
            .into_iter()
            .flatten()
            .any(|e| e.factory().is_some_and(|f| f.name() == RTSP_SOURCE));
        if !rtsp {
            return Ok(());
        }
        self.pipeline
            .set_state(gst::State::Paused)
            .map_err(|e| CaptureError::State { state: "PAUSED".into(), message: e.to_string() })?;
        let deadline = Instant::now() + START_TIMEOUT;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let wait = gst::ClockTime::from_nseconds(left.as_nanos() as u64);
            let Some(message) = self.bus.timed_pop(wait) else { break };
            match message.view() {
                gst::MessageView::Error(err) => return Err(error_fault(err, &self.sink)),
                gst::MessageView::Eos(_) => return Err(CaptureError::EndOfStream),
                gst::MessageView::Progress(p) => {
                    let (kind, code, _) = p.get();
                    let ended = matches!(
                        kind,
                        gst::ProgressType::Complete
                            | gst::ProgressType::Error
                            | gst::ProgressType::Canceled
                    );
                    if ended && code == "open" {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Set the pipeline PLAYING and wait for it; a live source's appsink then drops the
    /// older frames.
    fn play(&mut self) -> std::result::Result<(), CaptureError> {
        let started = self.pipeline.set_state(gst::State::Playing);
        let settled = started
            .and_then(|_| self.pipeline.state(gst::ClockTime::try_from(START_TIMEOUT).ok()).0);
        if let Some(fault) = self.bus_fault(gst::ClockTime::ZERO) {
            return Err(fault);
        }
        if let Err(e) = settled {
            // The error message that says why can reach the bus just after the failed
            // state change (from a streaming thread): wait a little for it.
            let fault = self.bus_fault(gst::ClockTime::from_mseconds(ERROR_GRACE_MS));
            return Err(fault.unwrap_or_else(|| CaptureError::State {
                state: "PLAYING".into(),
                message: e.to_string(),
            }));
        }
        // Live (a camera, `is-live=true`): keep the newest frames, drop the older ones.
        // Asked upstream of our appsink (a sink that does not sync answers "not live").
        let mut latency = gst::query::Latency::new();
        let upstream = self.sink.static_pad("sink").and_then(|p| p.peer());
        if upstream.is_some_and(|p| p.query(&mut latency)) && latency.result().0 {
            self.live = true;
            self.sink.set_drop(true);
        }
        Ok(())
    }

    /// Count what backends do with this source's lent frames in `reads` (kept by the
    /// caller across restarts) instead of the source's own counters.
    pub fn count_reads_in(&mut self, reads: Arc<LentReads>) {
        self.reads = reads;
    }

    /// The next frame: `Ok(Some)` as soon as one arrives, `Ok(None)` when none came
    /// within `timeout`, `Err` with the named fault when the pipeline posted an error or
    /// ended (the source is then of no further use: stop it and start a new one).
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Frame>> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = Instant::now();
            let slice = deadline.saturating_duration_since(now).min(BUS_POLL);
            let wait = gst::ClockTime::from_nseconds(slice.as_nanos() as u64);
            if let Some(sample) = self.sink.try_pull_sample(wait) {
                return self.frame(&sample).map(Some).map_err(|f| self.fail(f));
            }
            if let Some(fault) = self.bus_fault(gst::ClockTime::ZERO) {
                return Err(self.fail(self.end_fault(fault)));
            }
            if self.sink.is_eos() {
                let fault =
                    self.bus_fault(gst::ClockTime::ZERO).unwrap_or(CaptureError::EndOfStream);
                return Err(self.fail(self.end_fault(fault)));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// The description as given.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// True for a live source (a camera, `is-live=true`): its capture times are when the
    /// frames were captured. A source that is not live (a file) has stream times instead.
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// The appsrc named `name` in the pipeline (a video input's).
    pub(super) fn app_src(&self, name: &str) -> Option<gst_app::AppSrc> {
        self.pipeline.by_name(name).and_then(|e| e.downcast::<gst_app::AppSrc>().ok())
    }

    /// Frames delivered so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// The pipeline clock's time now, in nanoseconds (the clock of [`CaptureTime`]), to
    /// relate capture times to another clock; `None` before the pipeline has a clock.
    pub fn clock_now_ns(&self) -> Option<u64> {
        self.pipeline.clock().map(|c| c.time().nseconds())
    }

    /// Set the pipeline PAUSED (the managed node while not active): no frame flows, the
    /// device stays open and the caps negotiated; [`CaptureSource::resume`] plays it again.
    pub fn pause(&mut self) -> Result<()> {
        self.pipeline.set_state(gst::State::Paused).map(|_| ()).map_err(|e| {
            self.fail(CaptureError::State { state: "PAUSED".into(), message: e.to_string() })
        })
    }

    /// Set a paused pipeline PLAYING again, as [`CaptureSource::start`] does.
    pub fn resume(&mut self) -> Result<()> {
        self.play().map_err(|fault| self.fail(fault))
    }

    /// Set the pipeline to NULL: its streaming threads are joined and its devices and
    /// files closed. Frames still alive keep their own buffers.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.stopped, true) {
            return Ok(());
        }
        self.pipeline.set_state(gst::State::Null).map(|_| ()).map_err(|e| {
            self.fail(CaptureError::State { state: "NULL".into(), message: e.to_string() })
        })
    }

    fn fail(&self, fault: CaptureError) -> Error {
        Error::Capture { description: self.description.clone(), fault }
    }

    /// The first error or end of stream on the bus within `wait` (other messages are
    /// dropped).
    fn bus_fault(&self, wait: gst::ClockTime) -> Option<CaptureError> {
        let message =
            self.bus.timed_pop_filtered(wait, &[gst::MessageType::Error, gst::MessageType::Eos])?;
        Some(match message.view() {
            gst::MessageView::Error(err) => error_fault(err, &self.sink),
            _ => CaptureError::EndOfStream,
        })
    }

    /// The cause behind an end of stream: an error that reaches the bus just after it (a
    /// live `videotestsrc` that cannot negotiate ends its stream with no error message
    /// first, seen in 4 of 10 runs), or, before any frame, caps that have nothing in
    /// common with ours.
    fn end_fault(&self, fault: CaptureError) -> CaptureError {
        if fault != CaptureError::EndOfStream {
            return fault;
        }
        let wait = gst::ClockTime::from_mseconds(ERROR_AFTER_EOS_MS);
        if let Some(message) = self.bus.timed_pop_filtered(wait, &[gst::MessageType::Error]) {
            if let gst::MessageView::Error(err) = message.view() {
                return error_fault(err, &self.sink);
            }
        }
        let offered = offered_caps(&self.sink);
        match offered {
            Some(caps)
                if self.delivered == 0
                    && !caps.can_intersect(&accepted_caps(self.gpu.is_some())) =>
            {
                CaptureError::NotNegotiated {
                    element: self.pipeline.name().to_string(),
                    offered: caps.to_string(),
                    accepted: accepted_list(),
                }
            }
            _ => fault,
        }
    }

    /// A sample as the next frame ([`Frame::from_sample`]), with its capture time.
    fn frame(&mut self, sample: &gst::Sample) -> std::result::Result<Frame, CaptureError> {
        let capture_time = self.capture_time(sample);
        let frame = Frame::from_sample(sample, capture_time, self.delivered, &self.reads)?;
        self.delivered += 1;
        Ok(frame)
    }

    /// The buffer's PTS as a time of the pipeline's clock.
    fn capture_time(&mut self, sample: &gst::Sample) -> Option<CaptureTime> {
        let pts = sample.buffer()?.pts()?;
        let segment = sample.segment()?.downcast_ref::<gst::ClockTime>()?;
        let running = segment.to_running_time(pts)?;
        let base = self.pipeline.base_time()?;
        if self.clock.is_none() {
            self.clock = self.pipeline.clock().map(|c| clock_kind(&c));
        }
        Some(CaptureTime { clock_ns: (running + base).nseconds(), clock: self.clock.clone()? })
    }
}

impl Drop for CaptureSource {
    fn drop(&mut self) {
        // A failure to reach NULL has no one to report to here; stop() reports it.
        let _ = self.stop_inner();
    }
}

/// `description` ended by our appsink, parsed into a pipeline (its appsink given our caps),
/// with its bus.
fn parse(
    description: &str,
    cuda: bool,
) -> std::result::Result<(gst::Pipeline, gst_app::AppSink, gst::Bus), CaptureError> {
    let line = format!(
        "{description} ! appsink name={SINK_NAME} max-buffers={SINK_MAX_BUFFERS} drop=false sync=false"
    );
    let mut context = gst::ParseContext::new();
    let element = gst::parse::launch_full(&line, Some(&mut context), gst::ParseFlags::FATAL_ERRORS)
        .map_err(|e| parse_fault(&e, &context))?;
    let pipeline = element.downcast::<gst::Pipeline>().map_err(|_| CaptureError::Link {
        message: "the description is not a chain of elements".into(),
    })?;
    let sink = pipeline
        .by_name(SINK_NAME)
        .and_then(|e| e.downcast::<gst_app::AppSink>().ok())
        .ok_or_else(|| CaptureError::Link {
            message: format!(
                "our appsink `{SINK_NAME}` is not in the pipeline (is the name taken?)"
            ),
        })?;
    sink.set_caps(Some(&accepted_caps(cuda)));
    let bus = pipeline.bus().ok_or_else(|| CaptureError::State {
        state: "PLAYING".into(),
        message: "the pipeline has no bus".into(),
    })?;
    Ok((pipeline, sink, bus))
}

/// Give the pipeline's CUDA elements `share`'s context: set on the pipeline (a bin hands
/// its contexts to its children, also to those added later), and given to any element that
/// still asks for one (`need-context` of type `gst.cuda.context`, answered on the posting
/// thread, as GStreamer's applications do).
fn share_context(pipeline: &gst::Pipeline, bus: &gst::Bus, share: &Arc<GpuShare>) {
    pipeline.set_context(share.context());
    let share = share.clone();
    bus.set_sync_handler(move |_, message| {
        if let gst::MessageView::NeedContext(need) = message.view() {
            if need.context_type() == CUDA_CONTEXT_TYPE {
                if let Some(element) = message.src().and_then(|s| s.downcast_ref::<gst::Element>())
                {
                    element.set_context(share.context());
                }
            }
        }
        gst::BusSyncReply::Pass
    });
}
