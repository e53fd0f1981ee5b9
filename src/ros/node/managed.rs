//! The managed node (`vision_preproc_lifecycle_node`): the same node under the ROS 2
//! lifecycle, serving `~/change_state`, `~/get_state`, `~/get_available_states`,
//! `~/get_available_transitions`, `~/get_transition_graph` and publishing
//! `~/transition_event` as `rclcpp_lifecycle` does (r2r has no lifecycle: the state
//! machine is `lifecycle.rs`, rcl's own tables), so that `ros2 lifecycle`, launch_ros'
//! `LifecycleNode` and Nav2's lifecycle manager drive it.
//!
//! What each state holds (docs/NODE.md, "The managed node"):
//! - **unconfigured**: the node, its parameters (read-only ones settable too) and the
//!   services; an idle thread spins it. Nothing opened.
//! - **configure**: the plain node's start (`super::start`): the configuration validated,
//!   the backend (CUDA context, kernels, staging, the `tensor_ref` pool and socket), the
//!   outputs, the `gst:` pipelines (started, then PAUSED), the subscriptions and threads,
//!   with frames not taken. A start-up fault fails the transition with the plain node's
//!   message; the node stays unconfigured.
//! - **activate**: frames are taken (pipelines PLAYING). **deactivate**: frames are no
//!   longer taken (neither received nor dropped), pipelines PAUSED, the sets in flight
//!   finished and published; everything stays allocated.
//! - **cleanup**: the plain node's stop without exiting: every thread joined, the backend,
//!   pool, socket and pipelines freed, the publishers destroyed; back to unconfigured.
//! - **shutdown**, from any primary state, and SIGINT/SIGTERM: as cleanup, then
//!   finalized, and the process exits 0.
//! - A failure the node cannot go on after while configured (`gpu_failure_policy: exit`)
//!   deactivates it with an error: `ErrorProcessing` frees everything as cleanup does and
//!   the node is unconfigured again (finalized, exit 1, if that fails).

use super::lifecycle::{self, State, Transition, ERROR, FAILURE, STATES, SUCCESS, TRANSITIONS};
use super::shared::{lock, Shared};
use super::{diagnostics, former, param_services, Base, Running};
use crate::error::Result;
use crate::ros::ros_err;
use futures::future::{self, BoxFuture, FutureExt};
use futures::StreamExt;
use r2r::diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus, KeyValue};
use r2r::lifecycle_msgs::msg::TransitionEvent;
use r2r::lifecycle_msgs::srv::GetState;
use r2r::lifecycle_msgs::srv::{ChangeState, GetAvailableStates, GetAvailableTransitions};
use r2r::QosProfile;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long deactivate waits for the sets in flight to be published.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the idle thread blocks in one spin.
const IDLE_SPIN: Duration = Duration::from_millis(50);

/// Entry point of `vision_preproc_lifecycle_node`.
pub fn main() -> ExitCode {
    super::exit_code(run())
}

/// The state machine: the current state (read by the services and `/diagnostics`) and
/// the transition events.
struct Machine {
    state: Arc<AtomicU8>,
    events: r2r::Publisher<TransitionEvent>,
    logger: String,
}

impl Machine {
    fn current(&self) -> State {
        State::of_id(self.state.load(Ordering::Acquire)).unwrap_or(State::Unknown)
    }

    /// Take `t`: the new state, and its event.
    fn take(&self, t: &Transition) {
        self.state.store(t.goal as u8, Ordering::Release);
        if let Err(e) = self.events.publish(&t.event()) {
            r2r::log_warn!(&self.logger, "publishing the transition event: {e}");
        }
    }

    /// Leave the intermediate state by the transition labelled `label`.
    fn leave(&self, label: &str) {
        if let Some(t) = lifecycle::by_label(self.current(), label) {
            self.take(&t);
        }
    }
}

/// A transition callback's result, as rclcpp_lifecycle's `CallbackReturn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Success,
    Failure,
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Success => SUCCESS,
            Outcome::Failure => FAILURE,
            Outcome::Error => ERROR,
        }
    }
}

