//! `tensor_ref` in the node: the pool of shared output blocks and its socket
//! ([`crate::handoff`]), which outputs a set gets (each only while its topic has
//! subscribers), and the pool's part of `/diagnostics`. docs/HANDOFF.md.

use super::shared::{lock, RateLimitedLog, Shared};
use crate::handoff::server::{self, Server};
use crate::handoff::{ConsumerStats, Lease, MemoryKind, Pool};
use crate::pipeline::Pipeline;
use r2r::diagnostic_msgs::msg::{DiagnosticStatus, KeyValue};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The pool and its socket, replaced when the output grows (run-time parameters) or the
/// backend is replaced (`gpu_failure_policy`): consumers see a new `pool_id` and connect
/// again.
pub(super) struct Handoff {
    pool: Arc<Pool>,
    /// The pipeline's backend epoch the pool was made for.
    epoch: u64,
    _server: Server,
    dir: PathBuf,
    blocks: usize,
    lease: Duration,
    tensor: r2r::PublisherUntyped,
    tensor_ref: r2r::PublisherUntyped,
    topic: String,
    log: RateLimitedLog,
}

/// What a set produces.
pub(super) enum SetOutputs {
    /// The tensors into `block` (`None`: into the message only); `fill`: the `tensor`
    /// message gets them too.
    Go { block: Option<Lease>, fill: bool },
    /// Dropped: `tensor_ref` is the only output wanted and every block is in use.
    NoBlock,
}

/// Make a pool for the pipeline's backend (device memory where it can share it) with its
/// socket; logs where it is and, when the backend has a device whose memory it could not
/// share, why the blocks are host memory.
fn open(
    pipeline: &Pipeline,
    blocks: usize,
    bytes: usize,
    lease: Duration,
    dir: &std::path::Path,
    logger: &str,
) -> crate::Result<(Arc<Pool>, Server)> {
    let (pool, host_why) = pipeline.shared_pool(blocks, bytes, lease, dir)?;
    let server = Server::start(Arc::clone(&pool))?;
    let memory = match (pool.memory(), pool.events_missing()) {
        (MemoryKind::Cuda, None) => format!(
            "CUDA device {} memory; each TensorRef goes out before its GPU work ends, with an \
             interprocess event to wait on",
            pool.device_info().0
        ),
        (MemoryKind::Cuda, Some(why)) => format!(
            "CUDA device {} memory; each TensorRef goes out after its GPU work ended: {why}",
            pool.device_info().0
        ),
        (MemoryKind::Host, _) => "host memory".to_string(),
    };
    r2r::log_info!(
        logger,
        "tensor_ref: pool {}: {blocks} shared blocks of {} bytes ({memory}), consumers connect to {}",
        pool.id(),
        pool.block_size(),
        server.path().display()
    );
    if let Some(why) = host_why {
        r2r::log_warn!(
            logger,
            "tensor_ref: the {} backend's tensors are copied into host blocks: its device \
             memory cannot be shared ({why}; docs/HANDOFF.md)",
            pipeline.backend().name()
        );
    }
    Ok((pool, server))
}

impl Handoff {
    /// The pool for the node's output, or `None` (logged: `shared_pool_size` 0, or the
    /// pool could not be made). Device memory with the CUDA backend where the GPU can
    /// share it (the kernels write the block; no download unless `tensor` is wanted too),
    /// else host memory.
    pub(super) fn start(
        pipeline: &Pipeline,
        shared: &Shared,
        tensor: r2r::PublisherUntyped,
        tensor_ref: r2r::PublisherUntyped,
        topic: String,
    ) -> Option<Handoff> {
        let logger = shared.logger.as_str();
        let config = pipeline.config();
        let blocks = config.shared_pool_size as usize;
        if blocks == 0 {
            r2r::log_info!(logger, "tensor_ref: off (shared_pool_size 0)");
            return None;
        }
        let lease = Duration::from_millis(u64::from(config.shared_lease_ms));
        let bytes = pipeline.output_bytes();
        let made = server::socket_dir().and_then(|dir| {
            let stale = server::remove_stale(&dir);
            if stale > 0 {
                r2r::log_info!(
                    logger,
                    "tensor_ref: removed {stale} stale socket(s) in {}",
                    dir.display()
                );
            }
            let (pool, srv) = open(pipeline, blocks, bytes, lease, &dir, logger)?;
            Ok((pool, srv, dir))
        });
        match made {
            Ok((pool, srv, dir)) => {
                *lock(&shared.pool) = Some(Arc::clone(&pool));
                let log = RateLimitedLog::new(&shared.clock);
                Some(Handoff {
                    pool,
                    epoch: pipeline.backend_epoch(),
                    _server: srv,
                    dir,
                    blocks,
                    lease,
                    tensor,
                    tensor_ref,
                    topic,
                    log,
                })
            }
            Err(e) => {
                r2r::log_warn!(logger, "tensor_ref: not published: {e}");
                None
            }
        }
    }

