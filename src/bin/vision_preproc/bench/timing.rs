//! How the benchmark times: CUDA events around each iteration after a warm-up, on fresh
//! buffers; and what it records per figure (statistics, ledger bytes, achieved GB/s,
//! kernel resources).

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, DevicePtr, LaunchConfig};
use serde::Serialize;
use vision_preproc::backend::cuda::CudaBackend;
use vision_preproc::error::CudaError;
use vision_preproc::percentile::Summary;

/// Orin Nano DRAM bandwidth: the datasheet's 68 GB/s and the 31 GB/s that kernels
/// achieved in the Orin measurement of docs/GPU.md.
pub const ORIN_GBPS: [f64; 2] = [68.0, 31.0];

/// A driver error with what was being done.
pub fn drv(call: impl Into<String>, e: impl std::fmt::Debug) -> CudaError {
    CudaError::driver(call, format!("{e:?}"))
}

/// One timed figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// Frame size case (`1280x720 rgb8 -> 640x480 stretch`).
    pub case: String,
    /// What was timed (`fused`, `three-kernel`, `upload`, ...).
    pub figure: String,
    /// `events` or `wall clock` (the full frame includes CPU copies).
    pub timing: &'static str,
    /// Timed iterations.
    pub iterations: usize,
    /// Mean, microseconds.
    pub mean_us: f64,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Bytes through DRAM per iteration from the ledger.
    pub ledger_bytes: u64,
    /// ledger_bytes / p50.
    pub gbps: f64,
    /// gbps / the device-to-device copy bandwidth measured in this run.
    pub pct_copy_roof: f64,
    /// Kernels launched per iteration.
    pub kernels: Vec<String>,
    /// Resident blocks per SM of each kernel (occupancy API), with its block size.
    pub blocks_per_sm: Vec<u32>,
    /// Threads per block of each kernel.
    pub threads_per_block: Vec<u32>,
    /// Registers per thread of each kernel.
    pub registers: Vec<i32>,
    /// Dynamic + static shared memory per block of each kernel, bytes.
    pub smem_bytes: Vec<u32>,
    /// ledger_bytes at 68 GB/s, microseconds.
    pub orin_68gbps_us: f64,
    /// ledger_bytes at 31 GB/s, microseconds.
    pub orin_31gbps_us: f64,
}

/// A kernel's resources for the table.
#[derive(Clone)]
pub struct KernelInfo {
    name: String,
    blocks: u32,
    threads: u32,
    regs: i32,
    smem: u32,
}

/// Occupancy, registers and shared memory of kernel `f` launched as `cfg`.
pub fn kernel_info(
    f: &CudaFunction,
    name: &str,
    cfg: &LaunchConfig,
) -> Result<KernelInfo, CudaError> {
    let threads = cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2;
    let blocks = f
        .occupancy_max_active_blocks_per_multiprocessor(
            threads,
            cfg.shared_mem_bytes as usize,
            None,
        )
        .map_err(|e| drv(format!("occupancy of {name}"), e))?;
    let regs = f.num_regs().map_err(|e| drv(format!("registers of {name}"), e))?;
    let st = f.shared_size_bytes().map_err(|e| drv(format!("shared memory of {name}"), e))?;
    Ok(KernelInfo {
        name: name.into(),
        blocks,
        threads,
        regs,
        smem: cfg.shared_mem_bytes + st.max(0) as u32,
    })
}

/// The device address of `s`.
pub fn ptr(s: &CudaSlice<u8>, b: &CudaBackend) -> CUdeviceptr {
    let (p, _no_tracking) = s.device_ptr(b.stream());
    p
}

/// The backend under test, the timing settings and what has been measured so far.
pub struct Bench<'a> {
    /// The backend whose kernels and stream are timed.
    pub b: &'a mut CudaBackend,
    /// Untimed iterations before each figure.
    pub warmup: usize,
    /// Timed iterations per figure.
    pub iters: usize,
    /// The device-to-device copy bandwidth of this run (read + write), GB/s.
    pub roof_gbps: f64,
    /// Every figure, in order.
    pub figures: Vec<Figure>,
    /// Sanity checks and comparisons, one line each.
    pub notes: Vec<String>,
}

