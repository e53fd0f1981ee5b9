//! The ROS 2 lifecycle's state machine, as `rcl_lifecycle` defines it
//! (`rcl_lifecycle/src/default_state_machine.c`), for the managed node (`managed.rs`):
//! the states and transitions of `lifecycle_msgs` with their ids and labels, registered in
//! rcl's order (the order `get_available_states`, `get_available_transitions` and
//! `get_transition_graph` answer in), and the answers of those services. No r2r node here:
//! the tables and the messages only.
//!
//! A transition requested from a primary state goes to its intermediate state
//! (`configuring`, ...); the node's callback then answers success, failure or error, and
//! the transition of that label (`transition_success`, `transition_failure`,
//! `transition_error`) leaves the intermediate state. `errorprocessing` is left the same
//! way. Every step publishes a `TransitionEvent` (start and goal state; rcl leaves the
//! event's `transition` and `timestamp` zero, and so does the node).

use r2r::lifecycle_msgs::msg::{State as StateMsg, Transition as TransitionMsg};
use r2r::lifecycle_msgs::msg::{TransitionDescription, TransitionEvent};

/// A state of the lifecycle (`lifecycle_msgs/State`'s id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Unknown = 0,
    Unconfigured = 1,
    Inactive = 2,
    Active = 3,
    Finalized = 4,
    Configuring = 10,
    CleaningUp = 11,
    ShuttingDown = 12,
    Activating = 13,
    Deactivating = 14,
    ErrorProcessing = 15,
}

/// Every state, in the order rcl registers them.
pub(super) const STATES: [State; 11] = [
    State::Unknown,
    State::Unconfigured,
    State::Inactive,
    State::Active,
    State::Finalized,
    State::Configuring,
    State::CleaningUp,
    State::ShuttingDown,
    State::Activating,
    State::Deactivating,
    State::ErrorProcessing,
];

impl State {
    /// Its label, as rcl spells it.
    pub(super) fn label(self) -> &'static str {
        match self {
            State::Unknown => "unknown",
            State::Unconfigured => "unconfigured",
            State::Inactive => "inactive",
            State::Active => "active",
            State::Finalized => "finalized",
            State::Configuring => "configuring",
            State::CleaningUp => "cleaningup",
            State::ShuttingDown => "shuttingdown",
            State::Activating => "activating",
            State::Deactivating => "deactivating",
            State::ErrorProcessing => "errorprocessing",
        }
    }

    /// The state of an id (`STATES`).
    pub(super) fn of_id(id: u8) -> Option<State> {
        STATES.iter().copied().find(|s| *s as u8 == id)
    }

    /// As a message.
    pub(super) fn msg(self) -> StateMsg {
        StateMsg { id: self as u8, label: self.label().to_string() }
    }
}

/// A transition: id, label, start and goal state (rcl's `rcl_lifecycle_transition_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Transition {
    pub id: u8,
    pub label: &'static str,
    pub start: State,
    pub goal: State,
}

/// The labels of the transitions that leave an intermediate state.
pub(super) const SUCCESS: &str = "transition_success";
/// See [`SUCCESS`].
pub(super) const FAILURE: &str = "transition_failure";
/// See [`SUCCESS`].
pub(super) const ERROR: &str = "transition_error";

const fn t(id: u8, label: &'static str, start: State, goal: State) -> Transition {
    Transition { id, label, start, goal }
}

use State::{
    Activating as Ag, Active as Ac, CleaningUp as Cu, Configuring as Cg, Deactivating as Dg,
    ErrorProcessing as Ep, Finalized as Fi, Inactive as In, ShuttingDown as Sd, Unconfigured as Un,
};

/// Every transition, in the order rcl registers them (ids of `lifecycle_msgs/Transition`).
pub(super) const TRANSITIONS: [Transition; 25] = [
    t(1, "configure", Un, Cg),
    t(10, SUCCESS, Cg, In),
    t(11, FAILURE, Cg, Un),
    t(12, ERROR, Cg, Ep),
    t(2, "cleanup", In, Cu),
    t(20, SUCCESS, Cu, Un),
    t(21, FAILURE, Cu, In),
    t(22, ERROR, Cu, Ep),
    t(3, "activate", In, Ag),
    t(30, SUCCESS, Ag, Ac),
    t(31, FAILURE, Ag, In),
    t(32, ERROR, Ag, Ep),
    t(4, "deactivate", Ac, Dg),
    t(40, SUCCESS, Dg, In),
    t(41, FAILURE, Dg, Ac),
    t(42, ERROR, Dg, Ep),
    t(5, "shutdown", Un, Sd),
    t(6, "shutdown", In, Sd),
    t(7, "shutdown", Ac, Sd),
    t(50, SUCCESS, Sd, Fi),
    t(51, FAILURE, Sd, Fi),
    t(52, ERROR, Sd, Ep),
    t(60, SUCCESS, Ep, Un),
    t(61, FAILURE, Ep, Fi),
    t(62, ERROR, Ep, Fi),
];