/// Serve the four read-only services from `state`; `~/change_state`'s requests go to the
/// returned receiver (the main thread takes the transitions, one at a time).
fn serve(
    node: &mut r2r::Node,
    state: &Arc<AtomicU8>,
) -> r2r::Result<(BoxFuture<'static, ()>, impl futures::Stream<Item = ChangeRequest>)> {
    let fqn = node.fully_qualified_name()?;
    let srv = |s: &str| format!("{}/{s}", fqn.trim_end_matches('/'));
    let qos = QosProfile::services_default;
    let current = {
        let state = state.clone();
        move || State::of_id(state.load(Ordering::Acquire)).unwrap_or(State::Unknown)
    };
    let get_state = node.create_service::<GetState::Service>(&srv("get_state"), qos())?;
    let states =
        node.create_service::<GetAvailableStates::Service>(&srv("get_available_states"), qos())?;
    let available = node.create_service::<GetAvailableTransitions::Service>(
        &srv("get_available_transitions"),
        qos(),
    )?;
    let graph = node
        .create_service::<GetAvailableTransitions::Service>(&srv("get_transition_graph"), qos())?;
    let changes = node.create_service::<ChangeState::Service>(&srv("change_state"), qos())?;
    let now = current.clone();
    let futures = vec![
        answer(get_state, move |_| GetState::Response { current_state: now().msg() }),
        answer(states, |_| GetAvailableStates::Response {
            available_states: STATES.iter().map(|s| s.msg()).collect(),
        }),
        answer(available, move |_| GetAvailableTransitions::Response {
            available_transitions: lifecycle::valid_from(current())
                .map(Transition::description)
                .collect(),
        }),
        answer(graph, |_| GetAvailableTransitions::Response {
            available_transitions: TRANSITIONS.iter().map(Transition::description).collect(),
        }),
    ];
    Ok((future::join_all(futures).map(|_| ()).boxed(), changes))
}

/// A `~/change_state` request.
type ChangeRequest = r2r::ServiceRequest<ChangeState::Service>;

/// Answer each request of `requests` with `f`.
fn answer<S>(
    requests: impl futures::Stream<Item = r2r::ServiceRequest<S>> + Send + 'static,
    f: impl Fn(&S::Request) -> S::Response + Send + 'static,
) -> BoxFuture<'static, ()>
where
    S: r2r::WrappedServiceTypeSupport + 'static,
    S::Request: Send,
{
    requests
        .for_each(move |req| {
            let response = f(&req.message);
            let _ = req.respond(response);
            future::ready(())
        })
        .boxed()
}

/// The unconfigured node: an idle thread spins it (services, `/clock`), a task publishes
/// its `/diagnostics` status.
struct Idle {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<r2r::Node>,
    status: tokio::task::JoinHandle<()>,
}

impl Idle {
    fn start(m: &Managed, mut node: r2r::Node) -> Result<Idle> {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, clock, logger) = (stop.clone(), m.base.clock.clone(), m.base.logger.clone());
        let thread = std::thread::Builder::new()
            .name("spin".into())
            .spawn(move || {
                let mut sim_time = false;
                while !flag.load(Ordering::Acquire) {
                    if let Err(e) = clock.apply(&mut node, &mut sim_time) {
                        r2r::log_error!(&logger, "use_sim_time: {e}");
                        sim_time = clock.sim_time();
                    }
                    node.spin_once(IDLE_SPIN);
                }
                node
            })
            .map_err(|e| crate::Error::io("starting the spin thread", e))?;
        let status = m.base.rt.spawn(unconfigured_status(
            m.diagnostics[0].clone(),
            m.machine.state.clone(),
            m.failure.clone(),
            (m.base.status_name.clone(), m.base.clock.clone()),
        ));
        Ok(Idle { stop, thread, status })
    }

    /// Stop spinning: the node back (`None` if the thread panicked).
    fn stop(self, rt: &tokio::runtime::Runtime) -> Option<r2r::Node> {
        self.status.abort();
        let _ = rt.block_on(self.status);
        self.stop.store(true, Ordering::Release);
        self.thread.join().ok()
    }
}