impl Bench<'_> {
    /// A zeroed device buffer of `n` bytes (at least 4).
    pub fn alloc(&self, n: usize, what: &str) -> Result<CudaSlice<u8>, CudaError> {
        self.b
            .stream()
            .alloc_zeros::<u8>(n.max(4))
            .map_err(|e| drv(format!("allocating {n} bytes for {what}"), e))
    }

    /// Copy `data` to the start of `dst` (synchronous on the stream).
    pub fn upload(&self, dst: &mut CudaSlice<u8>, data: &[u8]) -> Result<(), CudaError> {
        self.b
            .stream()
            .memcpy_htod(data, &mut dst.slice_mut(..data.len()))
            .map_err(|e| drv("uploading bench data", e))
    }

    /// Copy the first `out.len()` bytes of `src` into `out`.
    pub fn download(&self, src: &CudaSlice<u8>, out: &mut [u8]) -> Result<(), CudaError> {
        self.b
            .stream()
            .memcpy_dtoh(&src.slice(..out.len()), out)
            .map_err(|e| drv("bench readback", e))
    }

    /// Time `body(i)` with a pair of timing events around each of `iters` runs (after
    /// `warmup` untimed runs); microseconds.
    pub fn time(
        &self,
        iters: usize,
        mut body: impl FnMut(usize) -> Result<(), CudaError>,
    ) -> Result<Vec<f64>, CudaError> {
        for i in 0..self.warmup {
            body(i)?;
        }
        let stream = self.b.stream();
        let ev = || {
            self.b
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| drv("cuEventCreate", e))
        };
        let mut pairs: Vec<(CudaEvent, CudaEvent)> = Vec::with_capacity(iters);
        for _ in 0..iters {
            pairs.push((ev()?, ev()?));
        }
        for (i, (a, z)) in pairs.iter().enumerate() {
            a.record(stream).map_err(|e| drv("cuEventRecord", e))?;
            body(self.warmup + i)?;
            z.record(stream).map_err(|e| drv("cuEventRecord", e))?;
        }
        stream.synchronize().map_err(|e| drv("running the timed iterations", e))?;
        pairs
            .iter()
            .map(|(a, z)| {
                a.elapsed_ms(z)
                    .map(|ms| f64::from(ms) * 1e3)
                    .map_err(|e| drv("cuEventElapsedTime", e))
            })
            .collect()
    }

    /// Record a figure of `times` (microseconds) moving `ledger` bytes through DRAM per
    /// iteration, with the resources of its kernels; returns its statistics.
    pub fn push(
        &mut self,
        case: &str,
        figure: &str,
        timing: &'static str,
        times: Vec<f64>,
        ledger: u64,
        ks: &[KernelInfo],
    ) -> Summary {
        let n = times.len();
        let s = Summary::of(&times).unwrap_or(Summary { mean: 0.0, min: 0.0, p50: 0.0, p99: 0.0 });
        let gbps = ledger as f64 / (s.p50 * 1e-6) / 1e9;
        self.figures.push(Figure {
            case: case.into(),
            figure: figure.into(),
            timing,
            iterations: n,
            mean_us: s.mean,
            p50_us: s.p50,
            p99_us: s.p99,
            ledger_bytes: ledger,
            gbps,
            pct_copy_roof: 100.0 * gbps / self.roof_gbps,
            kernels: ks.iter().map(|k| k.name.clone()).collect(),
            blocks_per_sm: ks.iter().map(|k| k.blocks).collect(),
            threads_per_block: ks.iter().map(|k| k.threads).collect(),
            registers: ks.iter().map(|k| k.regs).collect(),
            smem_bytes: ks.iter().map(|k| k.smem).collect(),
            orin_68gbps_us: ledger as f64 / (ORIN_GBPS[0] * 1e3),
            orin_31gbps_us: ledger as f64 / (ORIN_GBPS[1] * 1e3),
        });
        s
    }
}

/// Largest |a - b| between two float32 little-endian buffers of the same length.
pub fn max_abs_diff_f32(a: &[u8], b: &[u8]) -> f32 {
    a.chunks_exact(4)
        .zip(b.chunks_exact(4))
        .map(|(x, y)| {
            (f32::from_le_bytes([x[0], x[1], x[2], x[3]])
                - f32::from_le_bytes([y[0], y[1], y[2], y[3]]))
            .abs()
        })
        .fold(0.0f32, f32::max)
}
