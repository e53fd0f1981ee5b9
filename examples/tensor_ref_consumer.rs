//! A Rust consumer of `tensor_ref` (docs/HANDOFF.md): the tensors the node wrote into its
//! shared blocks, read in place (no copy, no deserialization of the tensor), with r2r.
//! Host blocks (CPU backend) are read as bytes; CUDA blocks (CUDA backend) are imported
//! on the GPU, where a network would read them at the printed device address (printed
//! once per pool); this example copies each tensor to the host for its mean and DUMP.
//! Prints, once a second, the frames read and skipped, the mean of the last tensor and
//! the age of the frames (node clock vs the camera stamp) when they were taken.
//!
//!   vision_preproc_node --ros-args -p backend:=cpu &   # (or cuda) and a camera on `image`
//!   cargo run --release --example tensor_ref_consumer -- /tensor_ref 10 [DUMP]
//!
//! With DUMP, one line per frame read there: its stamp (ns) and the FNV-1a 64 of its
//! tensor bytes (to compare with the same frames' `tensor` messages).
use futures::{FutureExt, StreamExt};
use r2r::vision_preproc_msgs::msg::{FrameTiming, TensorRef};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vision_preproc::consumer::{Consumer, Held};
use vision_preproc::handoff::MemoryKind;

/// The tensor's bytes: in place for host memory; for CUDA memory copied into `host`
/// (after `Held::ready` and the checks of `Held::device`), its device address printed once
/// per pool (`shown`).
fn tensor_bytes<'a>(
    held: &'a Held<'_>,
    msg: &TensorRef,
    host: &'a mut Vec<u8>,
    shown: &mut bool,
) -> anyhow::Result<&'a [u8]> {
    let (at, len) = (msg.byte_offset as usize, msg.byte_size as usize);
    let Some(block) = held.device(msg.device_id, &msg.device_uuid, &msg.ipc_event_handle)? else {
        return Ok(&held.bytes()[at..at + len]);
    };
    if !std::mem::replace(shown, true) {
        println!(
            "pool {}: CUDA blocks on device {}; block {} at device address {:#x} ({} bytes \
             mapped), the tensor at +{at}",
            msg.pool_id,
            block.device_id(),
            msg.block_index,
            block.ptr(),
            block.len()
        );
    }
    host.resize(len, 0);
    block.copy_to_host(at, host)?;
    Ok(host)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let topic = args.next().unwrap_or_else(|| "/tensor_ref".into());
    let seconds: f64 = args.next().map_or(Ok(10.0), |s| s.parse())?;
    let mut dump = args.next().map(std::fs::File::create).transpose()?;
    let ctx = r2r::Context::create()?;
    let mut node = r2r::Node::create(ctx, "tensor_ref_consumer", "")?;
    let mut refs = node.subscribe::<TensorRef>(&topic, r2r::QosProfile::default())?;
    // The node's FrameTiming next to it: node-added latency of the same frames.
    let timing_topic = format!("{}timing", topic.trim_end_matches("tensor_ref"));
    let mut timings = node.subscribe::<FrameTiming>(&timing_topic, r2r::QosProfile::default())?;
    let (mut all_ages, mut node_added) = (Vec::new(), Vec::new());
    // One connection per pool (a node run); a new pool_id replaces the old one.
    let mut pools: HashMap<String, Consumer> = HashMap::new();
    let (mut read, mut skipped, mut ages_ms) = (0u64, 0u64, Vec::new());
    // CUDA blocks: the tensor's copy on the host; whether the pool's address was printed.
    let (mut host, mut shown) = (Vec::new(), false);
    // How long one wait for messages may last (ms; VP_SPIN_MS, default 1). On the H200's
    // host a message did not end the wait: with 5 ms the frames were read ~5 ms later
    // (docs/BENCHMARKS.md, *Zero-copy hand-off*).
    let spin = Duration::from_millis(
        std::env::var("VP_SPIN_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1),
    );
    let (start, mut report) = (Instant::now(), Instant::now());
    while start.elapsed().as_secs_f64() < seconds {
        node.spin_once(spin);
        while let Some(Some(t)) = timings.next().now_or_never() {
            node_added.push(f64::from(t.total_us) / 1e3);
        }
        while let Some(Some(msg)) = refs.next().now_or_never() {
            let stale = pools.get(&msg.pool_id).is_some_and(|c| !c.connected());
            if stale || !pools.contains_key(&msg.pool_id) {
                pools.clear();
                let c = Consumer::connect(std::path::Path::new(&msg.socket_path))?;
                shown = c.memory() == MemoryKind::Host;
                pools.insert(msg.pool_id.clone(), c);
            }
            let Some(consumer) = pools.get(&msg.pool_id) else { continue };
            let Some(held) = consumer.take(msg.block_index, msg.generation) else {
                skipped += 1; // reused before we took it
                continue;
            };
            if !held.ready(&msg.ipc_event_handle)? {
                skipped += 1; // withdrawn: the node's GPU work on it failed
                continue;
            }
            let bytes = tensor_bytes(&held, &msg, &mut host, &mut shown)?;
            if let Some(f) = dump.as_mut() {
                use std::io::Write;
                let fnv = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
                });
                let stamp = i64::from(msg.header.stamp.sec) * 1_000_000_000
                    + i64::from(msg.header.stamp.nanosec);
                writeln!(f, "{stamp} {fnv:016x}")?;
            }
            // The network would run here, on the block in place; this one takes a mean.
            let mean = if msg.dtype == "float32" {
                let v: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                v.iter().sum::<f32>() / v.len().max(1) as f32
            } else {
                f32::NAN
            };
            let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
            let stamp =
                f64::from(msg.header.stamp.sec) + f64::from(msg.header.stamp.nanosec) * 1e-9;
            ages_ms.push((now - stamp) * 1e3);
            all_ages.push((now - stamp) * 1e3);
            read += 1;
            drop(held); // give the block back as soon as the work on it is done
            if report.elapsed() >= Duration::from_secs(1) {
                ages_ms.sort_by(f64::total_cmp);
                let p50 = ages_ms.get(ages_ms.len() / 2).copied().unwrap_or(f64::NAN);
                println!(
                    "{read} read, {skipped} skipped; last {:?} {} mean {mean:.4}; age p50 {p50:.2} ms",
                    msg.shape, msg.dtype
                );
                ages_ms.clear();
                report = Instant::now();
            }
        }
    }
    let pct = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN)
    };
    println!(
        "{read} read, {skipped} skipped in {seconds} s; stamp -> readable p50 {:.2} ms, p99 {:.2} ms; \
         node-added p50 {:.2} ms, p99 {:.2} ms",
        pct(&mut all_ages, 0.5),
        pct(&mut all_ages, 0.99),
        pct(&mut node_added, 0.5),
        pct(&mut node_added, 0.99)
    );
    Ok(())
}