/// The status of the unconfigured node, once a second: OK "unconfigured", or ERROR with
/// the reason the last configure failed or the error that sent it through ErrorProcessing.
async fn unconfigured_status(
    publisher: r2r::Publisher<DiagnosticArray>,
    state: Arc<AtomicU8>,
    failure: Arc<Mutex<Option<String>>>,
    (name, clock): (String, super::NodeClock),
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let label = State::of_id(state.load(Ordering::Acquire)).unwrap_or(State::Unknown).label();
        let (level, message) = match lock(&failure).as_ref() {
            Some(reason) => (DiagnosticStatus::ERROR as u8, format!("{label}: {reason}")),
            None => (DiagnosticStatus::OK as u8, label.to_string()),
        };
        let status = DiagnosticStatus {
            level,
            name: name.clone(),
            message,
            hardware_id: String::new(),
            values: vec![KeyValue { key: "Lifecycle state".into(), value: label.into() }],
        };
        let mut msg = DiagnosticArray { status: vec![status], ..Default::default() };
        msg.header.stamp = clock.stamp();
        let _ = publisher.publish(&msg);
    }
}

/// Where the node is.
enum Held {
    /// Unconfigured.
    Idle(Idle),
    /// Configured (inactive or active): the node's threads, and the task of their
    /// `/diagnostics` status.
    Configured(Box<Running>, tokio::task::JoinHandle<()>),
    /// Lost (a thread panicked): only finalized is left.
    Gone,
}

/// The managed node.
struct Managed {
    base: Base,
    machine: Machine,
    diagnostics: super::DiagnosticsPublishers,
    held: Held,
    /// Why the last configure failed, or the failure that sent the node through
    /// ErrorProcessing (`/diagnostics` says it while unconfigured).
    failure: Arc<Mutex<Option<String>>>,
}

/// What the main loop waits for.
enum Wake {
    Signal,
    Change(ChangeRequest),
    Fatal,
}

fn run() -> Result<Option<String>> {
    let (mut base, mut node) = super::create_node()?;
    let state = Arc::new(AtomicU8::new(State::Unconfigured as u8));
    base.lifecycle = Some(state.clone());
    lock(&base.params).unconfigured = true;
    let param_server = param_services::start(
        &mut node,
        base.params.clone(),
        base.clock.clone(),
        base.logger.clone(),
    )
    .map_err(|e| ros_err("creating the parameter services", e))?;
    let diagnostics = super::diagnostics_publisher(&mut node)?;
    let events = node
        .create_publisher::<TransitionEvent>("~/transition_event", QosProfile::default())
        .map_err(|e| ros_err("creating the transition event publisher", e))?;
    let (services, mut changes) =
        serve(&mut node, &state).map_err(|e| ros_err("creating the lifecycle services", e))?;
    let tasks = [base.rt.spawn(param_server), base.rt.spawn(services)];
    let machine = Machine { state, events, logger: base.logger.clone() };
    let failure = Arc::default();
    let mut m = Managed { base, machine, diagnostics, held: Held::Gone, failure };
    m.held = Held::Idle(Idle::start(&m, node)?);
    r2r::log_info!(&m.base.logger, "managed node: unconfigured (configure, then activate)");
    loop {
        match m.wait(&mut changes) {
            Wake::Signal => {
                r2r::log_info!(&m.base.logger, "shutting down");
                if let Some(t) = lifecycle::by_label(m.machine.current(), "shutdown") {
                    m.transition(&t);
                }
            }
            Wake::Change(req) => m.change(req),
            Wake::Fatal => m.fail_active(),
        }
        if matches!(m.machine.current(), State::Finalized) {
            break;
        }
    }
    for t in tasks {
        t.abort();
    }
    m.finish()
}