    /// Publish a set's `TensorRef` (announced before its work ended); false if it could
    /// not go out (logged).
    pub(super) fn announce(&mut self, cdr: &[u8], shared: &Shared) -> bool {
        match self.tensor_ref.publish_raw(cdr) {
            Ok(()) => true,
            Err(e) => {
                self.log.error(&shared.logger, &format!("publishing tensor_ref: {e}"));
                false
            }
        }
    }

    /// The outputs of the next set: the block to write it into when `tensor_ref` has
    /// subscribers, and whether the `tensor` message gets the bytes too.
    pub(super) fn outputs(&mut self, pipeline: &Pipeline, shared: &Shared) -> SetOutputs {
        let subscribed = |p: &r2r::PublisherUntyped| {
            p.get_inter_process_subscription_count().map_or(true, |n| n > 0)
        };
        // Wanted by a DDS subscriber of `tensor_ref` or a consumer on the pool's ready
        // signal (a consumer without ROS: the C library, docs/HANDOFF.md). A replaced
        // backend's pool is replaced at once, subscribers or not (a device pool was
        // released with its backend: it serves nothing any more).
        let on_signal = self.pool.signal_counts().0 > 0;
        let (wanted, epoch) = (on_signal || subscribed(&self.tensor_ref), pipeline.backend_epoch());
        if !wanted && epoch == self.epoch {
            return SetOutputs::Go { block: None, fill: true };
        }
        let fill = subscribed(&self.tensor);
        let logger = shared.logger.as_str();
        let bytes = pipeline.output_bytes();
        if (bytes > self.pool.block_size() || epoch != self.epoch)
            && !self.replace_pool(pipeline, shared, (epoch, bytes))
        {
            return SetOutputs::Go { block: None, fill: true };
        }
        if !wanted {
            return SetOutputs::Go { block: None, fill: true };
        }
        let (lease, reclaimed) = self.pool.lease();
        if reclaimed > 0 {
            r2r::log_warn!(
                logger,
                "{}: {reclaimed} consumer(s) held a shared block longer than shared_lease_ms ({} ms): \
                 disconnected, their blocks taken back",
                self.topic,
                self.lease.as_millis()
            );
        }
        let log = &mut self.log;
        match lease {
            Some(block) => SetOutputs::Go { block: Some(block), fill },
            None if fill => {
                log.warn(
                    &shared.logger,
                    &format!(
                        "{}: no free shared block (consumers hold all {}): this tensor went out \
                         on tensor only",
                        self.topic, self.blocks
                    ),
                );
                SetOutputs::Go { block: None, fill: true }
            }
            None => {
                log.warn(
                    &shared.logger,
                    &format!(
                        "{}: no free shared block (its consumers hold all {}): set dropped; release \
                         frames sooner or raise shared_pool_size",
                        self.topic, self.blocks
                    ),
                );
                SetOutputs::NoBlock
            }
        }
    }

