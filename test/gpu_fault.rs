//! GPU fault drill (no ROS): the real CUDA backend inside a `Pipeline`, a real device
//! fault injected mid-run (`Pipeline::inject_fault`, what `VISION_PREPROC_INJECT_CUDA_FAULT`
//! does in the node: a kernel reads a null pointer, a sticky CUDA_ERROR_ILLEGAL_ADDRESS),
//! and `gpu_failure_policy` applied by the pipeline code the node runs. Every tensor
//! before and after the fault is compared with the CPU backend's (the specification):
//! within the named tolerances while on the GPU, bit for bit once on the CPU.
//!
//! Scenarios: fallback; retry after a transient fault (out of memory: a new backend is
//! built and carries on); retry after a sticky fault (illegal address: whether a new
//! backend can work in the same process is what the probe finds; on the H200 it cannot,
//! so retry uses up its attempts and falls back); retry with a GPU that stays broken (every
//! attempt fails: bounded rebuilds, then the CPU); exit (the frame's error names the
//! fault). First it checks that a wrong operation is refused as the caller's mistake (the
//! operation error, on every entry point and inside a pipeline: no policy starts), then
//! that the injected fault is sticky (the same backend fails on the next frame too) and
//! probes, step by step, what it takes to use the device again; last, that a new backend
//! works on the device afterwards.
//!
//! A `harness = false` target: without a GPU it prints "no GPU: GPU fault drill NOT run
//! (not counted as passed)" and exits 0; on a GPU it exits 1 if any check fails.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use vision_preproc::backend::cpu::CpuBackend;
use vision_preproc::backend::cuda::{CudaBackend, MAX_BATCH_SLOTS};
use vision_preproc::backend::{
    read_elements, Backend, BatchSlot, BatchWork, FrameWork, HostBuffer, Job, PreprocessOp, Queued,
    StageTimes,
};
use vision_preproc::config::{
    BackendChoice, ConvConfig, ConvKernel, DType, GpuFailurePolicy, MemoryMode,
};
// splitmix64, for fresh random frames.
use vision_preproc::pipeline::{conv_op, FailureAction, FaultKind, FaultPlan, GPU_RETRY_ATTEMPTS};
use vision_preproc::rng::SplitMix64 as Rng;
use vision_preproc::{Config, Encoding, Error, ImageView, Pipeline};

/// The crate's result (the tests' own functions return `Result<_, String>`).
type VpResult<T> = vision_preproc::Result<T>;

const TOLERANCES: &str = include_str!("tolerances.json");
/// Frames per scenario; the fault is injected at frame FAULT_AT.
const FRAMES: u64 = 10;
const FAULT_AT: u64 = 4;

struct Frame {
    w: u32,
    h: u32,
    enc: Encoding,
    data: Vec<u8>,
}

impl Frame {
    fn view(&self) -> Result<ImageView<'_>, String> {
        let step = self.w * self.enc.bytes_per_pixel();
        ImageView::with_encoding(self.w, self.h, step, self.enc, false, &self.data)
            .map_err(|e| e.to_string())
    }
}

/// Frame `i`: 1280x720 bgr8, nv12 and yuyv in turn, random bytes.
fn frame(rng: &mut Rng, i: u64) -> Frame {
    let enc = [Encoding::Bgr8, Encoding::Nv12, Encoding::Yuyv][(i % 3) as usize];
    let (w, h) = (1280u32, 720u32);
    let rows = if enc == Encoding::Nv12 { h * 3 / 2 } else { h };
    let n = (w * enc.bytes_per_pixel() * rows) as usize;
    let data = (0..n).map(|_| (rng.next() >> 56) as u8).collect();
    Frame { w, h, enc, data }
}

