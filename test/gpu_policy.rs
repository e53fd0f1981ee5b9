//! `gpu_failure_policy` without a GPU: the pipeline's recovery code driven through a fake
//! "cuda" backend behind the `Backend` trait. The fake computes with the CPU backend (so
//! every tensor must equal the CPU reference bit for bit) and fails the way a faulted
//! CUDA context does: once it has failed, every later call on that instance fails too
//! (a sticky error), so only a new instance from the opener recovers. The same policy
//! code runs on the H200 with the real CUDA backend in `test/gpu_fault.rs`. The
//! pipelined fake also has shared device blocks with events (host memory standing in),
//! for `tensor_ref`'s early `TensorRef` and its withdrawal.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use vision_preproc::backend::cpu::CpuBackend;
use vision_preproc::backend::{Backend, FrameWork, Job, Out, Queued, StageTimes};
use vision_preproc::config::{GpuFailurePolicy, ResizeMode};
use vision_preproc::error::CudaError;
use vision_preproc::handoff::{BlockEvent, DeviceBlocks, MemoryKind};
use vision_preproc::pipeline::{
    Announce, FailureAction, FaultKind, FaultPlan, Finished, FrameInput, FrameSet, GpuFailure,
    InFlight, Outputs, OwnedMessage, Processed, GPU_RETRY_ATTEMPTS, GPU_RETRY_RESET_FRAMES,
};
use vision_preproc::wire::msgs::Header;
use vision_preproc::{Config, Error, ImageView, Pipeline};

/// The crate's result (the tests' own functions return `Result<_, String>`).
type VpResult<T> = vision_preproc::Result<T>;

/// A "GPU" that works like the CPU backend until it fails, then stays broken.
struct FakeGpu {
    cpu: CpuBackend,
    /// Fail on this call of `process` (1-based), if any.
    fail_on_call: Option<u32>,
    /// Run this call (1-based) with an operation for another encoding: the caller's
    /// mistake, which the backend refuses with the operation error.
    wrong_op_on_call: Option<u32>,
    /// Refuse this call (1-based) as a misuse of the ring (the CUDA backend's answer to a
    /// submission past its depth): a caller's mistake too.
    misuse_on_call: Option<u32>,
    calls: u32,
    broken: bool,
}

impl FakeGpu {
    fn new(fail_on_call: Option<u32>) -> Self {
        FakeGpu {
            cpu: CpuBackend::new(),
            fail_on_call,
            wrong_op_on_call: None,
            misuse_on_call: None,
            calls: 0,
            broken: false,
        }
    }
    fn error(&self, what: &str) -> Error {
        Error::Cuda(CudaError::driver(what, "CUDA_ERROR_ILLEGAL_ADDRESS (fake)"))
    }
}

impl Backend for FakeGpu {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn device_description(&self) -> String {
        "fake GPU (CPU backend inside)".into()
    }
    fn process_into(&mut self, work: FrameWork<'_, '_>, out: &mut [u8]) -> VpResult<StageTimes> {
        let FrameWork { image, op, conv } = work;
        self.calls += 1;
        if self.fail_on_call == Some(self.calls) {
            self.broken = true;
        }
        if self.broken {
            return Err(self.error("fake kernel"));
        }
        if self.misuse_on_call == Some(self.calls) {
            return Err(Error::misuse(
                "submit_batch",
                "2 batches already in flight: finish_batch one first",
            ));
        }
        if self.wrong_op_on_call == Some(self.calls) {
            let mut wrong = op.clone();
            wrong.params.encoding ^= 1;
            return self.cpu.process_into(FrameWork::new(image, &wrong, conv), out);
        }
        self.cpu.process_into(FrameWork::new(image, op, conv), out)
    }
    fn inject_fault(&mut self, _kind: FaultKind) -> Error {
        self.broken = true;
        self.error("fake injected fault")
    }
}

fn config(policy: GpuFailurePolicy) -> Config {
    Config {
        network_image_width: 24,
        network_image_height: 16,
        resize_mode: ResizeMode::Stretch,
        gpu_failure_policy: policy,
        ..Config::default()
    }
}

