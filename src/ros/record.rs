//! `vision_preproc record`: subscribe to the node's outputs (`tensor`, `timing`) and write
//! them, as received (serialized CDR), to an MCAP bag — the recording side of a live test
//! on machines without `ros2 bag record`. The bag reads like one written by `replay`, so
//! a live run can be compared with an offline replay of the same input.

use super::ros_err;
use crate::bag::{BagWriter, RecordOptions, RecordStats};
use crate::error::Result;
use crate::wire::msgs::{tensor_type, FRAME_TIMING_TYPE as TIMING_TYPE};
use futures::{FutureExt, StreamExt};
use r2r::QosProfile;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn now_ns() -> u64 {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(now.as_nanos()).unwrap_or(u64::MAX)
}

/// Record until `count` tensors arrived, `duration` passed, or SIGINT/SIGTERM.
pub fn record(opts: &RecordOptions) -> Result<RecordStats> {
    let tensor_type = tensor_type(opts.batch);
    // (writer, tensor topic index, timing topic index); none with `--count-only`.
    let mut bag = match &opts.output {
        Some(path) => {
            let mut bag = BagWriter::create(path)?;
            let tensor_idx = bag.add_topic(&opts.tensor_topic, tensor_type)?;
            let timing_idx = bag.add_topic(&opts.timing_topic, TIMING_TYPE)?;
            Some((bag, tensor_idx, timing_idx))
        }
        None => None,
    };

    super::use_default_dds_profile();
    let ctx = r2r::Context::create().map_err(|e| ros_err("creating the ROS context", e))?;
    let mut node = r2r::Node::create(ctx, "vision_preproc_recorder", "")
        .map_err(|e| ros_err("creating the node", e))?;
    // The node's outputs are reliable by default; a deep history keeps every sample
    // while this thread writes the previous one.
    let qos = QosProfile::default().keep_last(50);
    let mut tensors = node
        .subscribe_raw(&opts.tensor_topic, tensor_type, qos.clone())
        .map_err(|e| ros_err("subscribing to the tensors", e))?;
    let mut timings = node
        .subscribe_raw(&opts.timing_topic, TIMING_TYPE, qos)
        .map_err(|e| ros_err("subscribing to the timings", e))?;

    let mut diagnostics = if opts.print_diagnostics {
        let qos = QosProfile::default().keep_last(10);
        Some(
            node.subscribe_untyped("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray", qos)
                .map_err(|e| ros_err("subscribing to /diagnostics", e))?,
        )
    } else {
        None
    };
    let mut last_status = std::collections::HashMap::<String, String>::new();

    let stop = super::stop_on_signal()?;
    let started = Instant::now();
    let mut stats = RecordStats::default();
    let done = |stats: &RecordStats| {
        stop.load(Ordering::Relaxed)
            || opts.count.is_some_and(|n| stats.tensors >= n)
            || opts.duration.is_some_and(|d| started.elapsed() >= d)
    };
    while !done(&stats) {
        node.spin_once(Duration::from_millis(10));
        // Drain what the spin delivered (the streams are non-blocking once polled empty).
        loop {
            let mut progressed = false;
            if let Some(Some(msg)) = tensors.next().now_or_never() {
                let t = now_ns();
                if let Some((bag, tensor_idx, _)) = bag.as_mut() {
                    bag.write(*tensor_idx, t, &msg)?;
                }
                count_tensor(&mut stats, &msg, t, opts.batch);
                progressed = true;
            }
            if let Some(Some(msg)) = timings.next().now_or_never() {
                if let Some((bag, _, timing_idx)) = bag.as_mut() {
                    bag.write(*timing_idx, now_ns(), &msg)?;
                }
                count_timing(&mut stats, &msg);
                progressed = true;
            }
            if let Some(Some(Ok(array))) =
                diagnostics.as_mut().and_then(|d| d.next().now_or_never())
            {
                print_changed_statuses(&array, &mut last_status);
                progressed = true;
            }
            if !progressed || done(&stats) {
                break;
            }
        }
    }
    stats.output = match bag {
        Some((bag, _, _)) => Some(bag.finish()?),
        None => None,
    };
    Ok(stats)
}

/// Count a tensor (`TensorBatch` with `batch`) that arrived at `t` (ns): its end-to-end
/// latency (each new valid item's for a batch) and the first and last arrival.
fn count_tensor(stats: &mut RecordStats, msg: &[u8], t: u64, batch: bool) {
    stats.tensors += 1;
    let ms = |stamp: i64| (i128::from(t) - i128::from(stamp)) as f64 / 1e6;
    if batch {
        if let Ok(b) = crate::wire::msgs::TensorBatch::decode(msg) {
            for it in b.items.iter().filter(|i| i.valid && !i.repeated) {
                stats.e2e_ms.push(ms(it.header.stamp_ns()));
            }
        }
    } else if let Ok(stamp) = crate::wire::msgs::header_stamp_ns(msg) {
        stats.e2e_ms.push(ms(stamp));
    }
    let (first, _) = stats.first_last_ns.unwrap_or((t, t));
    stats.first_last_ns = Some((first, t));
}

/// Count a `FrameTiming`: the node's time and the stages of its frame.
fn count_timing(stats: &mut RecordStats, msg: &[u8]) {
    stats.timings += 1;
    if let Ok(timing) = crate::wire::msgs::FrameTiming::decode(msg) {
        stats.node_ms.push(f64::from(timing.stages_us[4]) / 1e3);
        let s = timing.stages_us;
        stats.stages_us.push([timing.decode_us, s[0], s[1], s[2], s[3]]);
    }
}

/// Print each status of a `DiagnosticArray` (as r2r's JSON) whose level or message
/// differs from the last one printed for that name: level, name, message and the values
/// whose key names GPU failures or the frame counts.
fn print_changed_statuses(
    array: &serde_json::Value,
    last: &mut std::collections::HashMap<String, String>,
) {
    let Some(statuses) = array.get("status").and_then(|s| s.as_array()) else {
        return;
    };
    for st in statuses {
        let name = st.get("name").and_then(|v| v.as_str()).unwrap_or("?").to_string();
        let level = match st.get("level").and_then(|v| v.as_u64()) {
            Some(0) => "OK",
            Some(1) => "WARN",
            Some(2) => "ERROR",
            Some(3) => "STALE",
            _ => "?",
        };
        let message = st.get("message").and_then(|v| v.as_str()).unwrap_or("");
        let key = format!("{level} {message}");
        if last.get(&name) == Some(&key) {
            continue;
        }
        let values: Vec<String> = st
            .get("values")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|kv| {
                let k = kv.get("key")?.as_str()?;
                let v = kv.get("value")?.as_str()?;
                (k.contains("GPU") || k.starts_with("Frames") || k == "Backend")
                    .then(|| format!("{k}: {v}"))
            })
            .collect();
        println!("diagnostics: [{level}] {name}: {message} | {}", values.join("; "));
        last.insert(name, key);
    }
}