    /// A new pool for `pipeline` (its backend was replaced: `epoch`; or its output grew to
    /// `bytes`), which consumers move to; false (logged) when none could be made.
    fn replace_pool(
        &mut self,
        pipeline: &Pipeline,
        shared: &Shared,
        (epoch, bytes): (u64, usize),
    ) -> bool {
        let logger = shared.logger.as_str();
        match open(pipeline, self.blocks, bytes, self.lease, &self.dir, logger) {
            Ok((pool, srv)) => {
                let why = if epoch != self.epoch {
                    "the backend was replaced".to_string()
                } else {
                    format!("the output grew to {bytes} bytes")
                };
                r2r::log_info!(logger, "tensor_ref: {why}: consumers move to pool {}", pool.id());
                *lock(&shared.pool) = Some(Arc::clone(&pool));
                self.pool = pool;
                self.epoch = epoch;
                self._server = srv;
                true
            }
            Err(e) => {
                self.log.error(logger, &format!("tensor_ref: a new pool: {e}"));
                false
            }
        }
    }
}

/// The pool's part of `/diagnostics`.
pub(super) fn diagnostics(shared: &Shared) -> Vec<(String, String)> {
    let Some(pool) = lock(&shared.pool).clone() else {
        return vec![("Shared blocks".into(), "off".into())];
    };
    let (c, in_use, consumers) = pool.counts();
    let (signalled, dropped) = pool.signal_counts();
    let memory = match pool.memory() {
        MemoryKind::Cuda => format!("cuda, device {}", pool.device_info().0),
        MemoryKind::Host => "host".into(),
    };
    vec![
        (
            "Shared blocks".into(),
            format!("{} x {} bytes ({})", pool.len(), pool.block_size(), memory),
        ),
        ("Shared socket".into(), pool.socket_path().display().to_string()),
        ("Shared blocks in use".into(), in_use.to_string()),
        ("Shared consumers".into(), consumers.to_string()),
        ("Shared no free block".into(), c.no_free_block.to_string()),
        ("Shared reclaims".into(), c.reclaims.to_string()),
        ("Shared withdrawn sets".into(), c.withdrawn.to_string()),
        ("Shared refused connections".into(), c.refused.to_string()),
        ("Shared bad clients".into(), c.bad_clients.to_string()),
        ("Shared consumers on the ready signal".into(), signalled.to_string()),
        ("Shared dropped descriptors".into(), dropped.to_string()),
    ]
}

/// One status per consumer on the ready signal (docs/HANDOFF.md, *The socket protocol*):
/// its camera stamp -> acquired and acquired -> released p50/p99 over its last reports,
/// its descriptors' delivery, sent and dropped. WARN while descriptors were dropped.
pub(super) fn consumer_statuses(shared: &Shared, node: &str) -> Vec<DiagnosticStatus> {
    let Some(pool) = lock(&shared.pool).clone() else { return Vec::new() };
    pool.consumer_stats().into_iter().map(|c| consumer_status(&c, node, pool.id())).collect()
}

fn consumer_status(c: &ConsumerStats, node: &str, pool: &str) -> DiagnosticStatus {
    let ms = |p: Option<(f64, f64)>, i: usize| {
        p.map_or("n/a".to_string(), |v| format!("{:.3}", if i == 0 { v.0 } else { v.1 }))
    };
    let mut values = Vec::new();
    for (what, p) in [
        ("Camera stamp -> acquired", c.stamp_to_acquired),
        ("Acquired -> released", c.acquired_to_released),
        ("Descriptor delivery", c.delivery),
    ] {
        values.push(KeyValue { key: format!("{what} p50 (ms)"), value: ms(p, 0) });
        values.push(KeyValue { key: format!("{what} p99 (ms)"), value: ms(p, 1) });
    }
    for (key, value) in [
        ("Frames reported (window)", c.frames.to_string()),
        ("Frames skipped or withdrawn (window)", c.skipped.to_string()),
        ("Descriptors sent", c.sent.to_string()),
        ("Descriptors dropped", c.dropped.to_string()),
        ("Pool", pool.to_string()),
    ] {
        values.push(KeyValue { key: key.into(), value });
    }
    let (level, message) = if c.dropped > 0 {
        (
            DiagnosticStatus::WARN as u8,
            format!("{} descriptors dropped: its queue was full", c.dropped),
        )
    } else {
        (DiagnosticStatus::OK as u8, "on the ready signal".to_string())
    };
    DiagnosticStatus {
        level,
        name: format!("{node}: consumer {} (pid {})", c.name, c.pid),
        message,
        hardware_id: node.into(),
        values,
    }
}
