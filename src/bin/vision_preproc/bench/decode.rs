//! `vision_preproc bench-decode FILE.jpg` (hidden, cargo feature `bench`): the decode of
//! one JPEG per camera, per set of 1 or N cameras, by the CPU decoder (`compressed::decode`,
//! zune-jpeg: one thread decoding the set's frames one after the other, and rayon's pool
//! decoding them side by side) and by nvJPEG (`backend/cuda/nvjpeg.rs`: the decoder the
//! backend uses, hardware where the GPU has one, and its hybrid backend alone, as on a GPU
//! without one), each frame into device memory for nvJPEG.
//!
//! Each figure: `warmup` untimed sets, then `iterations` timed sets; the wall time of a set
//! from the first call until its pixels are complete (nvJPEG: the stream synchronized),
//! p50/p99, and per frame (the set's time / N); for nvJPEG also the time the calling
//! thread spends inside `decode_batch` (host work: parsing, the hybrid backend's Huffman
//! decode). Before the table, each set size's first set on a decoder just opened, without
//! and after `NvJpeg::warm_up` (what the node does at start). The last line is the target
//! of issue 35: nvJPEG's N-camera set over its 1-camera set (<= 2).

use anyhow::{bail, Context, Result};
use clap::Args;
use cudarc::driver::{CudaContext, CudaSlice, DevicePtr};
use rayon::prelude::*;
use std::path::PathBuf;
use std::time::Instant;
use vision_preproc::backend::cuda::nvjpeg::{DecodeItem, NvJpeg, NvJpegOptions};
use vision_preproc::compressed::{decode, Limits};
use vision_preproc::percentile::Summary;
use vision_preproc::Encoding;

/// Arguments of `bench-decode`.
#[derive(Args, Debug)]
pub struct BenchDecodeArgs {
    /// The JPEG (each camera of a set decodes its own copy of it).
    pub file: PathBuf,
    /// Camera counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub cameras: Vec<usize>,
    /// Timed sets per figure.
    #[arg(long, default_value_t = 200)]
    pub iterations: usize,
    /// Untimed sets first.
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

/// Wall time of each timed set and the host time inside the decode call, milliseconds.
struct Times {
    set: Vec<f64>,
    host: Vec<f64>,
}

fn time(args: &BenchDecodeArgs, mut one: impl FnMut() -> Result<f64>) -> Result<Times> {
    let mut t = Times { set: Vec::new(), host: Vec::new() };
    for i in 0..args.warmup + args.iterations {
        let start = Instant::now();
        let host = one()?;
        let set = start.elapsed().as_secs_f64() * 1e3;
        if i >= args.warmup {
            t.set.push(set);
            t.host.push(host);
        }
    }
    Ok(t)
}

/// The GPU side of the benchmark: a context, a stream, one device buffer per camera and the
/// two nvJPEG decoders.
struct Gpu {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    _bufs: Vec<CudaSlice<u8>>,
    ptrs: Vec<u64>,
    decoders: Vec<(&'static str, NvJpeg)>,
}

impl Gpu {
    /// Open device `args.device`, its buffers for `max_n` cameras and both decoders, and
    /// check the decoded `jpeg` against the CPU decoder's `cpu` once.
    fn open(
        args: &BenchDecodeArgs,
        jpeg: &[u8],
        cpu: &vision_preproc::compressed::Decoded,
        max_n: usize,
    ) -> Result<Gpu> {
        let v = cpu.view();
        let grey = v.encoding() == Encoding::Mono8;
        let (width, height, row) = (v.width(), v.height(), v.step() as usize);
        let ctx = CudaContext::new(args.device).context("creating the CUDA context")?;
        let stream = ctx.new_stream().context("creating a stream")?;
        println!("GPU: {}", ctx.name().unwrap_or_default());
        let bufs: Vec<CudaSlice<u8>> = (0..max_n)
            .map(|_| stream.alloc_zeros::<u8>(row * height as usize))
            .collect::<Result<_, _>>()
            .context("device buffers")?;
        let ptrs: Vec<u64> = bufs.iter().map(|b| b.device_ptr(&stream).0).collect();
        let mut decoders: Vec<(&'static str, NvJpeg)> = Vec::new();
        for (label, options) in [
            ("nvJPEG (backend's)", NvJpegOptions::default()),
            ("nvJPEG hybrid only", NvJpegOptions { hardware: false, ..Default::default() }),
        ] {
            let nv =
                NvJpeg::open_with(&ctx, options).with_context(|| format!("opening {label}"))?;
            println!("{label}: {}", nv.describe());
            decoders.push((label, nv));
        }

        // The decoded frame against the CPU's, once (the same JPEG, the same device buffer).
        {
            let (_, nv) = &mut decoders[0];
            let item = DecodeItem { jpeg, width, height, grey, dst: ptrs[0], pitch: row };
            // SAFETY: the buffer holds row * height bytes and `jpeg` lives until the stream is
            // synchronized below.
            let r = unsafe { nv.decode_batch(&stream, &[item]) };
            stream.synchronize().context("synchronizing")?;
            let r = r.context("nvJPEG decode")?;
            let px = stream.clone_dtoh(&bufs[0]).context("download")?;
            let (max, over) = px.iter().zip(v.data()).fold((0u8, 0usize), |(m, n), (a, b)| {
                (m.max(a.abs_diff(*b)), n + usize::from(a.abs_diff(*b) > 1))
            });
            println!(
                "check: {:?}; |nvJPEG - CPU| max {max}, {:.3}% of samples off by more than 1",
                r.routes,
                100.0 * over as f64 / px.len() as f64
            );
        }
        Ok(Gpu { stream, _bufs: bufs, ptrs, decoders })
    }

    /// The first set of `n` on a decoder just opened (the backend's options): without
    /// and after [`NvJpeg::warm_up`] for sets of up to `n`, each on a fresh decoder.
    /// Prints the warm-up's time and each first set's (until its pixels are complete).
    fn first_sets<'j>(&self, n: usize, item: &dyn Fn(u64) -> DecodeItem<'j>) -> Result<()> {
        let items: Vec<DecodeItem> = self.ptrs[..n].iter().map(|&p| item(p)).collect();
        let mut line = format!("first set of {n}:");
        for warm in [false, true] {
            let mut nv = NvJpeg::open(self.stream.context()).context("opening nvJPEG")?;
            if warm {
                let start = Instant::now();
                nv.warm_up(&self.stream, n).context("nvJPEG warm-up")?;
                line +=
                    &format!(" warm_up({n}) {:.1} ms, then", start.elapsed().as_secs_f64() * 1e3);
            }
            let start = Instant::now();
            // SAFETY: each buffer holds row * height bytes, one per item, and nothing
            // else uses them; the JPEG lives until the stream is synchronized below.
            let r = unsafe { nv.decode_batch(&self.stream, &items) };
            self.stream.synchronize().context("synchronizing")?;
            r.context("nvJPEG decode")?;
            line += &format!(
                " {} {:.2} ms;",
                if warm { "first set" } else { "cold" },
                start.elapsed().as_secs_f64() * 1e3
            );
        }
        println!("{line}");
        Ok(())
    }

