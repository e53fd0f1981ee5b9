//! `tensor_ref` in the node: the pool of shared output blocks and its socket
//! ([`crate::handoff`]), which outputs a set gets (each only while its topic has
//! subscribers), and the pool's part of `/diagnostics`. docs/HANDOFF.md.

use super::shared::{lock, RateLimitedLog, Shared};
use crate::handoff::server::{self, Server};
use crate::handoff::{Lease, Pool};
use crate::pipeline::Pipeline;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The pool and its socket, replaced by a larger one when the output grows (run-time
/// parameters): consumers see a new `pool_id` and connect again.
pub struct Handoff {
    pool: Arc<Pool>,
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
pub enum SetOutputs {
    /// The tensors into `block` (`None`: into the message only); `fill`: the `tensor`
    /// message gets them too.
    Go { block: Option<Lease>, fill: bool },
    /// Dropped: `tensor_ref` is the only output wanted and every block is in use.
    NoBlock,
}

/// Make a pool with its socket.
fn open(
    blocks: usize,
    bytes: usize,
    lease: Duration,
    dir: &std::path::Path,
) -> crate::Result<(Arc<Pool>, Server)> {
    let pool = Pool::host(blocks, bytes, lease, dir)?;
    let server = Server::start(Arc::clone(&pool))?;
    Ok((pool, server))
}

impl Handoff {
    /// The pool for the node's output, or `None` (logged: `shared_pool_size` 0, or the
    /// pool could not be made). Host memory whatever the backend (CUDA: the tensor is
    /// downloaded into the block, as into a message).
    pub fn start(
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
        let backend = pipeline.backend().name();
        let lease = Duration::from_millis(u64::from(config.shared_lease_ms));
        let made = pipeline.output_bytes().and_then(|bytes| {
            let dir = server::socket_dir()?;
            let stale = server::remove_stale(&dir);
            if stale > 0 {
                r2r::log_info!(
                    logger,
                    "tensor_ref: removed {stale} stale socket(s) in {}",
                    dir.display()
                );
            }
            let (pool, srv) = open(blocks, bytes, lease, &dir)?;
            Ok((pool, srv, dir))
        });
        match made {
            Ok((pool, srv, dir)) => {
                r2r::log_info!(
                    logger,
                    "tensor_ref: {blocks} shared blocks of {} bytes (host memory), consumers connect to {}",
                    pool.block_size(),
                    srv.path().display()
                );
                if backend != "cpu" {
                    r2r::log_warn!(
                        logger,
                        "tensor_ref: the {backend} backend copies each tensor into host memory for \
                         it (blocks of GPU memory are not built yet: docs/HANDOFF.md)"
                    );
                }
                *lock(&shared.pool) = Some(Arc::clone(&pool));
                let log = RateLimitedLog::new(&shared.clock);
                Some(Handoff {
                    pool,
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

    /// The outputs of the next set: the block to write it into when `tensor_ref` has
    /// subscribers, and whether the `tensor` message gets the bytes too.
    pub fn outputs(&mut self, pipeline: &Pipeline, shared: &Shared) -> SetOutputs {
        let log = &mut self.log;
        let subscribed = |p: &r2r::PublisherUntyped| {
            p.get_inter_process_subscription_count().map_or(true, |n| n > 0)
        };
        if !subscribed(&self.tensor_ref) {
            return SetOutputs::Go { block: None, fill: true };
        }
        let fill = subscribed(&self.tensor);
        let logger = shared.logger.as_str();
        match pipeline.output_bytes() {
            Ok(bytes) if bytes > self.pool.block_size() => {
                match open(self.blocks, bytes, self.lease, &self.dir) {
                    Ok((pool, srv)) => {
                        r2r::log_info!(
                            logger,
                            "tensor_ref: the output grew to {bytes} bytes: new pool {} at {}",
                            pool.id(),
                            srv.path().display()
                        );
                        *lock(&shared.pool) = Some(Arc::clone(&pool));
                        self.pool = pool;
                        self._server = srv;
                    }
                    Err(e) => {
                        log.error(&shared.logger, &format!("tensor_ref: a larger pool: {e}"));
                        return SetOutputs::Go { block: None, fill: true };
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                log.error(&shared.logger, &format!("tensor_ref: {e}"));
                return SetOutputs::Go { block: None, fill: true };
            }
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
}

/// The pool's part of `/diagnostics`.
pub fn diagnostics(shared: &Shared) -> Vec<(String, String)> {
    let Some(pool) = lock(&shared.pool).clone() else {
        return vec![("Shared blocks".into(), "off".into())];
    };
    let (c, in_use, consumers) = pool.counts();
    vec![
        ("Shared blocks".into(), format!("{} x {} bytes (host)", pool.len(), pool.block_size())),
        ("Shared socket".into(), pool.socket_path().display().to_string()),
        ("Shared blocks in use".into(), in_use.to_string()),
        ("Shared consumers".into(), consumers.to_string()),
        ("Shared no free block".into(), c.no_free_block.to_string()),
        ("Shared reclaims".into(), c.reclaims.to_string()),
        ("Shared refused connections".into(), c.refused.to_string()),
        ("Shared bad clients".into(), c.bad_clients.to_string()),
    ]
}