impl Managed {
    /// Wait for a signal, a `~/change_state` request or a fatal error of the running node.
    fn wait(&mut self, changes: &mut (impl futures::Stream<Item = ChangeRequest> + Unpin)) -> Wake {
        let fatal = match &self.held {
            Held::Configured(running, _) => Some(running.shared.clone()),
            _ => None,
        };
        let signals = &mut self.base.signals;
        self.base.rt.block_on(async {
            let fatal = async {
                match &fatal {
                    Some(shared) if lock(&shared.fatal).is_some() => {}
                    Some(shared) => shared.fatal_signal.notified().await,
                    None => future::pending().await,
                }
            };
            tokio::select! {
                _ = signals.recv() => Wake::Signal,
                req = changes.next() => req.map_or(Wake::Signal, Wake::Change),
                _ = fatal => Wake::Fatal,
            }
        })
    }

    /// A `~/change_state` request, answered as rclcpp_lifecycle does: success only when
    /// the transition's callback succeeded.
    fn change(&mut self, req: ChangeRequest) {
        let current = self.machine.current();
        let (id, label) = (req.message.transition.id, req.message.transition.label.clone());
        let success = match lifecycle::requested(current, id, &label) {
            Ok(Some(t)) => self.transition(&t) == Outcome::Success,
            Ok(None) => false,
            Err(id) => {
                r2r::log_error!(
                    &self.base.logger,
                    "Unable to start transition {id} from current state {}: Transition is not \
                     registered.",
                    current.label()
                );
                false
            }
        };
        let _ = req.respond(ChangeState::Response { success });
    }

    /// Take `t` (from a primary state) and run its callback, then leave the intermediate
    /// state by the callback's outcome; an error goes through ErrorProcessing.
    fn transition(&mut self, t: &Transition) -> Outcome {
        self.machine.take(t);
        let outcome = match t.goal {
            State::Configuring => self.on_configure(),
            State::Activating => self.on_activate(true),
            State::Deactivating => self.on_activate(false),
            State::CleaningUp | State::ShuttingDown => self.on_cleanup(),
            _ => Outcome::Error,
        };
        self.machine.leave(outcome.label());
        if outcome == Outcome::Error {
            self.error_processing();
        }
        outcome
    }

    /// ErrorProcessing: free everything (as cleanup); unconfigured on success.
    fn error_processing(&mut self) {
        r2r::log_warn!(&self.base.logger, "Error occurred while doing error handling.");
        let outcome = self.on_cleanup();
        self.machine.leave(outcome.label());
    }

    /// A failure while configured that the node cannot go on after: the node deactivates
    /// itself (or cleans up, when inactive), the callback reports the error, and
    /// ErrorProcessing frees everything.
    fn fail_active(&mut self) {
        let reason = match &self.held {
            Held::Configured(running, _) => lock(&running.shared.fatal).clone(),
            _ => None,
        };
        *lock(&self.failure) =
            reason.map(|r| format!("error while {}: {r}", self.machine.current().label()));
        let current = self.machine.current();
        let Some(t) = lifecycle::by_label(current, "deactivate")
            .or_else(|| lifecycle::by_label(current, "cleanup"))
        else {
            return;
        };
        self.machine.take(&t);
        self.machine.leave(ERROR);
        self.error_processing();
    }

    fn on_configure(&mut self) -> Outcome {
        let Held::Idle(idle) = std::mem::replace(&mut self.held, Held::Gone) else {
            return Outcome::Error;
        };
        let Some(node) = idle.stop(&self.base.rt) else { return Outcome::Error };
        {
            let mut params = lock(&self.base.params);
            self.base.config = params.config.clone();
            params.unconfigured = false;
        }
        match super::start(&self.base, node, self.diagnostics.clone(), false) {
            Ok(running) => {
                let task = self.base.rt.spawn(diagnostics::publish_diagnostics(
                    self.diagnostics.clone(),
                    running.shared.clone(),
                    self.base.status_name.clone(),
                ));
                self.held = Held::Configured(Box::new(running), task);
                *lock(&self.failure) = None;
                Outcome::Success
            }
            Err(failed) => {
                let (e, node) = *failed;
                r2r::log_error!(&self.base.logger, "configure failed: {e}");
                *lock(&self.failure) = Some(format!("configure failed: {e}"));
                self.unconfigured(node)
            }
        }
    }

