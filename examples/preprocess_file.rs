//! The library in one place: a configuration, a backend, a pipeline, one image file.
//!
//!   cargo run --release --example preprocess_file -- test/data/chelsea.png
use vision_preproc::backend::read_elements;
use vision_preproc::pipeline::select_backend;
use vision_preproc::{Config, ImageView, Pipeline};

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "test/data/chelsea.png".into());
    let rgb = image::open(&path)?.to_rgb8(); // a PNG or JPEG, as rgb8 rows
    let (w, h) = rgb.dimensions();
    let config =
        Config { network_image_width: 320, network_image_height: 320, ..Config::default() };
    let (backend, fallback) = select_backend(&config)?; // CUDA when usable, else the CPU
    if let Some(reason) = fallback {
        eprintln!("no GPU, on the CPU backend: {reason}");
    }
    let mut pipeline = Pipeline::new(config, backend)?;
    let frame = ImageView::new(w, h, 3 * w, "rgb8", false, rgb.as_raw())?;
    let info = pipeline.process(&frame)?; // letterboxed, normalized, NCHW float32
    let tensor = read_elements(info.desc.dtype, pipeline.tensor_bytes());
    let mean = tensor.iter().sum::<f32>() / tensor.len() as f32;
    let g = &info.geometry;
    println!(
        "{path}: {w}x{h} -> tensor {:?} {}, mean {mean:.4}, on {}",
        info.desc.shape(),
        info.desc.dtype.name(),
        pipeline.backend().name()
    );
    println!(
        "network pixel = source pixel * ({:.4}, {:.4}) + ({:.1}, {:.1})",
        g.scale_x, g.scale_y, g.offset_x, g.offset_y
    );
    Ok(())
}
