//! `vision_preproc run-file`: one image file through the pipeline, the tensor to `.npy`
//! and, optionally, a preview PNG of what the network sees.

use crate::input::{load_image, ConfigArgs, CpuSimd, RawArgs};
use anyhow::{Context, Result};
use clap::Args;
use npyz::WriterBuilder;
use std::path::{Path, PathBuf};
use vision_preproc::backend::{read_elements, TensorDesc};
use vision_preproc::config::DType;
use vision_preproc::pipeline::select_backend;
use vision_preproc::Pipeline;

/// Arguments of `run-file`.
#[derive(Args, Debug)]
pub struct RunFileArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub raw: RawArgs,
    /// The image: PNG or JPEG (grey, grey16, RGB, RGBA, RGB16), or raw bytes with --raw.
    pub image: PathBuf,
    /// Where to write the tensor (.npy, shape in layout order with batch 1, little-endian
    /// float32 or float16).
    #[arg(short = 'o', long = "output", value_name = "OUT.npy")]
    pub output: PathBuf,
    /// Also write a PNG of the network image, de-normalized to 8-bit (letterbox padding
    /// shown as is; RGB or grey).
    #[arg(long, value_name = "OUT.png")]
    pub preview: Option<PathBuf>,
    /// The CPU backend's inner loops: `auto` (AVX2 or NEON when the CPU has them) or
    /// `baseline` (the portable loops, same values; implies the CPU backend).
    #[arg(long, value_enum, default_value_t = CpuSimd::Auto)]
    pub cpu_simd: CpuSimd,
}

/// Run `run-file`.
pub fn run(args: RunFileArgs) -> Result<()> {
    let cfg = args.config.load()?;
    let img = load_image(&args.image, &args.raw)?;
    let view = img.view().with_context(|| format!("image {}", args.image.display()))?;
    let backend: Box<dyn vision_preproc::backend::Backend> = if args.cpu_simd == CpuSimd::Auto {
        let (backend, fallback) = select_backend(&cfg)?;
        if let Some(reason) = fallback {
            eprintln!("note: using the CPU backend ({reason})");
        }
        backend
    } else {
        Box::new(args.cpu_simd.backend())
    };
    let mut pipeline = Pipeline::new(cfg, backend)?;
    let info =
        pipeline.process(&view).with_context(|| format!("processing {}", args.image.display()))?;
    write_npy(&args.output, &info.desc, pipeline.tensor_bytes())?;
    let g = &info.geometry;
    println!(
        "{}: {}x{} {} -> {} {} {:?} (content x {} y {} w {} h {}; network = source * ({:.6}, {:.6}) + ({:.3}, {:.3})); {} backend, {:.3} ms",
        args.output.display(),
        view.width(),
        view.height(),
        view.encoding(),
        info.desc.dtype.name(),
        info.desc.layout.name(),
        info.desc.shape(),
        g.content.x,
        g.content.y,
        g.content.w,
        g.content.h,
        g.scale_x,
        g.scale_y,
        g.offset_x,
        g.offset_y,
        pipeline.backend().name(),
        (info.times.upload_us + info.times.preprocess_us + info.times.conv_us + info.times.download_us)
            / 1000.0,
    );
    if let Some(path) = &args.preview {
        let p = pipeline.preview_image()?;
        let color = if p.channels == 3 {
            image::ExtendedColorType::Rgb8
        } else {
            image::ExtendedColorType::L8
        };
        image::save_buffer(path, &p.data, p.width, p.height, color)
            .with_context(|| format!("writing preview {}", path.display()))?;
        println!("{}: preview {}x{}", path.display(), p.width, p.height);
    }
    Ok(())
}

/// Write the tensor bytes (little-endian `desc.dtype`) as a `.npy` array of
/// `desc.shape()`.
pub fn write_npy(path: &Path, desc: &TensorDesc, bytes: &[u8]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let shape: Vec<u64> = desc.shape().iter().map(|&d| u64::from(d)).collect();
    let ctx = || format!("writing {}", path.display());
    match desc.dtype {
        DType::Float32 => {
            let mut w = npyz::WriteOptions::<f32>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut out)
                .begin_nd()
                .with_context(ctx)?;
            w.extend(read_elements(desc.dtype, bytes)).with_context(ctx)?;
            w.finish().with_context(ctx)?;
        }
        DType::Float16 => {
            let mut w = npyz::WriteOptions::<half::f16>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut out)
                .begin_nd()
                .with_context(ctx)?;
            // float16 -> f32 -> float16 is exact.
            w.extend(read_elements(desc.dtype, bytes).into_iter().map(half::f16::from_f32))
                .with_context(ctx)?;
            w.finish().with_context(ctx)?;
        }
    }
    std::io::Write::flush(&mut out).with_context(ctx)?;
    Ok(())
}
