//! Command-line inputs shared by the subcommands: the configuration (`--config`,
//! `--set`) and a source image (PNG/JPEG through the `image` crate, or `--raw` bytes of
//! any supported encoding).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use vision_preproc::backend::cpu::{CpuBackend, Simd};
use vision_preproc::config::Loaded;
use vision_preproc::{Config, Encoding, ImageView};

/// `--cpu-simd`: which build of the CPU backend's inner loops runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CpuSimd {
    /// The best one the CPU has: AVX2 on x86-64, NEON on aarch64, else the baseline.
    #[default]
    Auto,
    /// The portable loops (the same values; for comparisons and benchmarks).
    Baseline,
}

impl CpuSimd {
    /// A CPU backend with these loops.
    pub fn backend(self) -> CpuBackend {
        let mut cpu = CpuBackend::new();
        if self == CpuSimd::Baseline {
            cpu.set_simd(Simd::Baseline);
        }
        cpu
    }
}

/// `--config FILE` and `--set key=value`.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// Parameters file (ROS `ros__parameters` shape or a bare mapping), read as the node
    /// reads it: the `/**` and `vision_preproc` sections, nested or dotted names; unknown
    /// parameters are warned about and ignored. Defaults to the built-in defaults
    /// (config/default.yaml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Override one parameter, dotted for nested ones, the value typed as YAML:
    /// `--set resize_mode=stretch --set conv.kernel=box --set roi=[0,0,64,48]`.
    /// Repeatable; applied in order after the file.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ConfigArgs {
    /// The validated configuration: the file (or the defaults), then each `--set`.
    pub fn load(&self) -> Result<Config> {
        let overrides = self
            .set
            .iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => Ok((k.trim().to_string(), v.to_string())),
                None => bail!("--set {kv:?}: write KEY=VALUE, e.g. --set resize_mode=stretch"),
            })
            .collect::<Result<Vec<_>>>()?;
        let (text, context) = match &self.config {
            Some(path) => (
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading --config {}", path.display()))?,
                path.display().to_string(),
            ),
            None => (String::new(), "defaults".to_string()),
        };
        Ok(with_warnings(Config::load_yaml_str(&text, &context, &overrides)?))
    }
}

/// The configuration, after a warning on stderr for each parameter that was ignored
/// because vision_preproc does not have it (as the node logs them).
pub fn with_warnings(loaded: Loaded) -> Config {
    for u in &loaded.unknown {
        eprintln!("warning: {}: {u}", u.source);
    }
    loaded.config
}

/// How to read the image file: decoded by the `image` crate, or raw bytes.
#[derive(Args, Debug, Clone, Default)]
pub struct RawArgs {
    /// Read the file as raw pixel bytes (give --encoding, --width, --height).
    #[arg(long)]
    pub raw: bool,
    /// Encoding of the raw bytes (a `sensor_msgs/Image` encoding: rgb8, bgr8, rgba8,
    /// bgra8, mono8, mono16, rgb16, bgr16, yuyv/yuv422_yuy2, uyvy/yuv422, nv12, nv21,
    /// bayer_rggb8, bayer_bggr8, bayer_gbrg8, bayer_grbg8).
    #[arg(long, requires = "raw")]
    pub encoding: Option<String>,
    /// Width of the raw image in pixels.
    #[arg(long, requires = "raw")]
    pub width: Option<u32>,
    /// Height of the raw image in pixels.
    #[arg(long, requires = "raw")]
    pub height: Option<u32>,
    /// Row stride of the raw image in bytes (default: width * bytes per pixel).
    #[arg(long, requires = "raw")]
    pub step: Option<u32>,
    /// 16-bit samples are big-endian (`is_bigendian: 1`).
    #[arg(long, requires = "raw")]
    pub big_endian: bool,
}

/// An owned image with a `sensor_msgs/Image`-like header.
#[derive(Debug, Clone)]
pub struct OwnedImage {
    pub width: u32,
    pub height: u32,
    pub step: u32,
    pub encoding: String,
    pub big_endian: bool,
    pub data: Vec<u8>,
}

impl OwnedImage {
    /// The validated view (errors name the bad header field).
    pub fn view(&self) -> Result<ImageView<'_>> {
        Ok(ImageView::new(
            self.width,
            self.height,
            self.step,
            &self.encoding,
            self.big_endian,
            &self.data,
        )?)
    }
}

/// Load `path` as `raw` says.
pub fn load_image(path: &Path, raw: &RawArgs) -> Result<OwnedImage> {
    if raw.raw {
        load_raw(path, raw)
    } else {
        load_decoded(path)
    }
}

fn load_raw(path: &Path, raw: &RawArgs) -> Result<OwnedImage> {
    let (Some(encoding), Some(width), Some(height)) = (&raw.encoding, raw.width, raw.height) else {
        bail!("--raw needs --encoding, --width and --height");
    };
    let enc = Encoding::parse(encoding)?;
    let step = match raw.step {
        Some(s) => s,
        None => width.checked_mul(enc.bytes_per_pixel()).with_context(|| {
            format!("width {width} x {} bytes overflows", enc.bytes_per_pixel())
        })?,
    };
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let img = OwnedImage {
        width,
        height,
        step,
        encoding: encoding.clone(),
        big_endian: raw.big_endian,
        data,
    };
    img.view().with_context(|| format!("raw file {}", path.display()))?;
    Ok(img)
}

fn load_decoded(path: &Path) -> Result<OwnedImage> {
    use image::DynamicImage as D;
    let img = image::ImageReader::open(path)
        .with_context(|| format!("opening {}", path.display()))?
        .with_guessed_format()
        .with_context(|| format!("reading {}", path.display()))?
        .decode()
        .with_context(|| {
            format!("decoding {} (PNG or JPEG; use --raw for raw bytes)", path.display())
        })?;
    let (width, height) = (img.width(), img.height());
    let le16 = |v: Vec<u16>| v.into_iter().flat_map(u16::to_le_bytes).collect::<Vec<u8>>();
    let (encoding, bpp, data) = match img {
        D::ImageLuma8(b) => ("mono8", 1, b.into_raw()),
        D::ImageLumaA8(_) => ("mono8", 1, img.to_luma8().into_raw()),
        D::ImageLuma16(b) => ("mono16", 2, le16(b.into_raw())),
        D::ImageLumaA16(_) => ("mono16", 2, le16(img.to_luma16().into_raw())),
        D::ImageRgba8(b) => ("rgba8", 4, b.into_raw()),
        D::ImageRgb16(b) => ("rgb16", 6, le16(b.into_raw())),
        D::ImageRgba16(_) => ("rgb16", 6, le16(img.to_rgb16().into_raw())),
        D::ImageRgb8(b) => ("rgb8", 3, b.into_raw()),
        other => ("rgb8", 3, other.to_rgb8().into_raw()),
    };
    let step = width
        .checked_mul(bpp)
        .with_context(|| format!("{} is too wide ({width} pixels)", path.display()))?;
    Ok(OwnedImage { width, height, step, encoding: encoding.to_string(), big_endian: false, data })
}
