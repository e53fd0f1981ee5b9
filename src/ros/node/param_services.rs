//! The six parameter services (`~/get_parameters`, `~/set_parameters`,
//! `~/set_parameters_atomically`, `~/list_parameters`, `~/describe_parameters`,
//! `~/get_parameter_types`) and `/parameter_events`, served by the node itself.
//!
//! r2r 0.9.7 has a handler for these services, but its `describe_parameters` answers only
//! name, type and description (no ranges, no `read_only`), it publishes nothing on
//! `/parameter_events`, and a second server for the same service names would answer next
//! to it; so the node does not use it. What is answered follows rclcpp's
//! `ParameterService`: unknown names make `get_parameters`, `get_parameter_types` and
//! `describe_parameters` answer an empty list; every accepted change is announced on
//! `/parameter_events` (reliable, depth 1000) with the node's clock as stamp; start-up
//! announces every parameter as new, one event each, as `declare_parameter` does.

use super::clock::NodeClock;
use super::params::{
    all_names, descriptor, show, spec_of, value_from_msg, value_to_msg, Change, NodeParams,
    USE_SIM_TIME,
};
use futures::future::{self, BoxFuture, FutureExt};
use futures::StreamExt;
use r2r::rcl_interfaces::msg::{Parameter as ParamMsg, ParameterEvent, SetParametersResult};
use r2r::rcl_interfaces::srv::{
    DescribeParameters, GetParameterTypes, GetParameters, ListParameters, SetParameters,
    SetParametersAtomically,
};
use r2r::QosProfile;
use std::sync::{Arc, Mutex, MutexGuard};

/// What the services share.
#[derive(Clone)]
struct Server {
    params: Arc<Mutex<NodeParams>>,
    events: r2r::Publisher<ParameterEvent>,
    /// Fully qualified node name (`ParameterEvent.node`, the services' prefix).
    node: String,
    clock: NodeClock,
    logger: String,
}

impl Server {
    fn params(&self) -> MutexGuard<'_, NodeParams> {
        self.params.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, event: ParameterEvent) {
        if let Err(e) = self.events.publish(&event) {
            r2r::log_warn!(&self.logger, "publishing /parameter_events: {e}");
        }
    }

    /// Announce accepted changes, log them, and switch the clock when `use_sim_time` moved.
    fn changed(&self, changes: &[Change]) {
        if changes.is_empty() {
            return;
        }
        // The managed node while unconfigured runs nothing: every change waits for configure.
        let applies = if self.params().unconfigured {
            "at the next configure"
        } else {
            "from the next frame"
        };
        let mut event = ParameterEvent {
            stamp: self.clock.stamp(),
            node: self.node.clone(),
            ..Default::default()
        };
        for (name, value) in changes {
            if name == USE_SIM_TIME.name {
                let on = matches!(value, r2r::ParameterValue::Bool(true));
                self.clock.request_sim_time(on);
                r2r::log_info!(
                    &self.logger,
                    "parameter use_sim_time set to {on}: the node's clock is now {}",
                    if on { "/clock" } else { "the system time" }
                );
            } else {
                r2r::log_info!(
                    &self.logger,
                    "parameter {name} set to {}; applies {applies}",
                    show(value)
                );
            }
            event
                .changed_parameters
                .push(ParamMsg { name: name.clone(), value: value_to_msg(value) });
        }
        self.publish(event);
    }

    fn set(&self, req: &SetParameters::Request) -> SetParameters::Response {
        let changes: Vec<Change> =
            req.parameters.iter().map(|p| (p.name.clone(), value_from_msg(&p.value))).collect();
        let results = self.params().set(&changes);
        let mut accepted = Vec::new();
        let mut response = SetParameters::Response::default();
        for ((name, _), result) in changes.iter().zip(results) {
            response.results.push(match result {
                Ok(value) => {
                    accepted.push((name.clone(), value));
                    SetParametersResult { successful: true, reason: String::new() }
                }
                Err(reason) => {
                    r2r::log_warn!(&self.logger, "set parameter {name} refused: {reason}");
                    SetParametersResult { successful: false, reason }
                }
            });
        }
        self.changed(&accepted);
        response
    }

    fn set_atomically(
        &self,
        req: &SetParametersAtomically::Request,
    ) -> SetParametersAtomically::Response {
        let changes: Vec<Change> =
            req.parameters.iter().map(|p| (p.name.clone(), value_from_msg(&p.value))).collect();
        let result = self.params().set_atomically(&changes);
        let result = match result {
            Ok(values) => {
                let accepted: Vec<Change> =
                    changes.iter().map(|c| c.0.clone()).zip(values).collect();
                self.changed(&accepted);
                SetParametersResult { successful: true, reason: String::new() }
            }
            Err(reason) => {
                r2r::log_warn!(&self.logger, "set parameters atomically refused: {reason}");
                SetParametersResult { successful: false, reason }
            }
        };
        SetParametersAtomically::Response { result }
    }

    fn get(&self, req: &GetParameters::Request) -> GetParameters::Response {
        let p = self.params();
        let values: Option<Vec<_>> =
            req.names.iter().map(|n| p.get(n).map(|v| value_to_msg(&v))).collect();
        GetParameters::Response { values: values.unwrap_or_default() }
    }

    /// Publish every parameter as new (start-up), one event each as rclcpp's
    /// `declare_parameter` does.
    fn announce_declared(&self) {
        let p = self.params();
        for name in all_names() {
            if let Some(value) = p.get(name) {
                r2r::log_debug!(&self.logger, "parameter {name} = {}", show(&value));
                self.publish(ParameterEvent {
                    stamp: self.clock.stamp(),
                    node: self.node.clone(),
                    new_parameters: vec![ParamMsg {
                        name: name.to_string(),
                        value: value_to_msg(&value),
                    }],
                    ..Default::default()
                });
            }
        }
    }
}