/// A different little bgr8 frame for each index.
fn frame(i: u64) -> (u32, u32, Vec<u8>) {
    let (w, h) = (37, 21);
    let data = (0..w * h * 3).map(|k| ((k as u64 * 31 + i * 17) % 251) as u8).collect();
    (w, h, data)
}

/// The CPU backend's tensor for frame `i` (the specification).
fn reference(cfg: &Config, i: u64) -> Vec<u8> {
    let mut p = Pipeline::new(cfg.clone(), Box::new(CpuBackend::new())).unwrap();
    let (w, h, data) = frame(i);
    p.process(&ImageView::new(w, h, w * 3, "bgr8", false, &data).unwrap()).unwrap();
    p.tensor_bytes().to_vec()
}

/// Process frames `1..=n`; each tensor must equal the CPU's. Returns the failures seen
/// (frame number, what happened) and the backend that ran each frame.
fn run(p: &mut Pipeline, cfg: &Config, n: u64) -> (Vec<(u64, GpuFailure)>, Vec<&'static str>) {
    let mut failures = Vec::new();
    let mut backends = Vec::new();
    for i in 1..=n {
        let (w, h, data) = frame(i);
        let view = ImageView::new(w, h, w * 3, "bgr8", false, &data).unwrap();
        let info = p.process(&view).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        assert_eq!(p.tensor_bytes(), reference(cfg, i).as_slice(), "frame {i}: tensor differs");
        if let Some(f) = info.gpu_failure {
            failures.push((i, f));
        }
        backends.push(p.backend().name());
    }
    (failures, backends)
}

/// A pipeline on a fake GPU; `opened` counts the opener's calls, and the opener makes
/// fake GPUs that fail on call `fail_on_call` (or refuses `refuse` times first).
fn pipeline(
    cfg: &Config,
    first: FakeGpu,
    fail_on_call: Option<u32>,
    refuse: u32,
) -> (Pipeline, Arc<AtomicU32>) {
    let mut p = Pipeline::new(cfg.clone(), Box::new(first)).unwrap();
    let opened = Arc::new(AtomicU32::new(0));
    let counter = opened.clone();
    p.set_backend_opener(Box::new(move |_cfg: &Config| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= refuse {
            return Err(Error::Cuda(CudaError::Unavailable(format!("fake: no device ({n})"))));
        }
        Ok(Box::new(FakeGpu::new(fail_on_call)) as Box<dyn Backend>)
    }));
    (p, opened)
}

#[test]
fn fallback_switches_to_the_cpu_and_reruns_the_failed_frame() {
    let cfg = config(GpuFailurePolicy::Fallback);
    let (mut p, opened) = pipeline(&cfg, FakeGpu::new(None), None, 0);
    p.inject_fault(FaultPlan::once(3, FaultKind::Sticky));
    let (failures, backends) = run(&mut p, &cfg, 8);
    assert_eq!(failures.len(), 1, "{failures:?}");
    let (at, f) = &failures[0];
    assert_eq!((*at, &f.action, f.backend), (3, &FailureAction::FellBack, "cpu"));
    assert!(f.reason.contains("fake injected fault"), "{}", f.reason);
    assert_eq!(f.to_string(), "gpu_failure_policy fallback: switched to the cpu backend");
    assert_eq!(backends, ["cuda", "cuda", "cpu", "cpu", "cpu", "cpu", "cpu", "cpu"]);
    assert_eq!(opened.load(Ordering::SeqCst), 0, "fallback must not rebuild");
}

