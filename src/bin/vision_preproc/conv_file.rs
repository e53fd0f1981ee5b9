//! `vision_preproc conv-file` (hidden, for tests): the CPU conv2d alone, on a float32
//! `(C, H, W)` `.npy`, so the Python parity test (`test/python/test_conv_parity.py`) can
//! compare it with OpenCV on any planes without going through decode and resize.

use anyhow::{bail, Context, Result};
use clap::Args;
use npyz::WriterBuilder;
use std::io::Write;
use std::path::{Path, PathBuf};
use vision_preproc::backend::cpu::{conv2d, ConvScratch};
use vision_preproc::backend::TensorDesc;
use vision_preproc::config::{DType, Layout};
use vision_preproc::pipeline::conv_op;
use vision_preproc::Config;

/// Arguments of `conv-file`.
#[derive(Args)]
pub struct ConvFileArgs {
    /// Input planes: float32 arrays of shape (C, H, W), C order (several files, each of
    /// its own size, share one start-up).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Output: float32 (C, H, W), the input after conv2d; one `-o` per input, in order.
    #[arg(short, long = "output", required = true)]
    outputs: Vec<PathBuf>,
    /// Override a parameter, `KEY=VALUE` with a YAML value (`conv.kernel=gaussian`,
    /// `conv.weights=[0, 1, 0, ...]`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Also write the 2-D weights applied, float32 (size, size), row-major.
    #[arg(long, value_name = "OUT.npy")]
    dump_kernel: Option<PathBuf>,
    /// Also write the separable factors, float32 (2, size): [kx (horizontal), ky
    /// (vertical)]; an error when the kernel is not separable.
    #[arg(long, value_name = "OUT.npy")]
    dump_factors: Option<PathBuf>,
}

/// Run `conv-file`.
pub fn run(args: ConvFileArgs) -> Result<()> {
    let cfg = config_with_overrides(&args.set)?;
    let Some(op) = conv_op(&cfg)? else { bail!("conv.kernel is none: set --set conv.kernel=...") };
    if args.inputs.len() != args.outputs.len() {
        bail!(
            "{} inputs but {} outputs: give one -o per input",
            args.inputs.len(),
            args.outputs.len()
        );
    }
    let mut scratch = ConvScratch::default();
    for (input, output) in args.inputs.iter().zip(&args.outputs) {
        let (shape, mut data) = read_f32(input)?;
        let [c, h, w] = shape;
        let dim = |v: u64, what: &str| {
            u32::try_from(v)
                .ok()
                .filter(|v| *v > 0)
                .with_context(|| format!("{}: {what} {v}: use 1..2^32", input.display()))
        };
        let desc = TensorDesc {
            channels: dim(c, "channels")?,
            height: dim(h, "height")?,
            width: dim(w, "width")?,
            layout: Layout::Nchw,
            dtype: DType::Float32,
        };
        conv2d(&desc, &op, &mut data, &mut scratch)?;
        write_f32(output, &shape, &data)?;
    }
    let n = u64::from(op.size);
    if let Some(path) = &args.dump_kernel {
        write_f32(path, &[n, n], &op.weights)?;
    }
    if let Some(path) = &args.dump_factors {
        let Some((kx, ky)) = &op.separable else {
            bail!("--dump-factors: {:?} is not separable", cfg.conv.kernel)
        };
        write_f32(path, &[2, n], &[&kx[..], &ky[..]].concat())?;
    }
    Ok(())
}

/// `Config::default()` with `KEY=VALUE` overrides (dotted keys, YAML values), validated
/// (the loader of run-file and replay: unknown keys are warned about).
fn config_with_overrides(sets: &[String]) -> Result<Config> {
    let overrides = sets
        .iter()
        .map(|set| {
            let (key, text) =
                set.split_once('=').with_context(|| format!("--set {set}: use KEY=VALUE"))?;
            Ok((key.to_string(), text.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(crate::input::with_warnings(Config::load_yaml_str("", "--set", &overrides)?))
}

/// A float32 (C, H, W) array in C order.
fn read_f32(path: &Path) -> Result<([u64; 3], Vec<f32>)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let npy = npyz::NpyFile::new(&bytes[..])
        .with_context(|| format!("{}: not a .npy file", path.display()))?;
    let descr = npy.dtype().descr();
    let shape = npy.shape().to_vec();
    if !matches!(descr.as_str(), "'<f4'" | "'>f4'")
        || shape.len() != 3
        || npy.order() != npyz::Order::C
    {
        bail!(
            "{}: need a float32 (C, H, W) array in C order; got dtype {descr}, shape {shape:?}, \
             order {:?}",
            path.display(),
            npy.order()
        );
    }
    let data = npy.into_vec::<f32>().with_context(|| format!("reading {}", path.display()))?;
    Ok(([shape[0], shape[1], shape[2]], data))
}

/// Write `data` as a little-endian float32 array of `shape`.
fn write_f32(path: &Path, shape: &[u64], data: &[f32]) -> Result<()> {
    let context = || format!("writing {}", path.display());
    let file = std::fs::File::create(path).with_context(context)?;
    let mut out = std::io::BufWriter::new(file);
    let mut writer = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut out)
        .begin_nd()
        .with_context(context)?;
    writer.extend(data.iter().copied()).with_context(context)?;
    writer.finish().with_context(context)?;
    out.flush().with_context(context)
}