impl Transition {
    /// As a `TransitionDescription`.
    pub(super) fn description(&self) -> TransitionDescription {
        TransitionDescription {
            transition: TransitionMsg { id: self.id, label: self.label.to_string() },
            start_state: self.start.msg(),
            goal_state: self.goal.msg(),
        }
    }

    /// The event rcl publishes when this transition is taken.
    pub(super) fn event(&self) -> TransitionEvent {
        TransitionEvent {
            start_state: self.start.msg(),
            goal_state: self.goal.msg(),
            ..Default::default()
        }
    }
}

/// The transitions that start at `state`, in rcl's order.
pub(super) fn valid_from(state: State) -> impl Iterator<Item = &'static Transition> {
    TRANSITIONS.iter().filter(move |t| t.start == state)
}

/// The transition from `state` with `id` (rcl_lifecycle_get_transition_by_id).
pub(super) fn by_id(state: State, id: u8) -> Option<Transition> {
    valid_from(state).find(|t| t.id == id).copied()
}

/// The first transition from `state` labelled `label` (rcl_lifecycle_get_transition_by_label).
pub(super) fn by_label(state: State, label: &str) -> Option<Transition> {
    valid_from(state).find(|t| t.label == label).copied()
}

/// `ChangeState`'s transition, as rclcpp_lifecycle reads the request: a non-empty label
/// takes precedence over the id (`ros2 service call` leaves the id 0); `Err` with the
/// refused id (logged as rclcpp does), `Ok(None)` for an unknown label (refused silently).
pub(super) fn requested(state: State, id: u8, label: &str) -> Result<Option<Transition>, u8> {
    if !label.is_empty() {
        return Ok(by_label(state, label));
    }
    by_id(state, id).map(Some).ok_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_lifecycle_msgs_ids_and_labels() {
        use r2r::lifecycle_msgs::msg::State as S;
        let ids = [
            S::PRIMARY_STATE_UNKNOWN as u32,
            S::PRIMARY_STATE_UNCONFIGURED as u32,
            S::PRIMARY_STATE_INACTIVE as u32,
            S::PRIMARY_STATE_ACTIVE as u32,
            S::PRIMARY_STATE_FINALIZED as u32,
            S::TRANSITION_STATE_CONFIGURING as u32,
            S::TRANSITION_STATE_CLEANINGUP as u32,
            S::TRANSITION_STATE_SHUTTINGDOWN as u32,
            S::TRANSITION_STATE_ACTIVATING as u32,
            S::TRANSITION_STATE_DEACTIVATING as u32,
            S::TRANSITION_STATE_ERRORPROCESSING as u32,
        ];
        for (s, id) in STATES.iter().zip(ids) {
            assert_eq!(u32::from(*s as u8), id, "{s:?}");
            assert_eq!(State::of_id(*s as u8), Some(*s));
        }
    }

    #[test]
    fn every_state_but_finalized_and_unknown_can_be_left() {
        for s in STATES {
            let n = valid_from(s).count();
            match s {
                State::Unknown | State::Finalized => assert_eq!(n, 0, "{s:?}"),
                State::Unconfigured | State::Active => assert_eq!(n, 2, "{s:?}"),
                _ => assert_eq!(n, 3, "{s:?}"),
            }
        }
        // Each intermediate state is left by success, failure and error, in that order.
        for s in [Cg, Cu, Ag, Dg, Sd, Ep] {
            let labels: Vec<&str> = valid_from(s).map(|t| t.label).collect();
            assert_eq!(labels, [SUCCESS, FAILURE, ERROR], "{s:?}");
        }
    }

    #[test]
    fn requests_as_rclcpp_reads_them() {
        // The label wins over the id.
        assert_eq!(requested(Un, 3, "configure").map(|t| t.map(|t| t.id)), Ok(Some(1)));
        assert_eq!(requested(In, 0, "shutdown").map(|t| t.map(|t| t.id)), Ok(Some(6)));
        assert_eq!(requested(Un, 0, "activate"), Ok(None));
        // activate from unconfigured: refused by id.
        assert_eq!(requested(Un, 3, ""), Err(3));
        assert_eq!(requested(Ac, 4, "").map(|t| t.map(|t| t.goal)), Ok(Some(Dg)));
    }
}