    /// Each decoder with what it decodes with: (label, decoder, stream, device buffers).
    fn decoders(
        &mut self,
    ) -> impl Iterator<Item = (&'static str, &mut NvJpeg, &cudarc::driver::CudaStream, &[u64])>
    {
        let (stream, ptrs) = (&*self.stream, &self.ptrs[..]);
        self.decoders.iter_mut().map(move |(label, nv)| (*label, nv, stream, ptrs))
    }
}

/// Run `bench-decode`.
pub fn run(args: BenchDecodeArgs) -> Result<()> {
    let jpeg =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let cpu = decode("jpeg", &jpeg, &Limits::default()).context("the CPU decoder")?;
    let v = cpu.view();
    let grey = v.encoding() == Encoding::Mono8;
    let (width, height, row) = (v.width(), v.height(), v.step() as usize);
    println!(
        "bench-decode: {} ({} bytes, {width}x{height} {}), {} timed sets after {} warm-up, \
         rayon pool {} threads",
        args.file.display(),
        jpeg.len(),
        v.encoding().name(),
        args.iterations,
        args.warmup,
        rayon::current_num_threads()
    );
    let max_n = args.cameras.iter().copied().max().unwrap_or(1);
    if max_n == 0 {
        bail!("--cameras: counts of at least 1");
    }
    // Without a GPU (no libcuda: cudarc would panic on its first call) the CPU rows alone.
    // SAFETY: only tries to dlopen libcuda; no symbol is called.
    let mut gpu = if unsafe { cudarc::driver::sys::is_culib_present() } {
        Some(Gpu::open(&args, &jpeg, &cpu, max_n)?)
    } else {
        println!("GPU: none (libcuda.so could not be loaded): the CPU decoder's rows alone");
        None
    };
    // Each camera's JPEG into its device buffer at `dst`.
    let item = |dst: u64| DecodeItem { jpeg: &jpeg, width, height, grey, dst, pitch: row };
    if let Some(gpu) = &gpu {
        for &n in &args.cameras {
            gpu.first_sets(n, &item)?;
        }
    }
    println!(
        "\n{:<22} {:>7} {:>12} {:>12} {:>14} {:>14}",
        "decoder", "cameras", "set p50 ms", "set p99 ms", "per frame p50", "host call p50"
    );
    let mut nvjpeg_sets = Vec::new();
    for &n in &args.cameras {
        let rows = rows(&args, n, &jpeg, gpu.as_mut(), &item, &mut nvjpeg_sets)?;
        print_rows(n, &rows);
    }
    for (label, nv, ..) in gpu.iter_mut().flat_map(Gpu::decoders) {
        println!("{label}: decoded {:?}", nv.counts());
    }
    print_ratio(&nvjpeg_sets);
    Ok(())
}

/// The figures of sets of `n` cameras: the CPU decoder on one thread (and, for 2+, on
/// rayon's pool), then each nvJPEG decoder; the backend's decoder's set p50 is added to
/// `nvjpeg_sets` (once per camera count).
fn rows<'j>(
    args: &BenchDecodeArgs,
    n: usize,
    jpeg: &[u8],
    gpu: Option<&mut Gpu>,
    item: &dyn Fn(u64) -> DecodeItem<'j>,
    nvjpeg_sets: &mut Vec<(usize, f64)>,
) -> Result<Vec<(String, Times)>> {
    let mut rows: Vec<(String, Times)> = Vec::new();
    let cpu1 = time(args, || {
        for _ in 0..n {
            std::hint::black_box(decode("jpeg", jpeg, &Limits::default())?);
        }
        Ok(0.0)
    })?;
    rows.push(("CPU, 1 thread".into(), cpu1));
    if n > 1 {
        let pool = time(args, || {
            (0..n).into_par_iter().try_for_each(|_| {
                std::hint::black_box(decode("jpeg", jpeg, &Limits::default())?);
                Ok::<_, anyhow::Error>(())
            })?;
            Ok(0.0)
        })?;
        rows.push(("CPU, rayon pool".into(), pool));
    }
    for (label, nv, stream, ptrs) in gpu.into_iter().flat_map(Gpu::decoders) {
        let items: Vec<DecodeItem> = ptrs[..n].iter().map(|&dst| item(dst)).collect();
        let t = time(args, || {
            let start = Instant::now();
            // SAFETY: each buffer holds row * height bytes, one per item, and nothing
            // else uses them; `jpeg` lives until the stream is synchronized below.
            let r = unsafe { nv.decode_batch(stream, &items) };
            let host = start.elapsed().as_secs_f64() * 1e3;
            stream.synchronize().context("synchronizing")?;
            r.context("nvJPEG decode")?;
            Ok(host)
        })?;
        if nvjpeg_sets.len() < args.cameras.len() && label.starts_with("nvJPEG (backend") {
            nvjpeg_sets.push((n, Summary::of(&t.set).map_or(f64::NAN, |s| s.p50)));
        }
        rows.push((label.to_string(), t));
    }
    Ok(rows)
}

/// The table's lines of sets of `n` cameras.
fn print_rows(n: usize, rows: &[(String, Times)]) {
    for (label, t) in rows {
        let (Some(s), Some(h)) = (Summary::of(&t.set), Summary::of(&t.host)) else {
            continue;
        };
        let host = if label.starts_with("nvJPEG") { format!("{:.3}", h.p50) } else { "-".into() };
        println!(
            "{label:<22} {n:>7} {:>12.3} {:>12.3} {:>14.3} {:>14}",
            s.p50,
            s.p99,
            s.p50 / n as f64,
            host
        );
    }
}

/// The last line: nvJPEG's largest set over its 1-camera set (issue 35's target, <= 2).
fn print_ratio(nvjpeg_sets: &[(usize, f64)]) {
    if let (Some(&(1, one)), Some(&(n, many))) =
        (nvjpeg_sets.iter().find(|(n, _)| *n == 1), nvjpeg_sets.iter().max_by_key(|(n, _)| *n))
    {
        if n > 1 {
            println!(
                "ratio: nvJPEG (backend's) {n}-camera set / 1-camera set = {:.2} (target <= 2): {}",
                many / one,
                if many / one <= 2.0 { "met" } else { "NOT met" }
            );
        }
    }
}
