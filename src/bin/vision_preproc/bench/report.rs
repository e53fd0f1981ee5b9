//! What the benchmark prints and writes: the verdicts on the targets, the table and
//! results.json.

use super::timing::{Figure, ORIN_GBPS};
use super::BenchOptions;
use std::time::{SystemTime, UNIX_EPOCH};
use vision_preproc::backend::cuda::DeviceInfo;

/// The verdicts on the targets of docs/GPU.md: fused vs three-kernel and the roof at 4K,
/// tiled vs naive conv2d at 7x7 (each only when its figures were run).
pub fn verdicts(figures: &[Figure]) -> Vec<String> {
    let find = |case: &str, fig: &str| {
        figures.iter().find(|f| f.case.contains(case) && f.figure.starts_with(fig)).cloned()
    };
    let mut verdicts = Vec::new();
    if let (Some(fz), Some(tk)) = (find("3840x2160", "fused"), find("3840x2160", "three-kernel")) {
        let x = tk.p50_us / fz.p50_us;
        verdicts.push(format!(
            "4K fused vs three-kernel: {x:.2}x (target >= 2.4x: {}); ledger ratio {:.2}x",
            if x >= 2.4 { "met" } else { "MISSED" },
            tk.ledger_bytes as f64 / fz.ledger_bytes as f64
        ));
        verdicts.push(format!(
            "4K fused at {:.0} GB/s = {:.0}% of the copy roof (target >= 75%: {})",
            fz.gbps,
            fz.pct_copy_roof,
            if fz.pct_copy_roof >= 75.0 { "met" } else { "MISSED" }
        ));
    }
    if let (Some(t7), Some(n7)) = (find("conv2d", "tiled 7x7"), find("conv2d", "naive 7x7")) {
        let x = n7.p50_us / t7.p50_us;
        verdicts.push(format!(
            "conv2d 7x7 tiled vs naive: {x:.2}x (target >= 2x: {})",
            if x >= 2.0 { "met" } else { "MISSED" }
        ));
    }
    verdicts
}

/// Everything one run measured, for the table and the JSON.
pub struct Run<'a> {
    /// The device.
    pub dev: &'a DeviceInfo,
    /// When the run started.
    pub started: SystemTime,
    /// The SM clock measured before and after, MHz.
    pub clock_mhz: (f64, f64),
    /// The copy roof, GB/s.
    pub roof_gbps: f64,
    /// Every figure.
    pub figures: &'a [Figure],
    /// Sanity checks and comparisons.
    pub notes: &'a [String],
    /// [`verdicts`].
    pub verdicts: &'a [String],
    /// Byte ledger of each case.
    pub ledgers: &'a [serde_json::Value],
}

/// The human-readable table: a header with the device and clocks, one line per figure,
/// then the notes and verdicts.
pub fn table(r: &Run<'_>, opts: &BenchOptions) -> String {
    let dev = r.dev;
    let (clock_before, clock_after) = r.clock_mhz;
    let mut table = format!(
        "vision_preproc bench — {} ({}, {} SMs, L2 {} MiB, driver {}.{}, NVRTC {}.{}), {}\n\
         SM clock measured {clock_before:.0} MHz before / {clock_after:.0} MHz after (driver max {}); \
         copy roof {:.0} GB/s (read + write); {} timed iterations after {} warm-up per figure\n",
        dev.name, dev.arch, dev.multiprocessors, dev.l2_bytes >> 20, dev.driver_version / 1000,
        (dev.driver_version % 1000) / 10, dev.nvrtc_version.0, dev.nvrtc_version.1, utc(r.started),
        dev.max_sm_clock_mhz.map_or("n/a".into(), |m| format!("{m:.0} MHz")),
        r.roof_gbps, opts.iterations.max(1), opts.warmup
    );
    table.push_str(&format!(
        "{:<58} {:<30} {:>9} {:>9} {:>9} {:>8} {:>7} {:>6} {:>9} {:>8} {:>9} {:>9}\n",
        "case",
        "figure",
        "mean us",
        "p50 us",
        "p99 us",
        "MB",
        "GB/s",
        "%roof",
        "blk/SM",
        "regs",
        "Orin@68",
        "Orin@31"
    ));
    for f in r.figures {
        let join = |v: Vec<String>| if v.is_empty() { "-".to_string() } else { v.join("/") };
        table.push_str(&format!(
            "{:<58} {:<30} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>7.0} {:>6.1} {:>9} {:>8} {:>9.1} {:>9.1}\n",
            f.case, f.figure, f.mean_us, f.p50_us, f.p99_us, f.ledger_bytes as f64 / 1e6, f.gbps, f.pct_copy_roof,
            join(f.blocks_per_sm.iter().map(|b| b.to_string()).collect()),
            join(f.registers.iter().map(|r| r.to_string()).collect()),
            f.orin_68gbps_us, f.orin_31gbps_us
        ));
    }
    for n in r.notes.iter().chain(r.verdicts) {
        table.push_str(&format!("* {n}\n"));
    }
    table
}

/// results.json.
pub fn json(r: &Run<'_>, opts: &BenchOptions) -> serde_json::Value {
    let dev = r.dev;
    serde_json::json!({
        "device": {
            "name": dev.name, "arch": dev.arch, "multiprocessors": dev.multiprocessors,
            "l2_bytes": dev.l2_bytes, "driver_version": dev.driver_version,
            "nvrtc_version": format!("{}.{}", dev.nvrtc_version.0, dev.nvrtc_version.1),
            "max_sm_clock_mhz": dev.max_sm_clock_mhz,
            "sm_clock_measured_mhz": [r.clock_mhz.0, r.clock_mhz.1],
        },
        "date_utc": utc(r.started),
        "iterations": opts.iterations.max(1),
        "warmup": opts.warmup,
        "copy_roof_gbps": r.roof_gbps,
        "orin_gbps": ORIN_GBPS,
        "figures": r.figures,
        "frames": opts.frames_dir.as_ref().map_or("random bytes".to_string(), |d| d.display().to_string()),
        "frame_conv": opts.frame_conv,
        "ledgers": r.ledgers,
        "notes": r.notes,
        "verdicts": r.verdicts,
    })
}

/// UTC date and time of `t` as `YYYY-MM-DD HH:MM:SS UTC` (civil-from-days, no dependency).
pub fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn utc_dates() {
        // `date -u -d @0`, `date -u -d @951782400` (2000-02-29), `date -u -d @1764460800`.
        let at = |s: u64| utc(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(at(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(at(1_764_460_800 + 3_723), "2025-11-30 01:02:03 UTC");
    }
}
