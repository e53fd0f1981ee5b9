//! `vision_preproc decode-file` (hidden, for tests): one `sensor_msgs/CompressedImage`
//! payload from a file through `compressed::decode`, so the Python test
//! (`test/python/test_compressed_decode.py`) can compare the pixels with OpenCV's decode.
//!
//! Prints one JSON line: `{"width", "height", "step", "encoding"}` after writing the
//! pixels (tight rows, 16-bit little-endian) to the output, or `{"error": kind, "message"}`
//! and exit code 2 when the payload is refused (any other failure: exit code 1).

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use vision_preproc::compressed::{decode, Limits};

/// Arguments of `decode-file`.
#[derive(Args)]
pub struct DecodeFileArgs {
    /// The `format` field, as a publisher writes it (`jpeg`, `bgr8; jpeg compressed bgr8`).
    #[arg(long)]
    format: String,
    /// The compressed payload (the message's `data`).
    input: PathBuf,
    /// Where the decoded pixels go (raw bytes, `step * height`).
    output: PathBuf,
}

/// Run `decode-file`.
pub fn run(args: DecodeFileArgs) -> Result<ExitCode> {
    let data =
        std::fs::read(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    match decode(&args.format, &data, &Limits::default()) {
        Ok(d) => {
            let d = d.view();
            std::fs::write(&args.output, d.data())
                .with_context(|| format!("writing {}", args.output.display()))?;
            let header = serde_json::json!({
                "width": d.width(),
                "height": d.height(),
                "step": d.step(),
                "encoding": d.encoding().name(),
            });
            println!("{header}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("{}", serde_json::json!({ "error": e.kind(), "message": e.to_string() }));
            Ok(ExitCode::from(2))
        }
    }
}