fn config(policy: GpuFailurePolicy, backend: BackendChoice) -> Config {
    Config {
        network_image_width: 640,
        network_image_height: 480,
        image_mean: vec![0.485, 0.456, 0.406],
        image_stddev: vec![0.229, 0.224, 0.225],
        conv: ConvConfig { kernel: ConvKernel::Gaussian, size: 5, ..ConvConfig::default() },
        backend,
        gpu_failure_policy: policy,
        ..Config::default()
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    read_elements(DType::Float32, b)
}

/// max |a - b| over the tensor, or an error if a NaN or a length differs.
fn max_diff(a: &[u8], b: &[u8]) -> Result<f64, String> {
    if a.len() != b.len() {
        return Err(format!("tensor of {} bytes, CPU's {}", a.len(), b.len()));
    }
    let mut m = 0.0f64;
    for (i, (x, y)) in f32s(a).iter().zip(f32s(b)).enumerate() {
        if x.is_nan() || y.is_nan() {
            return Err(format!("NaN at element {i}"));
        }
        m = m.max(f64::from((x - y).abs()));
    }
    Ok(m)
}

struct Scenario {
    name: &'static str,
    policy: GpuFailurePolicy,
    plan: FaultPlan,
    /// The driver error the reason must name.
    error: &'static str,
    /// Backend of each frame after the fault, and the action expected at FAULT_AT.
    after: &'static str,
    action: Option<FailureAction>,
}

fn tolerance() -> Result<f64, String> {
    let v: serde_json::Value = serde_json::from_str(TOLERANCES).map_err(|e| e.to_string())?;
    let per_l1 = v["conv_float32_abs_per_l1"].as_f64().ok_or("conv_float32_abs_per_l1")?;
    let l1 = conv_op(&config(GpuFailurePolicy::Retry, BackendChoice::Cpu))
        .map_err(|e| e.to_string())?
        .map_or(1.0, |c| c.l1_norm());
    Ok(per_l1 * l1.max(1.0))
}

/// One scenario; Ok(description) or Err(what failed).
fn scenario(s: &Scenario, tol: f64, seed: u64) -> Result<String, String> {
    let cfg = config(s.policy, BackendChoice::Cuda);
    let backend = CudaBackend::open(0, MemoryMode::Auto).map_err(|e| e.to_string())?;
    let mut gpu = Pipeline::new(cfg.clone(), backend).map_err(|e| e.to_string())?;
    gpu.inject_fault(s.plan);
    let mut cpu = Pipeline::new(config(s.policy, BackendChoice::Cpu), Box::new(CpuBackend::new()))
        .map_err(|e| e.to_string())?;
    let mut rng = Rng::new(seed);
    let mut seen = None;
    for i in 1..=FRAMES {
        let f = frame(&mut rng, i);
        let view = f.view()?;
        cpu.process(&view).map_err(|e| format!("frame {i}: CPU: {e}"))?;
        let t = Instant::now();
        let result = gpu.process(&view);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let info = match (result, s.policy) {
            (Err(e @ Error::GpuFailure { .. }), GpuFailurePolicy::Exit) if i == FAULT_AT => {
                println!("  frame {i:2} {:5}: {e}", f.enc.to_string());
                if !e.to_string().contains(s.error) {
                    return Err(format!("exit: the reason does not name the fault: {e}"));
                }
                return Ok(format!("frame {i} ended the run with: {e}"));
            }
            (Err(e), _) => return Err(format!("frame {i}: {e}")),
            (Ok(info), _) => info,
        };
        let name = gpu.backend().name();
        let d = max_diff(gpu.tensor_bytes(), cpu.tensor_bytes())?;
        let mut line = format!(
            "  frame {i:2} {:5}: backend {name:4}, max |gpu - cpu| {d:.2e}, {ms:7.1} ms",
            f.enc.to_string()
        );
        if let Some(g) = &info.gpu_failure {
            line += &format!("\n           GPU failure: {}\n           action: {g}", g.reason);
            seen = Some((i, g.clone()));
        }
        println!("{line}");
        let want = if i < FAULT_AT { "cuda" } else { s.after };
        if name != want {
            return Err(format!("frame {i} ran on {name}, expected {want}"));
        }
        match name {
            "cpu" if d != 0.0 => return Err(format!("frame {i}: CPU fallback differs ({d})")),
            _ if d > tol => return Err(format!("frame {i}: max diff {d:.3e} > tol {tol:.1e}")),
            _ => {}
        }
    }
    match (seen, &s.action) {
        (Some((i, g)), Some(want)) => {
            let action_ok = match (&g.action, want) {
                (
                    FailureAction::RetriesExhausted { attempts: a, .. },
                    FailureAction::RetriesExhausted { attempts: b, .. },
                ) => a == b,
                (a, b) => a == b,
            };
            if i != FAULT_AT || !action_ok {
                return Err(format!(
                    "failure at frame {i} with {:?}, expected frame {FAULT_AT} with {want:?}",
                    g.action
                ));
            }
            if !g.reason.contains(s.error) {
                return Err(format!("the reason does not name the device fault: {}", g.reason));
            }
            Ok(format!("{}", g))
        }
        (seen, want) => Err(format!("failure seen {seen:?}, expected {want:?}")),
    }
}

/// The injected fault is a real, sticky one: the same backend fails on the next frame.
fn sticky(seed: u64) -> Result<String, String> {
    let cfg = config(GpuFailurePolicy::Retry, BackendChoice::Cuda);
    let mut b = CudaBackend::new(0, MemoryMode::Auto).map_err(|e| e.to_string())?;
    let fault = b.inject_fault(FaultKind::Sticky).to_string();
    let f = frame(&mut Rng::new(seed), 0);
    let view = f.view()?;
    let g = vision_preproc::Geometry::resolve(&cfg, f.w, f.h).map_err(|e| e.to_string())?;
    let mut op = vision_preproc::pipeline::preprocess_op(&cfg, &g);
    op.params.set_source(&view);
    let mut out = Vec::new();
    match b.process(FrameWork::new(&view, &op, None), &mut out) {
        Ok(_) => Err(format!("after `{fault}` the same context still works: not sticky")),
        Err(e) => Ok(format!("injected: {fault}\n  next frame on the same backend: {e}")),
    }
}

/// `r` must be the operation error (a caller's mistake), not a device error: returns its
/// message.
/// `job` submitted into `out` ([`Backend::submit_into`]). The caller keeps `out` until
/// the submission is finished (or abandons it first).
fn submit(b: &mut CudaBackend, job: Job<'_, '_>, out: &mut [u8]) -> vision_preproc::Result<Queued> {
    // SAFETY: `out` outlives the submission: the callers finish (or abandon) it before
    // `out` is dropped; a refused job queues nothing.
    unsafe { b.submit_into(job, out.as_mut_ptr(), out.len()) }
}

fn operation_error<T>(r: vision_preproc::Result<T>, what: &str) -> Result<String, String> {
    match r {
        Err(Error::Operation(m)) => Ok(m),
        Err(e) => Err(format!("{what}: {e:?} instead of Error::Operation")),
        Ok(_) => Err(format!("{what}: a wrong operation was accepted")),
    }
}

/// A backend that hands the CUDA backend a wrong operation (another encoding) when told
/// to: what a caller's mistake looks like from inside a pipeline.
struct WrongOp {
    gpu: CudaBackend,
    wrong: Arc<AtomicBool>,
}

impl Backend for WrongOp {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn device_description(&self) -> String {
        self.gpu.device_description()
    }
    fn process_into(&mut self, work: FrameWork<'_, '_>, out: &mut [u8]) -> VpResult<StageTimes> {
        let FrameWork { image, op, conv } = work;
        let mut op = op.clone();
        if self.wrong.load(Ordering::SeqCst) {
            op.params.encoding = Encoding::Rgb8 as u32;
        }
        self.gpu.process_into(FrameWork::new(image, &op, conv), out)
    }
    fn alloc_host(&mut self, len: usize) -> vision_preproc::Result<HostBuffer> {
        self.gpu.alloc_host(len)
    }
}

/// A frame whose operation does not fit it is the caller's mistake on the GPU as on the
/// CPU: `process_into` (heap and pinned destination), `submit_into` of the frame,
/// `process_batch_into` and `submit_into` of the batch (one slot wrong, or more slots
/// than one launch takes) return the operation error, not `Error::Cuda`, queue nothing,
/// and the backend goes on. Through a
/// pipeline with `gpu_failure_policy: exit` the frame's error is that operation error
/// (no policy starts) and the next frame runs on the GPU.
fn wrong_op(seed: u64, tol: f64) -> Result<String, String> {
    let cfg = config(GpuFailurePolicy::Exit, BackendChoice::Cuda);
    let mut b = CudaBackend::new(0, MemoryMode::Auto).map_err(|e| e.to_string())?;
    let f = frame(&mut Rng::new(seed), 0);
    let view = f.view()?;
    let g = vision_preproc::Geometry::resolve(&cfg, f.w, f.h).map_err(|e| e.to_string())?;
    let mut good = vision_preproc::pipeline::preprocess_op(&cfg, &g);
    good.params.set_source(&view);
    let conv = conv_op(&cfg).map_err(|e| e.to_string())?;
    let len = good.params.tensor_desc().byte_len();
    type Change = fn(&mut PreprocessOp);
    let wrong: [(&str, Change); 4] = [
        ("encoding", |op| op.params.encoding = Encoding::Rgb8 as u32),
        ("size", |op| op.params.src_width -= 2),
        ("step", |op| op.params.src_step += 64),
        ("table index", |op| op.x_map.i1[0] = 1280),
    ];
    let (mut heap, mut batch) = (vec![0u8; len], vec![0u8; 2 * len]);
    let mut pinned = b.alloc_host(len).map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    for (name, change) in wrong {
        let mut op = good.clone();
        change(&mut op);
        let what = |call: &str| format!("{call} with a wrong {name}");
        let m = operation_error(
            b.process_into(FrameWork::new(&view, &op, conv.as_ref()), &mut heap),
            &what("process_into"),
        )?;
        let dst = &mut pinned.as_mut_slice()[..len];
        operation_error(
            b.process_into(FrameWork::new(&view, &op, conv.as_ref()), dst),
            &what("process_into (pinned)"),
        )?;
        let frame = Job::Frame(FrameWork::new(&view, &op, None));
        operation_error(submit(&mut b, frame, &mut heap), &what("submit_into"))?;
        let slots = [BatchSlot::frame(&view, &good), BatchSlot::frame(&view, &op)];
        let mb = operation_error(
            b.process_batch_into(BatchWork::new(&slots, conv.as_ref()), &mut batch),
            &what("process_batch_into"),
        )?;
        if !mb.starts_with("batch slot 1: ") {
            return Err(format!(
                "{}: the error does not name the slot: {mb}",
                what("process_batch_into")
            ));
        }
        let job = Job::Batch(BatchWork::new(&slots, conv.as_ref()));
        operation_error(submit(&mut b, job, &mut batch), &what("submit_into (batch)"))?;
        if b.in_flight() != 0 {
            return Err(format!("{}: a refused batch is in flight", what("submit_into (batch)")));
        }
        lines.push(format!("  wrong {name}: {m}"));
    }
    // A batch into a buffer of the wrong length is refused; the batch in flight stays.
    let slots = [BatchSlot::frame(&view, &good); 2];
    let job = || Job::Batch(BatchWork::new(&slots, None));
    submit(&mut b, job(), &mut batch).map_err(|e| format!("submit_into (batch): {e}"))?;
    let mut half = vec![0u8; len];
    let refused = operation_error(submit(&mut b, job(), &mut half), "a batch into half the bytes");
    if b.in_flight() != 1 {
        b.abandon_all();
        return Err("a batch into a wrong buffer dropped the batch in flight".into());
    }
    refused?;
    b.finish_oldest().map_err(|e| format!("finish_oldest after the refusal: {e}"))?;
    let many = vec![BatchSlot::frame(&view, &good); MAX_BATCH_SLOTS + 1];
    let mut out = vec![0u8; many.len() * len];
    let m = operation_error(
        b.process_batch_into(BatchWork::new(&many, None), &mut out),
        "too many slots",
    )?;
    lines.push(format!("  {} slots: {m}", many.len()));
    // The backend goes on.
    b.process_into(FrameWork::new(&view, &good, conv.as_ref()), &mut heap)
        .map_err(|e| e.to_string())?;
    let mut want = vec![0u8; len];
    let mut cpu = CpuBackend::new();
    cpu.process_into(FrameWork::new(&view, &good, conv.as_ref()), &mut want)
        .map_err(|e| e.to_string())?;
    let d = max_diff(&heap, &want)?;
    if d > tol {
        return Err(format!("a good frame after the refused ones: max diff {d:.3e}"));
    }
    // Inside a pipeline with gpu_failure_policy exit.
    let flag = Arc::new(AtomicBool::new(false));
    let backend = WrongOp { gpu: b, wrong: flag.clone() };
    let mut p = Pipeline::new(cfg, Box::new(backend)).map_err(|e| e.to_string())?;
    p.process(&view).map_err(|e| format!("pipeline, good frame: {e}"))?;
    flag.store(true, Ordering::SeqCst);
    let m = operation_error(p.process(&view), "pipeline (policy exit), wrong operation")?;
    flag.store(false, Ordering::SeqCst);
    let info = p.process(&view).map_err(|e| format!("pipeline, the frame after: {e}"))?;
    if info.gpu_failure.is_some() || p.backend().name() != "cuda" {
        return Err(format!("a failure policy ran: {:?}", info.gpu_failure));
    }
    let d = max_diff(p.tensor_bytes(), &want)?;
    if d > tol {
        return Err(format!("pipeline, the frame after: max diff {d:.3e}"));
    }
    lines.push(format!("  pipeline (policy exit): {m}; the next frame on cuda, max diff {d:.2e}"));
    Ok(format!("every wrong operation refused as such:\n{}", lines.join("\n")))
}

/// What it takes to use the device again after a sticky fault, step by step: a new
/// primary context (retained again once every reference is gone), a non-primary
/// context, a new `CudaBackend` (what `retry` does) with a frame compared with the CPU.
fn probe(seed: u64, tol: f64) -> Result<String, String> {
    let mut b = CudaBackend::new(0, MemoryMode::Auto).map_err(|e| e.to_string())?;
    let fault = b.inject_fault(FaultKind::Sticky).to_string();
    drop(b);
    let mut lines = vec![format!("injected, backend dropped: {fault}")];
    match cudarc::driver::CudaContext::new(0) {
        Ok(_) => lines.push("  plain primary context again: works".into()),
        Err(e) => lines.push(format!("  plain primary context again: {e:?}")),
    }
    match cudarc::driver::CudaContext::new_non_primary(0, 0) {
        Ok(c) => {
            let s = c.new_stream().and_then(|s| s.alloc_zeros::<u8>(64).map(|_| ()));
            lines.push(format!("  non-primary context: created; stream+alloc: {s:?}"));
        }
        Err(e) => lines.push(format!("  non-primary context: {e:?}")),
    }
    let reopened = CudaBackend::open(0, MemoryMode::Auto).and_then(|b| {
        let cfg = config(GpuFailurePolicy::Retry, BackendChoice::Cuda);
        let mut p = Pipeline::new(cfg, b)?;
        let f = frame(&mut Rng::new(seed ^ 3), 2);
        let view = f.view().map_err(vision_preproc::Error::Operation)?;
        p.process(&view)?;
        let mut cpu = Pipeline::new(
            config(GpuFailurePolicy::Retry, BackendChoice::Cpu),
            Box::new(CpuBackend::new()),
        )?;
        cpu.process(&view)?;
        max_diff(p.tensor_bytes(), cpu.tensor_bytes()).map_err(vision_preproc::Error::Operation)
    });
    match reopened {
        Ok(d) if d <= tol => {
            lines.push(format!("  CudaBackend::open: a frame max |gpu - cpu| {d:.2e}"));
            lines.push(REOPEN_WORKS.into());
        }
        Ok(d) => return Err(format!("{}\n  reopened, but max diff {d:.3e}", lines.join("\n"))),
        Err(e) => {
            lines.push(format!("  CudaBackend::open (what retry does): {e}"));
            lines.push(REOPEN_FAILS.into());
        }
    }
    Ok(lines.join("\n"))
}

fn gpu_present() -> bool {
    // SAFETY: only tries to dlopen libcuda.
    let lib = unsafe { cudarc::driver::sys::is_culib_present() };
    lib && cudarc::driver::result::init().is_ok()
        && cudarc::driver::result::device::get_count().is_ok_and(|n| n > 0)
}

const ILLEGAL: &str = "CUDA_ERROR_ILLEGAL_ADDRESS";
const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";
/// Printed by the probe: whether a new `CudaBackend` works after a sticky fault.
const REOPEN_WORKS: &str = "reopen after a sticky fault: works";
const REOPEN_FAILS: &str = "reopen after a sticky fault: fails";

fn scenarios(reopen_works: bool) -> Vec<Scenario> {
    let sticky_once = FaultPlan::once(FAULT_AT, FaultKind::Sticky);
    vec![
        Scenario {
            name: "fallback (sticky fault)",
            policy: GpuFailurePolicy::Fallback,
            plan: sticky_once,
            error: ILLEGAL,
            after: "cpu",
            action: Some(FailureAction::FellBack),
        },
        Scenario {
            name: "retry (transient fault: out of memory)",
            policy: GpuFailurePolicy::Retry,
            plan: FaultPlan::once(FAULT_AT, FaultKind::Transient),
            error: OOM,
            after: "cuda",
            action: Some(FailureAction::Rebuilt { attempt: 1 }),
        },
        // What the probe found decides what retry can do after a sticky fault: rebuild
        // (the reset worked) or use up its attempts and fall back.
        Scenario {
            name: "retry (sticky fault: illegal address)",
            policy: GpuFailurePolicy::Retry,
            plan: sticky_once,
            error: ILLEGAL,
            after: if reopen_works { "cuda" } else { "cpu" },
            action: Some(if reopen_works {
                FailureAction::Rebuilt { attempt: 1 }
            } else {
                FailureAction::RetriesExhausted {
                    attempts: GPU_RETRY_ATTEMPTS,
                    last_error: String::new(),
                }
            }),
        },
        Scenario {
            name: "retry (GPU stays broken)",
            policy: GpuFailurePolicy::Retry,
            plan: FaultPlan::from(FAULT_AT, FaultKind::Sticky),
            error: ILLEGAL,
            after: "cpu",
            action: Some(FailureAction::RetriesExhausted {
                attempts: GPU_RETRY_ATTEMPTS,
                last_error: String::new(),
            }),
        },
        Scenario {
            name: "exit (sticky fault)",
            policy: GpuFailurePolicy::Exit,
            plan: sticky_once,
            error: ILLEGAL,
            after: "cuda",
            action: None,
        },
    ]
}

/// A new backend works on the device (run in a fresh process after the drill).
fn healthy(seed: u64, tol: f64) -> Result<String, String> {
    let cfg = config(GpuFailurePolicy::Retry, BackendChoice::Cuda);
    let b = CudaBackend::open(0, MemoryMode::Auto).map_err(|e| e.to_string())?;
    let desc = b.device_description();
    let mut p = Pipeline::new(cfg, b).map_err(|e| e.to_string())?;
    let f = frame(&mut Rng::new(seed ^ 7), 1);
    p.process(&f.view()?).map_err(|e| e.to_string())?;
    let mut cpu = Pipeline::new(
        config(GpuFailurePolicy::Retry, BackendChoice::Cpu),
        Box::new(CpuBackend::new()),
    )
    .map_err(|e| e.to_string())?;
    cpu.process(&f.view()?).map_err(|e| e.to_string())?;
    let d = max_diff(p.tensor_bytes(), cpu.tensor_bytes())?;
    if d > tol {
        return Err(format!("max diff {d:.3e}"));
    }
    Ok(format!("new backend on {desc}: max |gpu - cpu| {d:.2e}"))
}

/// One check, in this process: `--child NAME [reopen-works|reopen-fails]`.
fn child(args: &[String]) -> ExitCode {
    let seed = std::env::var("VP_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let name = args.first().map(String::as_str).unwrap_or("");
    let reopen_works = args.get(1).is_some_and(|a| a == "reopen-works");
    let r = tolerance().and_then(|tol| match name {
        "sticky" => sticky(seed),
        "wrong-op" => wrong_op(seed, tol),
        "probe" => probe(seed, tol),
        "healthy" => healthy(seed, tol),
        _ => {
            let all = scenarios(reopen_works);
            let k = name.strip_prefix("scenario-").and_then(|k| k.parse::<usize>().ok());
            match k.and_then(|k| all.get(k).map(|s| (k, s))) {
                Some((k, s)) => {
                    println!(
                        "---- {} (gpu_failure_policy {:?}, {:?}) ----",
                        s.name, s.policy, s.plan
                    );
                    let t = Instant::now();
                    scenario(s, tol, seed.wrapping_add(k as u64 + 1))
                        .map(|m| format!("{m} ({:.2} s)", t.elapsed().as_secs_f64()))
                }
                None => Err(format!("unknown check {name:?}")),
            }
        }
    });
    match r {
        Ok(m) => {
            println!("ok   {name}: {m}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("FAIL {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Every check's case name (what `--child`, `--list` and `--filter` take) and what it
/// checks; the scenarios as the probe's answer `reopen_works` makes them.
fn cases(reopen_works: bool) -> Vec<(String, String)> {
    let mut all = vec![
        ("wrong-op".to_string(), "operations that do not fit their frame are refused".into()),
        ("sticky".to_string(), "a sticky fault fails every later call".into()),
        ("probe".to_string(), "whether a context reopens after a sticky fault".into()),
    ];
    for (k, sc) in scenarios(reopen_works).iter().enumerate() {
        all.push((format!("scenario-{k}"), sc.name.to_string()));
    }
    all.push(("healthy".to_string(), "the policy never acts without a fault".into()));
    all
}

/// Every check in its own process: after a sticky fault, CUDA documents that "the
/// process must be terminated and relaunched", so one check's fault must not decide the
/// next one's start. `--list`: the case names (no GPU needed); `--filter SUBSTR`: only
/// the cases whose name or description contains it (the probe runs whenever a scenario
/// does: it decides what they expect).
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(&args[i + 1..]);
    }
    let filter = (args.iter().position(|a| a == "--filter"))
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    let selected =
        |(name, what): &(String, String)| name.contains(&filter) || what.contains(&filter);
    if args.iter().any(|a| a == "--list") {
        for (name, what) in cases(true).iter().filter(|c| selected(c)) {
            println!("{name}: {what}");
        }
        return ExitCode::SUCCESS;
    }
    if !gpu_present() {
        println!("no GPU: GPU fault drill NOT run (not counted as passed)");
        return ExitCode::SUCCESS;
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let tol = tolerance().unwrap_or(f64::NAN);
    println!(
        "gpu_fault: seed {seed}; 1280x720 bgr8/nv12/yuyv -> 640x480 letterbox + gaussian 5, \
         float32 NCHW; fault at frame {FAULT_AT} of {FRAMES}; tol {tol:.1e} on the GPU, \
         exact on the CPU; each check in its own process"
    );
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            println!("FAIL: own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut passed, mut failed) = (0, 0);
    let mut run = |args: &[&str]| -> String {
        let name = args[0];
        let out = std::process::Command::new(&exe)
            .arg("--child")
            .args(args)
            .env("VP_FAULT_SEED", seed.to_string())
            .output();
        match out {
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stdout).to_string()
                    + &String::from_utf8_lossy(&o.stderr);
                print!("{text}");
                if o.status.success() {
                    passed += 1;
                } else {
                    failed += 1;
                    println!(
                        "FAIL case {name} (exit status {}): rerun it alone with --filter {name}",
                        o.status
                    );
                }
                text
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {args:?}: starting the check: {e}");
                String::new()
            }
        }
    };
    let chosen: Vec<String> =
        cases(true).into_iter().filter(|c| selected(c)).map(|(name, _)| name).collect();
    let scenario = |n: &String| n.starts_with("scenario-");
    let mut reopen_works = true;
    for name in &cases(true) {
        let name = &name.0;
        let probe_needed = name == "probe" && chosen.iter().any(scenario);
        if !chosen.contains(name) && !probe_needed {
            continue;
        }
        if scenario(name) {
            let arg = if reopen_works { "reopen-works" } else { "reopen-fails" };
            run(&[name, arg]);
        } else {
            let out = run(&[name]);
            if name == "probe" {
                reopen_works = out.contains(REOPEN_WORKS);
            }
        }
    }
    println!("gpu_fault summary: {passed} passed, {failed} FAILED");
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