    /// Back to unconfigured with `node` (idle): `Failure` (the transition's), or `Error`
    /// when the node is lost.
    fn unconfigured(&mut self, node: Option<r2r::Node>) -> Outcome {
        lock(&self.base.params).unconfigured = true;
        match node.map(|n| Idle::start(self, n)) {
            Some(Ok(idle)) => {
                self.held = Held::Idle(idle);
                Outcome::Failure
            }
            Some(Err(e)) => {
                r2r::log_error!(&self.base.logger, "{e}");
                Outcome::Error
            }
            None => Outcome::Error,
        }
    }

    /// Activate (`on`) or deactivate: frames taken or not; deactivating, the frames the
    /// former holds are counted dropped and the sets in flight published first.
    fn on_activate(&mut self, on: bool) -> Outcome {
        let Held::Configured(running, _) = &self.held else { return Outcome::Error };
        let shared = &running.shared;
        {
            let mut f = lock(&running.former);
            shared.active.store(on, Ordering::Release);
            if !on {
                f.finish(shared);
                *f = former::Former::new(&self.base.config);
            }
        }
        if !on && !drained(shared) {
            r2r::log_warn!(
                &self.base.logger,
                "deactivate: the sets in flight were not all published within {} s",
                DRAIN_TIMEOUT.as_secs()
            );
        }
        Outcome::Success
    }

    /// Cleanup (and shutdown, ErrorProcessing): stop every thread, free what configure
    /// opened, destroy its publishers; the node idles, unconfigured.
    fn on_cleanup(&mut self) -> Outcome {
        match std::mem::replace(&mut self.held, Held::Gone) {
            Held::Configured(running, task) => {
                task.abort();
                let _ = self.base.rt.block_on(task);
                match super::stop_threads(*running) {
                    Ok((mut node, made, shared)) => {
                        super::log_stopped(&self.base.logger, &shared);
                        made.destroy(&mut node);
                        drop(shared);
                        self.idle(node)
                    }
                    Err(e) => {
                        r2r::log_error!(&self.base.logger, "cleanup: {e}");
                        Outcome::Error
                    }
                }
            }
            Held::Idle(idle) => {
                self.held = Held::Idle(idle);
                Outcome::Success
            }
            Held::Gone => Outcome::Failure,
        }
    }

    /// Idle with `node`, unconfigured.
    fn idle(&mut self, node: r2r::Node) -> Outcome {
        lock(&self.base.params).unconfigured = true;
        match Idle::start(self, node) {
            Ok(idle) => {
                self.held = Held::Idle(idle);
                Outcome::Success
            }
            Err(e) => {
                r2r::log_error!(&self.base.logger, "{e}");
                Outcome::Error
            }
        }
    }

    /// Finalized: stop the idle thread and say how the process exits (1 when
    /// ErrorProcessing failed).
    fn finish(mut self) -> Result<Option<String>> {
        let failed = !matches!(self.held, Held::Idle(_));
        if let Held::Idle(idle) = std::mem::replace(&mut self.held, Held::Gone) {
            let _node = idle.stop(&self.base.rt);
            super::linger();
        }
        let reason = lock(&self.failure).clone();
        Ok(failed.then(|| reason.unwrap_or_else(|| "finalized after an error".into())))
    }
}

/// True once every frame taken is published or counted (the sets in flight finished),
/// false after [`DRAIN_TIMEOUT`].
fn drained(shared: &Shared) -> bool {
    let until = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let c = shared.stats.counts();
        if c.received == c.published + c.dropped + c.rejected + c.failed {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