#[test]
fn retry_rebuilds_the_backend_after_a_sticky_fault() {
    let cfg = config(GpuFailurePolicy::Retry);
    // The first fake fails on its 4th frame and stays broken (sticky).
    let (mut p, opened) = pipeline(&cfg, FakeGpu::new(Some(4)), None, 0);
    let (failures, backends) = run(&mut p, &cfg, 10);
    assert_eq!(failures.len(), 1, "{failures:?}");
    let (at, f) = &failures[0];
    assert_eq!((*at, &f.action, f.backend), (4, &FailureAction::Rebuilt { attempt: 1 }, "cuda"));
    assert!(f.reason.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{}", f.reason);
    assert_eq!(
        f.to_string(),
        "gpu_failure_policy retry: rebuilt the cuda backend (attempt 1 of 3)"
    );
    assert!(backends.iter().all(|b| *b == "cuda"), "{backends:?}");
    assert_eq!(opened.load(Ordering::SeqCst), 1);
}

#[test]
fn retry_keeps_trying_when_opening_fails_then_succeeds() {
    let cfg = config(GpuFailurePolicy::Retry);
    let (mut p, opened) = pipeline(&cfg, FakeGpu::new(None), None, 2);
    p.inject_fault(FaultPlan::once(2, FaultKind::Sticky));
    let t = Instant::now();
    let (failures, backends) = run(&mut p, &cfg, 5);
    // Backoff before attempts 2 and 3: 200 ms + 1000 ms.
    assert!(t.elapsed().as_millis() >= 1200, "{:?}", t.elapsed());
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].1.action, FailureAction::Rebuilt { attempt: 3 });
    assert_eq!(backends, ["cuda"; 5]);
    assert_eq!(opened.load(Ordering::SeqCst), 3);
}

#[test]
fn retry_falls_back_after_the_attempts_when_the_gpu_stays_broken() {
    let cfg = config(GpuFailurePolicy::Retry);
    let (mut p, opened) = pipeline(&cfg, FakeGpu::new(None), None, 0);
    // Every attempt from frame 3 on fails, the re-runs on rebuilt backends too.
    p.inject_fault(FaultPlan::from(3, FaultKind::Sticky));
    let (failures, backends) = run(&mut p, &cfg, 6);
    assert_eq!(failures.len(), 1, "{failures:?}");
    let (at, f) = &failures[0];
    assert_eq!((*at, f.backend), (3, "cpu"));
    match &f.action {
        FailureAction::RetriesExhausted { attempts, last_error } => {
            assert_eq!(*attempts, GPU_RETRY_ATTEMPTS);
            assert!(last_error.contains("the frame again"), "{last_error}");
        }
        a => panic!("expected RetriesExhausted, got {a:?}"),
    }
    assert!(f.to_string().contains("3 rebuild attempt(s) failed"), "{f}");
    assert_eq!(backends, ["cuda", "cuda", "cpu", "cpu", "cpu", "cpu"]);
    assert_eq!(opened.load(Ordering::SeqCst), GPU_RETRY_ATTEMPTS);
}

#[test]
fn retry_attempts_are_bounded_across_failures_and_restored_after_good_frames() {
    let cfg = config(GpuFailurePolicy::Retry);
    // Every fake GPU fails on its 3rd call: frames 3, 5, 7 fail (each rebuilt backend
    // runs the failed frame, then one good frame); the 4th failure finds no attempts.
    let (mut p, opened) = pipeline(&cfg, FakeGpu::new(Some(3)), Some(3), 0);
    let (failures, backends) = run(&mut p, &cfg, 12);
    let summary: Vec<(u64, FailureAction)> =
        failures.iter().map(|(i, f)| (*i, f.action.clone())).collect();
    assert_eq!(
        summary,
        vec![
            (3, FailureAction::Rebuilt { attempt: 1 }),
            (5, FailureAction::Rebuilt { attempt: 1 }),
            (7, FailureAction::Rebuilt { attempt: 1 }),
            (9, FailureAction::RetriesExhausted { attempts: 0, last_error: String::new() }),
        ]
    );
    assert!(failures[3].1.to_string().contains("no rebuild attempts left"), "{}", failures[3].1);
    assert_eq!(&backends[8..], ["cpu"; 4]);
    assert_eq!(opened.load(Ordering::SeqCst), 3);

    // A GPU that fails less often than every GPU_RETRY_RESET_FRAMES frames is rebuilt
    // every time.
    let every = u32::try_from(GPU_RETRY_RESET_FRAMES).unwrap() + 2;
    let (mut p, opened) = pipeline(&cfg, FakeGpu::new(Some(every)), Some(every), 0);
    let n = u64::from(every) * 5;
    let (failures, backends) = run(&mut p, &cfg, n);
    assert_eq!(failures.len(), 5, "{failures:?}");
    assert!(failures.iter().all(|(_, f)| f.action == FailureAction::Rebuilt { attempt: 1 }));
    assert!(backends.iter().all(|b| *b == "cuda"));
    assert_eq!(opened.load(Ordering::SeqCst), 5);
}

