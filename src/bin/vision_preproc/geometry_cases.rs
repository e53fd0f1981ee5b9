//! `vision_preproc geometry-cases` (hidden, for tests): the seeded random geometry cases of
//! `vision_preproc::boxes::cases`, checked here (the largest errors on stderr) and printed
//! with this crate's box mapping of each, so `test/python/test_boxes.py` can check the
//! Python and C++ mappings against the Rust results on the same cases.

use anyhow::{bail, Result};
use clap::Args;
use std::io::Write;
use vision_preproc::boxes::cases;
use vision_preproc::rng::SplitMix64;

/// Arguments of `geometry-cases`.
#[derive(Args)]
pub struct GeometryCasesArgs {
    /// How many cases.
    #[arg(long, default_value_t = 10_000)]
    count: usize,
    /// The generator's seed.
    #[arg(long, default_value_t = 46)]
    seed: u64,
    /// The largest error allowed, in source pixels (exit 1 when a check exceeds it).
    #[arg(long, default_value_t = 0.01)]
    tolerance: f64,
}

/// Run `geometry-cases`: the lines on stdout, the largest errors on stderr.
pub fn run(args: GeometryCasesArgs) -> Result<()> {
    let worst = cases::check_all(args.seed, args.count)?;
    eprintln!("{} cases, largest errors in source pixels: {worst:?}", args.count);
    let e = worst;
    if [e.round_trip, e.source_points, e.kernel_linear, e.kernel_nearest]
        .iter()
        .any(|&v| v > args.tolerance)
    {
        bail!("an error exceeds the tolerance {} source pixels: {worst:?}", args.tolerance);
    }
    let mut rng = SplitMix64::new(args.seed ^ 0x11e5);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for case in cases::generate(args.seed, args.count)? {
        for line in cases::lines(&case, &mut rng)? {
            writeln!(out, "{line}")?;
        }
    }
    out.flush()?;
    Ok(())
}