fn describe(req: &DescribeParameters::Request) -> DescribeParameters::Response {
    let descriptors: Option<Vec<_>> =
        req.names.iter().map(|n| spec_of(n).map(descriptor)).collect();
    DescribeParameters::Response { descriptors: descriptors.unwrap_or_default() }
}

fn types(req: &GetParameterTypes::Request) -> GetParameterTypes::Response {
    let types: Option<Vec<u8>> =
        req.names.iter().map(|n| spec_of(n).map(|s| s.kind.ros_type())).collect();
    GetParameterTypes::Response { types: types.unwrap_or_default() }
}

/// One service: answer each request with `answer`.
fn serve<S>(
    node: &mut r2r::Node,
    name: String,
    logger: String,
    answer: impl Fn(&S::Request) -> S::Response + Send + 'static,
) -> r2r::Result<BoxFuture<'static, ()>>
where
    S: r2r::WrappedServiceTypeSupport + 'static,
    S::Request: Send,
{
    let requests = node.create_service::<S>(&name, QosProfile::parameters())?;
    Ok(requests
        .for_each(move |req| {
            let response = answer(&req.message);
            if let Err(e) = req.respond(response) {
                r2r::log_warn!(&logger, "answering {name}: {e}");
            }
            future::ready(())
        })
        .boxed())
}

/// Create the services and the `/parameter_events` publisher on `node`, announce the
/// parameters, and return the future that serves the requests (spawn it).
pub(super) fn start(
    node: &mut r2r::Node,
    params: Arc<Mutex<NodeParams>>,
    clock: NodeClock,
    logger: String,
) -> r2r::Result<impl std::future::Future<Output = ()> + Send> {
    let fqn = node.fully_qualified_name()?;
    let events = node
        .create_publisher::<ParameterEvent>("/parameter_events", QosProfile::parameter_events())?;
    let server = Server { params, events, node: fqn.clone(), clock, logger: logger.clone() };
    let srv = |s: &str| format!("{}/{s}", fqn.trim_end_matches('/'));
    let (a, b, c) = (server.clone(), server.clone(), server.clone());
    let futures = vec![
        serve::<SetParameters::Service>(node, srv("set_parameters"), logger.clone(), move |r| {
            a.set(r)
        })?,
        serve::<SetParametersAtomically::Service>(
            node,
            srv("set_parameters_atomically"),
            logger.clone(),
            move |r| b.set_atomically(r),
        )?,
        serve::<GetParameters::Service>(node, srv("get_parameters"), logger.clone(), move |r| {
            c.get(r)
        })?,
        serve::<ListParameters::Service>(node, srv("list_parameters"), logger.clone(), |r| {
            ListParameters::Response { result: NodeParams::list(&r.prefixes, r.depth) }
        })?,
        serve::<DescribeParameters::Service>(
            node,
            srv("describe_parameters"),
            logger.clone(),
            describe,
        )?,
        serve::<GetParameterTypes::Service>(node, srv("get_parameter_types"), logger, types)?,
    ];
    server.announce_declared();
    Ok(future::join_all(futures).map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_give_empty_answers_as_rclcpp() {
        let d = describe(&DescribeParameters::Request {
            names: vec!["conv.size".into(), "backend".into()],
        });
        assert_eq!(d.descriptors.len(), 2);
        assert!(d.descriptors[1].read_only);
        let d = describe(&DescribeParameters::Request {
            names: vec!["conv.size".into(), "nope".into()],
        });
        assert!(d.descriptors.is_empty());
        let t =
            types(&GetParameterTypes::Request { names: vec!["use_sim_time".into(), "roi".into()] });
        assert_eq!(t.types, [1, 7]); // PARAMETER_BOOL, PARAMETER_INTEGER_ARRAY
    }
}