#[test]
fn exit_returns_the_reason_and_other_errors_do_not_trigger_the_policy() {
    let cfg = config(GpuFailurePolicy::Exit);
    let (mut p, opened) = pipeline(&cfg, FakeGpu::new(Some(2)), None, 0);
    let (w, h, data) = frame(1);
    let view = ImageView::new(w, h, w * 3, "bgr8", false, &data).unwrap();
    p.process(&view).unwrap();
    let e = p.process(&view).unwrap_err();
    assert!(matches!(e, Error::GpuFailure { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "GPU failure, gpu_failure_policy exit: CUDA: fake kernel: CUDA_ERROR_ILLEGAL_ADDRESS (fake)"
    );
    assert_eq!(opened.load(Ordering::SeqCst), 0);

    // An invalid frame is the frame's problem, not the GPU's: no recovery, same backend.
    let cfg = Config { roi: vec![30, 0, 10, 10], ..config(GpuFailurePolicy::Fallback) };
    let (mut p, _) = pipeline(&cfg, FakeGpu::new(None), None, 0);
    let e = p.process(&view).unwrap_err();
    assert!(matches!(e, Error::Image(_)), "{e:?}");
    assert_eq!(p.backend().name(), "cuda");
}

#[test]
fn an_operation_that_does_not_fit_the_frame_starts_no_failure_policy() {
    // The backend refuses the wrong operation with the operation error (as the CUDA
    // backend does, test/gpu_fault.rs `wrong-op`): a caller's mistake, so even with the
    // exit policy the pipeline only returns it, and the next frame runs on the same GPU.
    let cfg = config(GpuFailurePolicy::Exit);
    let mut fake = FakeGpu::new(None);
    fake.wrong_op_on_call = Some(2);
    let (mut p, opened) = pipeline(&cfg, fake, None, 0);
    let (w, h, data) = frame(1);
    let view = ImageView::new(w, h, w * 3, "bgr8", false, &data).unwrap();
    p.process(&view).unwrap();
    let e = p.process(&view).unwrap_err();
    assert!(matches!(e, Error::Operation(_)), "{e:?}");
    assert!(e.to_string().contains("set_source"), "{e}");
    let info = p.process(&view).unwrap();
    assert!(info.gpu_failure.is_none(), "{:?}", info.gpu_failure);
    assert_eq!(p.tensor_bytes(), reference(&cfg, 1).as_slice());
    assert_eq!((p.backend().name(), opened.load(Ordering::SeqCst)), ("cuda", 0));
}

#[test]
fn a_misuse_of_the_ring_starts_no_failure_policy() {
    // A broken contract on the CUDA path (here: a submission past the ring's depth) is
    // the caller's mistake or a bug, never the device's: with the exit policy the
    // pipeline only returns it, and the next frame runs on the same GPU.
    let cfg = config(GpuFailurePolicy::Exit);
    let mut fake = FakeGpu::new(None);
    fake.misuse_on_call = Some(2);
    let (mut p, opened) = pipeline(&cfg, fake, None, 0);
    let (w, h, data) = frame(1);
    let view = ImageView::new(w, h, w * 3, "bgr8", false, &data).unwrap();
    p.process(&view).unwrap();
    let e = p.process(&view).unwrap_err();
    assert!(matches!(e, Error::Misuse { .. }) && !e.is_device_failure(), "{e:?}");
    assert_eq!(e.to_string(), "submit_batch: 2 batches already in flight: finish_batch one first");
    let info = p.process(&view).unwrap();
    assert!(info.gpu_failure.is_none(), "{:?}", info.gpu_failure);
    assert_eq!(p.tensor_bytes(), reference(&cfg, 1).as_slice());
    assert_eq!((p.backend().name(), opened.load(Ordering::SeqCst)), ("cuda", 0));
    // The fake's device error is one: the same policy makes the pipeline exit on it.
    let (mut p, _) = pipeline(&cfg, FakeGpu::new(Some(1)), None, 0);
    let e = p.process(&view).unwrap_err();
    assert!(matches!(e, Error::GpuFailure { .. }), "{e:?}");
}

#[test]
fn the_cpu_backend_simulates_an_injected_fault() {
    // What the node does on a machine without a GPU when the injection is set: the CPU
    // backend's (default) inject_fault returns a simulated CUDA error, and the policy acts.
    let cfg = Config {
        backend: vision_preproc::config::BackendChoice::Cpu,
        ..config(GpuFailurePolicy::Retry)
    };
    let mut p = Pipeline::new(cfg.clone(), Box::new(CpuBackend::new())).unwrap();
    p.inject_fault(FaultPlan::once(2, FaultKind::Sticky));
    let (failures, backends) = run(&mut p, &cfg, 4);
    assert_eq!(failures.len(), 1);
    let f = &failures[0].1;
    assert_eq!(
        (failures[0].0, &f.action, f.backend),
        (2, &FailureAction::Rebuilt { attempt: 1 }, "cpu")
    );
    assert!(f.reason.contains("simulated on the cpu backend"), "{}", f.reason);
    assert_eq!(backends, ["cpu"; 4]);
}

/// A fake GPU with two submissions in flight (as the CUDA backend): a submission is
/// computed at once (CPU backend) and its times handed out at its finish; once broken
/// (on submission `fail_on_call`), every submission and finish fails, as on a faulted
/// context. Its "device memory" ([`SimBlocks`], for `tensor_ref`) is host memory; it
/// notes the blocks' events it records (`recorded`).
struct PipelinedFakeGpu {
    fake: FakeGpu,
    done: std::collections::VecDeque<StageTimes>,
    recorded: Arc<Mutex<Vec<usize>>>,
}

/// The shared blocks of [`PipelinedFakeGpu`]: heap memory at each block's "device
/// address", block i with an "interprocess event" (`raw` 100 + i, handle bytes i + 1).
struct SimBlocks(Vec<Box<[u8]>>);

impl DeviceBlocks for SimBlocks {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn block_size(&self) -> usize {
        self.0[0].len()
    }
    fn fd(&self, _: usize) -> std::os::fd::RawFd {
        -1
    }
    fn address(&self, i: usize) -> u64 {
        self.0[i].as_ptr() as u64
    }
    fn device_id(&self) -> i32 {
        0
    }
    fn uuid(&self) -> [u8; 16] {
        [1; 16]
    }
    fn read(&self, i: usize, out: &mut [u8]) -> vision_preproc::Result<()> {
        out.copy_from_slice(&self.0[i][..out.len()]);
        Ok(())
    }
    fn ready_event(&self, i: usize) -> Option<BlockEvent> {
        Some(BlockEvent { raw: 100 + i, handle: [i as u8 + 1; 64] })
    }
    fn events_missing(&self) -> Option<String> {
        None
    }
}

impl PipelinedFakeGpu {
    fn new(fail_on_call: Option<u32>) -> Self {
        PipelinedFakeGpu {
            fake: FakeGpu::new(fail_on_call),
            done: Default::default(),
            recorded: Default::default(),
        }
    }
}

impl Backend for PipelinedFakeGpu {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn device_description(&self) -> String {
        format!("{}, 2 in flight", self.fake.device_description())
    }
    fn process_into(&mut self, work: FrameWork<'_, '_>, out: &mut [u8]) -> VpResult<StageTimes> {
        self.fake.process_into(work, out)
    }
    fn max_in_flight(&self) -> usize {
        2
    }
    unsafe fn submit_to(&mut self, job: Job<'_, '_>, out: Out) -> VpResult<Queued> {
        let (ptr, len) = match out {
            Out::Host { ptr, len } => (ptr, len),
            Out::Device { ptr, len, ready, .. } => {
                self.recorded.lock().unwrap().extend(ready);
                (ptr as *mut u8, len)
            }
        };
        let Job::Frame(work) = job else { panic!("single frames only") };
        // SAFETY: the pipeline's promise (submit_to's contract); written before returning.
        let out = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        let times = self.fake.process_into(work, out)?;
        self.done.push_back(times);
        Ok(Queued::Pending)
    }
    fn finish_oldest(&mut self) -> vision_preproc::Result<StageTimes> {
        if self.fake.broken {
            self.done.clear();
            return Err(self.fake.error("fake finish"));
        }
        self.done.pop_front().ok_or_else(|| Error::misuse("finish_oldest", "nothing in flight"))
    }
    fn abandon_all(&mut self) {
        self.done.clear();
    }
    fn shared_blocks(
        &self,
        count: usize,
        bytes: usize,
    ) -> vision_preproc::Result<Option<Box<dyn DeviceBlocks>>> {
        Ok(Some(Box::new(SimBlocks((0..count).map(|_| vec![0u8; bytes].into()).collect()))))
    }
}

/// Frame `i` ([`frame`]) as a set the pipeline owns while it is in flight. With `ages`,
/// its `TensorRef` is announced when it is submitted, then announced again (which must be
/// refused); what went out is kept.
struct OneFrame {
    frame: (u32, u32, Vec<u8>),
    header: Header,
    ages: Option<Vec<f32>>,
    sent: Option<Vec<u8>>,
    sent_again: bool,
}

fn one_frame(i: u64, ages: Option<&[f32]>) -> OneFrame {
    let ages = ages.map(<[f32]>::to_vec);
    OneFrame { frame: frame(i), header: Header::default(), ages, sent: None, sent_again: false }
}

impl FrameSet for OneFrame {
    fn with_inputs<R>(&self, f: impl FnOnce(&[FrameInput<'_, '_>]) -> R) -> R {
        let (w, h, data) = &self.frame;
        let view = ImageView::new(*w, *h, w * 3, "bgr8", false, data).unwrap();
        f(&[FrameInput::frame(&view, &self.header, "bgr8")])
    }

    fn submitted(&mut self, announce: &mut Announce<'_>) {
        let Some(ages) = &self.ages else { return };
        let mut sent = None;
        if announce.send(ages, |cdr| {
            sent = Some(cdr.to_vec());
            true
        }) {
            self.sent = sent;
        }
        self.sent_again = announce.send(ages, |_| true);
    }
}

/// The processed set and message of a set that left the pipeline (a panic if it failed).
fn done(f: Finished<OneFrame>) -> (Processed, OwnedMessage) {
    f.result.unwrap_or_else(|e| panic!("the set failed: {e}"))
}

#[test]
fn a_set_the_faulted_backend_refused_runs_again_after_the_fallback() {
    // Set 1 is in flight when set 2's submission finds the device broken (refused: on
    // the H200 the faulted context refused the message buffer's allocation). The
    // fallback, at set 1's finish, runs set 1 again on the CPU; set 2, refused by the
    // backend now gone, runs again too instead of failing.
    let cfg = config(GpuFailurePolicy::Fallback);
    let gpu = PipelinedFakeGpu::new(Some(2));
    let mut sets = InFlight::new(Pipeline::new(cfg.clone(), Box::new(gpu)).unwrap());
    assert!(sets.push(one_frame(1, None), Outputs::message()).is_empty(), "set 1 in flight");
    // Set 2 is refused by the broken device (queued as failed); set 1 is finished, then
    // set 2 too: the CPU backend takes one set at a time.
    let mut out = sets.push(one_frame(2, None), Outputs::message());
    assert_eq!((out.len(), sets.len()), (2, 0));
    let (first, m) = done(out.remove(0));
    let f = first.gpu_failure.expect("set 1 met the failure");
    assert_eq!((&f.action, f.backend), (&FailureAction::FellBack, "cpu"));
    assert_eq!(m.tensor(), reference(&cfg, 1).as_slice(), "set 1 on the CPU");
    let (second, m) = done(out.remove(0));
    assert!(second.gpu_failure.is_none(), "one failure, handled once");
    assert_eq!(m.tensor(), reference(&cfg, 2).as_slice(), "set 2 run again on the CPU");
    assert_eq!(sets.pipeline().backend().name(), "cpu");
}

#[test]
fn a_set_announced_before_its_finish_is_withdrawn_when_the_device_fails() {
    // tensor_ref with block events: a set's TensorRef goes out at its submission
    // (docs/HANDOFF.md). Set 1 finishes well; set 2 is in flight when set 3's submission
    // finds the device broken, so set 2's finish fails after its TensorRef went out: its
    // block is withdrawn (a new generation), and set 2 runs again on the CPU into the
    // Tensor message alone.
    let cfg = config(GpuFailurePolicy::Fallback);
    let gpu = PipelinedFakeGpu::new(Some(3));
    let recorded = Arc::clone(&gpu.recorded);
    let p = Pipeline::new(cfg.clone(), Box::new(gpu)).unwrap();
    let bytes = p.output_bytes();
    let lease = std::time::Duration::from_secs(1);
    let (pool, why) = p.shared_pool(2, bytes, lease, std::path::Path::new("/tmp")).unwrap();
    assert_eq!((pool.memory(), why, pool.events_missing()), (MemoryKind::Cuda, None, None));
    let mut sets = InFlight::new(p);
    // Set 1: the block's event recorded with the submission; its TensorRef out before
    // the finish, with the block's handle, once.
    let block = pool.lease().0.unwrap();
    let (b, g) = (block.index(), block.generation());
    let into_block = |block| Outputs { block: Some(block), fill: false };
    assert!(sets.push(one_frame(1, Some(&[2.5])), into_block(block)).is_empty());
    let set1 = sets.sets().next().unwrap();
    let sent = set1.sent.clone().expect("set 1's TensorRef went out at its submission");
    assert!(!set1.sent_again, "announced once");
    assert_eq!(*recorded.lock().unwrap(), [100 + b]);
    let handle = [b as u8 + 1; 64];
    let at = sent.windows(64).position(|w| w == handle).expect("the block's event handle");
    assert_eq!(&sent[at - 4..at], &64u32.to_le_bytes(), "a 64-byte sequence");
    let (first, mut m) = done(sets.finish_oldest().unwrap());
    assert!(first.gpu_failure.is_none());
    assert!(m.announced() && m.tensor_ref(&[2.5]).is_none(), "not described again");
    assert!(!m.has_bytes(), "tensor_ref alone: no Tensor bytes");
    let block = m.take_block().unwrap();
    assert_eq!((block.index(), block.generation()), (b, g));
    let mut written = vec![0u8; bytes];
    block.read_device(&mut written).unwrap();
    assert_eq!(written, reference(&cfg, 1), "set 1 in its block");
    block.published();
    drop(m);
    assert_eq!(pool.counts().0.withdrawn, 0);
    // Set 2 announced; set 3 (into the message) breaks the device; set 2's finish fails.
    let block = pool.lease().0.unwrap();
    assert!(sets.push(one_frame(2, Some(&[1.0])), into_block(block)).is_empty());
    assert!(sets.sets().next().unwrap().sent.is_some());
    // Set 3 is refused by the broken device (queued as failed); set 2 is finished, then
    // set 3 too (on the CPU).
    let mut out = sets.push(one_frame(3, None), Outputs::message());
    assert_eq!((out.len(), sets.len()), (2, 0));
    let (second, m) = done(out.remove(0));
    let f = second.gpu_failure.expect("set 2 met the failure");
    assert_eq!((&f.action, f.backend), (&FailureAction::FellBack, "cpu"));
    assert_eq!(pool.counts().0.withdrawn, 1, "set 2's TensorRef withdrawn");
    assert!(!m.announced() && m.has_bytes(), "set 2 again, on the CPU: the Tensor message");
    assert_eq!(m.tensor(), reference(&cfg, 2).as_slice());
    drop(m);
    let (third, m) = done(out.remove(0));
    assert!(third.gpu_failure.is_none(), "one failure, handled once");
    assert_eq!(m.tensor(), reference(&cfg, 3).as_slice());
    assert_eq!(pool.counts().0.withdrawn, 1);
}
